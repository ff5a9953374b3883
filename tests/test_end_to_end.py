"""End to end through the console script, as the README runs it: `rudder run` on
configs/baseline.yaml (shortened with --set) and its trace through `rudder sim` and `rudder
oracle`; `collect` with admit=any, a classifier trained on what it collected, and
`classifier:<name>` in a real trainer; the agent steering a real run through the per-machine
HTTP service. One real run per configuration (module fixtures), 2 emulated machines."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rudder.records import read_jsonl

pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="emulated machines need root (network namespaces)"),
]

REPO = Path(__file__).resolve().parent.parent


def rudder(*argv: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rudder.cli", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def run(runs: Path, *sets: str, check: bool = False, env: dict | None = None) -> tuple[Path, str]:
    """`rudder run --config configs/baseline.yaml --set ...`; returns (run dir, stdout)."""
    argv = ["run", "--config", "configs/baseline.yaml", "--set", f"runs_dir={runs}"]
    for s in sets:
        argv += ["--set", s]
    p = rudder(*argv, *(["--check"] if check else []), env=env)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("complete: "))
    return Path(line.split(": ", 1)[1]), p.stdout


def per_rank(run_dir: Path, stem: str) -> dict[int, list[dict]]:
    return {int(p.stem.rsplit("-r", 1)[1]): read_jsonl(p) for p in run_dir.glob(f"{stem}-r*.jsonl")}


# ---- the README's run, replayed ----------------------------------------------------------------
def readme_line(sub: str) -> list[str]:
    """The README's first `rudder <sub> ...` line that runs something (everyday use; a
    `--dry-run` line only checks), as argv after `rudder`."""
    from test_readme import RUDDER

    return [a[1:] for a in RUDDER if a[1] == sub and "--dry-run" not in a][0]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The README's run line, shortened to one epoch and pointed at a temporary runs dir."""
    runs = tmp_path_factory.mktemp("runs")
    argv = readme_line("run") + ["--set", "train.epochs=1", "--set", f"runs_dir={runs}"]
    assert argv[:2] == ["run", "configs/baseline.yaml"] and "--check" in argv  # the config as an argument
    p = rudder(*argv)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("complete: "))
    return Path(line.split(": ", 1)[1]), p.stdout


def test_baseline_run_completes_checked_and_summarised(baseline):
    run_dir, out = baseline
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "complete" and meta["config"]["prefetch"]["policy"] == "lookahead"
    assert meta["config"]["train"]["check_features"] is True  # --check, as the run did it
    assert meta["feature_check"] == {"ranks_checked": 2, "mismatched_rows": 0}
    mbs = [m for recs in per_rank(run_dir, "minibatches").values() for m in recs]
    remote, fetched = sum(m["remote_rows"] for m in mbs), sum(m["fetched_rows"] for m in mbs)
    assert f"rows fetched   {fetched:,} = " in out and f"of the {remote:,} remote rows `none` pulls" in out
    assert "feature check  2 rank(s), 0 rows differ" in out
    assert "epoch time" in out and "Belady on the same traces" in out


def test_sim_replays_the_run_to_its_recorded_hits(baseline):
    run_dir, _ = baseline
    p = rudder("sim", str(run_dir), "-p", "lookahead,belady", "--json", "--no-write")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    recorded = per_rank(run_dir, "minibatches")
    sim = {r["rank"]: r for r in rows if r["policy"] == "lookahead"}
    bel = {r["rank"]: r for r in rows if r["policy"] == "belady"}
    assert set(sim) == set(recorded) == {0, 1}
    for rank, mbs in recorded.items():
        assert sim[rank]["minibatches"] == len(mbs)
        assert sim[rank]["hits"] == sum(m["hits"] for m in mbs), rank
        assert sim[rank]["fetched_rows"] == sum(m["fetched_rows"] for m in mbs), rank
        assert bel[rank]["hits"] >= sim[rank]["hits"]  # demand admission: Belady bounds it


def test_readme_sim_line_on_the_run(baseline, tmp_path):
    run_dir, _ = baseline
    argv = [a.replace("runs/<run-id>", str(run_dir)) for a in readme_line("sim")]
    p = rudder(*argv, "--runs-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    for pol in ("static", "fixed:10", "fixed:25", "lookahead:3:0.1", "lookahead:8:0.1", "lru", "belady"):
        assert f"\n{pol} " in p.stdout, pol
    assert len(list(tmp_path.iterdir())) == 7  # one simulated run per policy, for `rudder collect`


def test_oracle_on_the_run(baseline):
    run_dir, out = baseline
    argv = [a.replace("runs/<run-id>", str(run_dir)) for a in readme_line("oracle")]
    p = rudder(*argv)
    assert p.returncode == 0, p.stderr
    oracle = {r: json.loads((run_dir / f"oracle-r{r}.json").read_text()) for r in (0, 1)}
    hits = sum(o["belady"]["hits"] for o in oracle.values())
    all_hits = sum(o["belady_all_remote"]["hits"] for o in oracle.values())
    # the run's summary agrees with the oracle: the unrestricted optimum first, the halo-only beside
    assert f"Belady on the same traces: {all_hits:,} " in out
    assert f"all remote nodes {all_hits:,} hits, halo only {hits:,} " in out
    recorded = per_rank(run_dir, "minibatches")
    assert hits >= sum(m["hits"] for mbs in recorded.values() for m in mbs)


# ---- collect (admit any) -> classifier ---------------------------------------------------------
COLLECT = ("train.epochs=6", "train.batch_size=250", "prefetch.window=4", "prefetch.admit=any",
           "prefetch.budget=0.2")


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    return run(runs, "prefetch.policy=collect", *COLLECT)


def test_collect_with_admit_any_in_a_real_trainer(collected):
    run_dir, out = collected
    traj = [t for p in sorted(run_dir.glob("trajectories-r*.jsonl")) for t in read_jsonl(p)]
    decisions = [d for recs in per_rank(run_dir, "decisions").values() for d in recs]
    # one trajectory per decision whose outcome window closed (each rank's last one may not)
    assert traj and len(decisions) - 2 <= len(traj) <= len(decisions)
    assert {d["policy"] for d in decisions} == {"collect"}
    assert {d["replace"] for d in decisions} == {True, False}  # random replace/skip
    # admit=any pulls rows ahead of use: some minibatch fetched more than it missed
    mbs = [m for recs in per_rank(run_dir, "minibatches").values() for m in recs]
    assert any(m["fetched_rows"] > m["misses"] for m in mbs)
    assert all(m["fetched_rows"] == m["misses"] + m["replaced_rows"] for m in mbs)
    assert "decisions      " in out


def test_classifier_trained_on_collected_runs_steers_a_real_trainer(collected, tmp_path):
    run_dir, _ = collected
    models = tmp_path / "models"
    p = rudder("classifiers", "train", "--runs", str(run_dir), "--out", str(models),
               "--models", "logreg", "--folds", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (models / "logreg.joblib").is_file()
    cdir, out = run(tmp_path / "runs", "prefetch.policy=classifier:logreg", *COLLECT,
                    env={"RUDDER_CLASSIFIERS_DIR": str(models)})
    decisions = [d for recs in per_rank(cdir, "decisions").values() for d in recs]
    assert decisions and {d["policy"] for d in decisions} == {"classifier:logreg"}
    assert all(d["model"].startswith("logreg@") and d["fallback"] is None for d in decisions)
    meta = json.loads((cdir / "run.json").read_text())
    assert meta["status"] == "complete"


# ---- the agent over HTTP ------------------------------------------------------------------------
def test_agent_over_the_per_machine_http_service(tmp_path):
    """One llama.cpp server per emulated machine (SmolLM2); both trainers ask it over HTTP."""
    run_dir, out = run(tmp_path / "runs", "prefetch.policy=agent", "agent.backend=http",
                       "agent.model.name=smollm2-135m", "agent.prompt=zero-shot", "agent.timeout_s=60",
                       # ~35 s of training: the start decision's answer took 19.5 s on a loaded
                       # host (two model servers on 2 cores), longer than 30 epochs trained
                       "train.epochs=70", "train.batch_size=200", "train.eval_every=0",
                       "prefetch.window=4", "cluster.start_timeout_s=300")  # 2 servers load on 2 cores
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert any("agent" in n or "service" in n for n in logs), logs  # the services' own logs
    decisions = [d for recs in per_rank(run_dir, "decisions").values() for d in recs]
    assert decisions and all(d["backend"] == "http" and d["model"] == "smollm2-135m" for d in decisions)
    answered = [d for d in decisions if d["fallback"] is None]
    assert answered, [d["reason"] for d in decisions][:5]
    assert any(d["applied_step"] is not None for d in answered)
    assert "decisions      " in out and "never acted" not in out
