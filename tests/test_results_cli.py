"""`rudder collect | query | report | export`: output and exit codes."""
from __future__ import annotations

import argparse
import io
import json

import pandas as pd
import pytest

from rudder.results.cli import register
from synthetic_runs import write_synthetic_run  # tests/synthetic_runs.py


def cli(argv: list[str]) -> int:
    """The results subcommands alone (the full `rudder` parser loads every area)."""
    parser = argparse.ArgumentParser(prog="rudder")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "runs"
    for m in (2, 4):
        for pol in ("none", "static", "agent"):
            write_synthetic_run(root, f"{pol}-{m}", machines=m, policy=pol, epochs=2, steps=6,
                                window=3, study="s")
    write_synthetic_run(root, "dead", policy="fixed", status="failed", reason="OOM",
                        epochs=2, epochs_done=1, steps=6)
    return root, tmp_path / "r.duckdb"


def test_collect_then_query(study, capsys):
    root, db = study
    assert cli(["collect", str(root), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "collected 7 runs, 0 unchanged" in out and "6 complete" in out and "1 failed" in out
    assert cli(["collect", str(root), "--db", str(db)]) == 0
    assert "collected 0 runs, 7 unchanged" in capsys.readouterr().out

    assert cli(["query", "SELECT count(*) AS n FROM runs", "--db", str(db), "--csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "7"]

    assert cli(["query", "--named", "speedup", "--db", str(db), "--csv"]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert {"dataset", "machines", "policy", "ratio_to_none", "speedup"} <= set(df.columns)
    assert len(df) == 6

    assert cli(["query", "--named", "failed_runs", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "dead" in out and "OOM" in out  # rich table

    assert cli(["query", "--named", "speedup", "--sql"]) == 0
    assert "ratio_to_none" in capsys.readouterr().out


def test_collect_with_study_tags_untagged_runs(study, capsys):
    root, db = study
    assert cli(["collect", str(root), "--db", str(db), "--study", "s"]) == 0
    capsys.readouterr()
    assert cli(["query", "SELECT study, count(*) AS n FROM runs GROUP BY study",
                "--db", str(db), "--csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["study,n", "s,7"]


def test_query_errors_exit_2(study, capsys):
    root, db = study
    assert cli(["query", "SELECT 1", "--db", str(db)]) == 2
    assert "no results database" in capsys.readouterr().err

    assert cli(["collect", str(root), "--db", str(db)]) == 0
    capsys.readouterr()
    assert cli(["query", "SELEC nonsense", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "SQL failed" in err and "syntax error" in err

    assert cli(["query", "SELECT * FROM no_such_table", "--db", str(db)]) == 2
    assert "no_such_table" in capsys.readouterr().err

    assert cli(["query", "DELETE FROM runs", "--db", str(db)]) == 2  # read-only
    assert "read-only" in capsys.readouterr().err

    assert cli(["query", "--named", "sppedup", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "unknown named query 'sppedup'" in err and "speedup" in err and "pass_at_1" in err

    assert cli(["query", "--db", str(db)]) == 2
    assert cli(["query", "SELECT 1", "--named", "speedup", "--db", str(db)]) == 2
    capsys.readouterr()

    # a study with no run here is named with the studies there are (not an empty table)
    assert cli(["query", "--named", "speedup", "--study", "ss", "--db", str(db)]) == 2
    assert f"no runs of study 'ss' in {db}; its studies: s" in capsys.readouterr().err
    assert cli(["query", "--named", "speedup", "--study", "s", "--db", str(db), "--csv"]) == 0
    assert len(pd.read_csv(io.StringIO(capsys.readouterr().out))) == 6

    # a row count under 1 is argparse's usage error naming it (it printed an empty table)
    with pytest.raises(SystemExit) as exit_:
        cli(["query", "SELECT 1", "--db", str(db), "--max-rows", "-1"])
    assert exit_.value.code == 2 and "--max-rows: -1: must be above 0" in capsys.readouterr().err


def test_report_of_a_study_not_collected_is_an_error(study, tmp_path, capsys):
    root, db = study
    assert cli(["collect", str(root), "--db", str(db)]) == 0
    assert cli(["report", "--db", str(db), "--study", "nope", "--out", str(tmp_path / "rep")]) == 2
    assert "no runs of study 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()
    assert cli(["report", "--db", str(db), "--study", "s", "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").is_file()


def test_query_list(capsys):
    assert cli(["query", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("speedup", "remote_rows", "hit_rate", "pass_at_1", "staleness",
                 "failed_runs"):
        assert name in out


def test_collect_errors(tmp_path, study, capsys):
    root, db = study
    assert cli(["collect", str(tmp_path / "nope"), "--db", str(db)]) == 2
    assert "no such runs directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(["collect", str(empty), "--db", str(db)]) == 2
    assert "no run directories" in capsys.readouterr().err
    (root / "broken").mkdir()
    (root / "broken" / "run.json").write_text("{")
    assert cli(["collect", str(root), "--db", str(db)]) == 1  # the others are collected
    captured = capsys.readouterr()
    assert "collected 7 runs" in captured.out and "broken" in captured.err


def test_report_and_export(study, tmp_path, capsys):
    root, db = study
    assert cli(["report", "--db", str(db), "--out", str(tmp_path / "rep")]) == 2
    assert "no results database" in capsys.readouterr().err
    assert cli(["collect", str(root), "--db", str(db)]) == 0
    assert cli(["report", "--db", str(db), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").exists()
    assert (tmp_path / "rep" / "decisions.png").exists()
    assert cli(["export", "--parquet", str(tmp_path / "pq"), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "runs.parquet  (7 rows)" in out
    assert pd.read_parquet(tmp_path / "pq" / "runs.parquet").shape[0] == 7


def test_registered_in_the_rudder_console_script(study, capsys):
    from rudder.cli import main

    root, db = study
    assert main(["collect", str(root), "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["query", "--named", "hit_rate", "--db", str(db), "--csv"]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert set(df.policy) == {"none", "static", "agent"}
    # recomputed from the run directories: per run buffer hits / remote rows, averaged per policy
    per_run: dict[str, list[float]] = {}
    for d in root.iterdir():
        meta = json.loads((d / "run.json").read_text())
        if meta["status"] != "complete":
            continue
        eps = [json.loads(x) for f in d.glob("epochs-r*.jsonl") for x in f.read_text().splitlines()]
        pct = 100.0 * sum(e["hits"] for e in eps) / sum(e["remote_rows"] for e in eps)
        per_run.setdefault(meta["config"]["prefetch"]["policy"], []).append(pct)
    got = dict(zip(df.policy, df.hit_pct))
    assert got == pytest.approx({p: sum(v) / len(v) for p, v in per_run.items()})
    assert got["none"] == 0 and got["static"] > 0


def test_csv_into_a_closed_pipe_is_quiet(study):
    """`rudder query --csv | head -1`: the reader leaves early; no BrokenPipeError traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root, db = study
    assert cli(["collect", str(root), "--db", str(db)]) == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    p = subprocess.run(f"{sys.executable} -m rudder.cli query 'SELECT range AS n FROM range(300000)' --db {db} --csv | head -1",
                       shell=True, capture_output=True, text=True, env=env, timeout=300)
    assert p.stdout == "n\n" and "Error" not in p.stderr, p.stderr
