"""The real thing on the local provider: `python workflows/scaling_study.py` (HTEX +
LocalProvider, real runs through rudder.runner.execute_run) on a two-run study; the study
process is killed by pid mid-way (after the first run completed), its orphans are stopped by
pid, and the rerun skips the complete run and finishes the other; DuckDB holds each run once."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow]


def study_file(tmp_path: Path) -> Path:
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump({
        "name": "e2e", "datasets": ["synth-tiny"], "machines": [1],
        "policies": ["none", "static"],
        "run": {"train": {"epochs": 1, "eval_every": 0},
                "dataset": {"root": str(tmp_path / "data")},
                "cluster": {"start_timeout_s": 180}}}))
    return p


def cmd(tmp_path: Path) -> list[str]:
    return [sys.executable, "workflows/scaling_study.py", "--study", str(study_file(tmp_path)),
            "--runs-dir", str(tmp_path / "runs"), "--no-live", "--retries", "0"]


def statuses(tmp_path: Path) -> dict[str, str]:
    out = {}
    for p in (tmp_path / "runs" / "e2e").glob("*/run.json"):
        try:
            out[p.parent.name] = json.loads(p.read_text()).get("status")
        except ValueError:
            pass
    return out


def study_processes(tmp_path: Path, tree: list[psutil.Process] = ()) -> list[psutil.Process]:
    """What a study under tmp_path has running: `tree`, processes naming the study's folder in
    their command line, and the members of their process groups (the worker pool's spawned
    workers name no folder: only their output files are there)."""
    import os

    found = {p.pid: p for p in tree if p.is_running()}
    for p in psutil.process_iter(["cmdline"]):
        if str(tmp_path) in " ".join(p.info["cmdline"] or []):
            found[p.pid] = p
    groups = set()
    for pid in list(found):
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            found.pop(pid)
    groups.discard(os.getpgrp())  # never the test's own group
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in groups:
                found[p.pid] = p
        except (ProcessLookupError, psutil.Error):
            pass
    return list(found.values())


def stop_tree(procs: list[psutil.Process]) -> None:
    """SIGTERM each (by pid), then SIGKILL whatever is left after a grace period."""
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=20)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)


@pytest.mark.timeout(900)
def test_study_killed_midway_resumes(tmp_path):
    log1 = open(tmp_path / "first.log", "wb")
    t0 = time.time()
    proc = subprocess.Popen(cmd(tmp_path), cwd=REPO, stdout=log1, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            if "complete" in statuses(tmp_path).values():
                break
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert "complete" in statuses(tmp_path).values(), "no run completed in time"
        first_done = time.time() - t0
        tree = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)  # the study process dies without any cleanup
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # what the killed study left running is stopped by pid: its children (the interchange) and
    # what was detached from it (the LocalProvider's worker pool, the run in progress and its
    # machines), found by the study's folder in their command lines
    stop_tree(study_processes(tmp_path, tree))
    before = statuses(tmp_path)
    complete_before = {k for k, v in before.items() if v == "complete"}
    assert len(complete_before) == 1, before

    t1 = time.time()
    second = subprocess.run(cmd(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=600)
    rerun_s = time.time() - t1
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    summary = json.loads((tmp_path / "runs" / "e2e" / "study.json").read_text())
    by_id = {r["run_id"]: r for r in summary["runs"]}
    assert len(by_id) == 2
    for rid, r in by_id.items():
        assert r["status"] == ("skipped" if rid in complete_before else "done"), r
        assert r["collected"] is True
    assert set(statuses(tmp_path).values()) == {"complete"}
    import duckdb

    db = tmp_path / "runs" / "e2e" / "results.duckdb"
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("select run_id, status from runs order by run_id").fetchall()
    assert sorted(rows) == sorted((rid, "complete") for rid in by_id)
    assert (tmp_path / "runs" / "e2e" / "report" / "report.md").exists()
    assert "skipped" in second.stdout and "done" in second.stdout  # the summary table
    print(f"first run complete after {first_done:.0f} s; rerun (1 skipped, 1 run) {rerun_s:.0f} s")
    # nothing of either study is left running
    left = study_processes(tmp_path)
    assert not left, [" ".join(p.cmdline()) for p in left]
