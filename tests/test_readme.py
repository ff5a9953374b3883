"""The README cannot drift from the code: every command line it shows parses with today's
parsers, the results commands and both SQL examples run on a collected study, the Makefile has
the targets it names, and the default it states is the config's. (The run / sim / oracle /
agent eval lines run for real in tests/test_end_to_end.py and tests/test_agent_eval.py.)"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rudder.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def command_lines() -> list[list[str]]:
    """The README's shell lines: comments dropped, `[--opt X]` optional parts kept (as given)."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():  # continuation lines joined
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            out.append(shlex.split(line.replace("[", "").replace("]", "")))
    return out


def fill(argv: list[str], run_dir: str = "runs/x") -> list[str]:
    return [a.replace("runs/<run-id>", run_dir).replace("<UUID>", "0" * 8) for a in argv]


RUDDER = [a for a in command_lines() if Path(a[0]).name == "rudder"]
# full commands quoted in the prose (`.venv/bin/rudder ...`)
INLINE = [shlex.split(c) for c in re.findall(r"`(\.venv/bin/rudder [^`]+)`", README)]


def test_the_readme_shows_commands():
    names = {a[1] for a in RUDDER}
    assert {"doctor", "data", "run", "oracle", "sim", "agent", "collect", "query", "report", "export"} <= names


@pytest.mark.parametrize("argv", RUDDER + INLINE, ids=[" ".join(a[1:3]) for a in RUDDER + INLINE])
def test_every_rudder_line_parses(argv):
    args = build_parser().parse_args(fill(argv[1:]))  # argparse exits 2 on a name that is gone
    assert getattr(args, "func", None) is not None


def test_make_targets_and_study_lines_exist():
    make = (REPO / "Makefile").read_text()
    for a in command_lines():
        if a[0] == "make":
            assert re.search(rf"^{re.escape(a[1])}:", make, flags=re.M), a
    study = [a for a in command_lines() if a[-1:] == ["--dry-run"] or "scaling_study.py" in " ".join(a)]
    assert study
    sys.path.insert(0, str(REPO / "workflows"))
    try:
        import scaling_study
    finally:
        sys.path.pop(0)
    for a in command_lines():
        if len(a) > 1 and a[1] == "workflows/scaling_study.py":
            scaling_study.build_parser().parse_args(fill(a[2:]))


def test_default_agent_model_is_the_config_s():
    from rudder.config import RunConfig

    name = RunConfig().agent.model.name
    assert f"`agent.model.name` defaults to `{name}`" in README


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from synthetic_runs import write_synthetic_run  # tests/synthetic_runs.py

    root = tmp_path_factory.mktemp("study")
    runs = root / "runs"
    for m in (2, 4):
        for pol in ("none", "static", "agent"):
            write_synthetic_run(runs, f"{pol}-{m}", machines=m, policy=pol, epochs=2, steps=6, window=3,
                                simulated=False)
    write_synthetic_run(runs, "my-run", machines=2, policy="agent", epochs=2, steps=6, window=3,
                        simulated=False)
    return root


def sh(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rudder.cli", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_results_commands_run_as_written(study):
    """The results block, line by line, in a folder holding runs/ (as after `make study`)."""
    results = [a for a in RUDDER if a[1] in ("collect", "query", "report", "export")]
    assert len(results) == 6
    for argv in results:
        argv = [a for a in argv[1:] if a not in ("NAME", "--study", "--force")]  # optional parts
        p = sh(argv, study)
        assert p.returncode == 0, (argv, p.stdout, p.stderr)
        if argv[0] == "query" and "--named" in argv:
            assert "speedup" in p.stdout or "ratio_to_none" in p.stdout
    assert (study / "report" / "report.md").is_file()
    assert (study / "export" / "runs.parquet").is_file()


def test_sql_examples_run_and_return_rows(study):
    import duckdb

    db = study / "results.duckdb"
    assert sh(["collect", "runs/", "--db", "results.duckdb"], study).returncode == 0
    statements = [s.strip() for b in blocks("sql") for s in b.split(";") if s.strip()]
    assert len(statements) == 2
    con = duckdb.connect(str(db), read_only=True)
    try:
        for sql in statements:
            df = con.execute(sql).df()
            assert len(df) > 0, sql
    finally:
        con.close()
