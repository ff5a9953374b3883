"""The bodies of the Parsl apps (apps/ holds the thin app wrappers). Each takes and returns
plain data (dicts, strings) so it serialises the same way through Parsl, Globus Compute or a
plain call, and imports the heavy stack (torch, dgl, duckdb) only inside.

A run executes in its own process (`python -m rudder.workflow.block`, its own session): a run
that crashes, hangs or is killed takes neither the Parsl worker nor other runs down. The
subprocess is killed (whole process group) past cluster.run_timeout_s + a margin.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KILL_GRACE_S = 15.0  # SIGTERM -> SIGKILL for a run past its deadline (LocalCluster tears down)


class RunFailed(Exception):
    """A run ended without status complete. Raised so Parsl's retries apply; the message is the
    run's recorded reason."""

    def __init__(self, run_id: str, reason: str):
        super().__init__(f"run {run_id} failed: {reason}")
        self.run_id, self.reason = run_id, reason

    def __reduce__(self):  # picklable across Parsl/Globus with both fields
        return (RunFailed, (self.run_id, self.reason))


def read_run_json(run_dir: str | Path) -> dict:
    """rudder.records.read_run, {} for a missing or unreadable file (a run still starting)."""
    from rudder.records import read_run

    try:
        return read_run(run_dir, missing_ok=True)
    except (OSError, ValueError):
        return {}


def is_complete(run_dir: str | Path, config_hash: str | None = None) -> bool:
    """True when the run finished cleanly (and, if given, with this config hash)."""
    info = read_run_json(run_dir)
    if info.get("status") != "complete":
        return False
    return config_hash is None or info.get("config_hash") in (None, config_hash)


# -- stage / partition ---------------------------------------------------------------------------

def stage_dataset(name: str, root: str) -> dict:
    """Generates or imports dataset `name` under `root` (reused when already there)."""
    from rudder.data.store import stage

    t0 = time.time()
    out = stage(name, root=root)
    return {"dataset": name, "root": root, "path": str(out) if out is not None else None,
            "seconds": time.time() - t0}


def partition_graph(name: str, num_parts: int, method: str, balance_train: bool,
                    balance_edges: bool, root: str, feature_dtype: str = "float32") -> dict:
    """Partitions dataset `name` into `num_parts` (reused when a valid partitioning exists)."""
    from rudder.data.partition import partition

    t0 = time.time()
    info = partition(name, num_parts, method=method, balance_train=balance_train,
                     balance_edges=balance_edges, root=root, feature_dtype=feature_dtype)
    return {"dataset": name, "num_parts": num_parts, "method": method,
            "part_config": str(getattr(info, "part_config", "")), "seconds": time.time() - t0}


# -- one run ------------------------------------------------------------------------------------

def run_block(config: dict, run_id: str, study: str | None = None,
              launch: dict | None = None, timeout_s: float | None = None,
              cwd: str | None = None, python: str | None = None, rerun: bool = False) -> dict:
    """One run in a subprocess; returns a summary dict, raises RunFailed if it did not complete.

    config: a RunConfig as a dict (runs_dir already includes the study folder);
    launch: execution.launch as a dict ({type: local|slurm, ifname, srun_args}), handed to the
    run's cluster as data (rudder.cluster.launch.make_cluster);
    timeout_s: wall-clock limit of the subprocess (default cluster.run_timeout_s + 300 s);
    cwd: the folder relative paths in `config` are relative to (None: this process's).
    A run already complete with the same config hash is not rerun (resume works even where the
    study process cannot see the run directories, e.g. through Globus Compute), unless `rerun`
    (the study's --rerun): then it runs again from an empty record set.
    """
    from rudder.config import RunConfig
    from rudder.workflow.study import config_hash

    cfg = RunConfig.model_validate(config)
    chash = config_hash(cfg)
    run_dir = Path(cwd or ".") / cfg.runs_dir / run_id
    if not rerun and is_complete(run_dir, chash):
        info = read_run_json(run_dir)
        return {"run_id": run_id, "run_dir": str(run_dir), "status": "complete",
                "skipped": True, "wall_s": info.get("wall_s"), "reason": ""}
    run_dir.mkdir(parents=True, exist_ok=True)
    if timeout_s is None:
        timeout_s = cfg.cluster.run_timeout_s + 300.0
    from rudder.cluster.launch import Launch

    request = {"config": cfg.model_dump(mode="json"), "launch": Launch.of(launch).to_dict()}
    argv = [python or sys.executable, "-m", "rudder.workflow.block", "--run-id", run_id]
    if study:
        argv += ["--study", study]
    if rerun:
        argv.append("--rerun")
    t0 = time.time()
    log_path = run_dir / "block.log"  # logs/ is the cluster's: it clears it at each start
    with open(log_path, "ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} attempt on {os.uname().nodename}"
                  f" pid {os.getpid()}\n".encode())
        log.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=cwd)
        timed_out = False
        try:
            proc.communicate(json.dumps(request).encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # a timeout, or this worker being stopped: the whole run goes with it
            if proc.poll() is None:
                _kill_group(proc)
    info = read_run_json(run_dir)
    status = info.get("status", "missing")
    reason = info.get("reason") or ""
    if timed_out:
        reason = f"killed after {timeout_s:.0f} s (run timeout + margin)" + (
            f"; last status {status}: {reason}" if reason else "")
        status = "failed"
    elif proc.returncode != 0 and status == "complete":
        status, reason = "failed", f"block exited with {proc.returncode} after completing"
    elif status != "complete" and not reason:
        reason = (f"block exited with {proc.returncode} (status {status}); see {log_path}")
    if status != "complete":
        if status in ("running", "preparing", "missing"):
            # killed before the runner could record it: record it now, so collect and the
            # next attempt see a failed run, not one that is still running
            from rudder.records import update_run_json

            update_run_json(run_dir, run_id=run_id, study=study, status="failed", reason=reason,
                            config_hash=chash, ended_at=time.time())
        raise RunFailed(run_id, reason)
    return {"run_id": run_id, "run_dir": str(run_dir), "status": status, "skipped": False,
            "wall_s": info.get("wall_s", time.time() - t0), "reason": ""}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


# -- results ------------------------------------------------------------------------------------

def collect_run(run_dir: str, db_path: str) -> dict:
    """Ingests one run directory into DuckDB (idempotent: re-collecting replaces its rows).
    One writer at a time: the DAG chains collects, and the store holds an exclusive lock."""
    from rudder.results.store import ResultsStore

    run_dir_p = Path(run_dir)
    if not (run_dir_p / "run.json").exists():
        return {"run_dir": run_dir, "collected": False, "reason": "no run.json"}
    with ResultsStore(db_path) as store:
        out = store.ingest_run(run_dir_p)
    return {"run_dir": run_dir, "collected": True, "result": _plain(out)}


def write_report(db_path: str, out_dir: str, study: str | None = None) -> dict:
    """Tables and plots (report.md + PNGs) of the database (of one study if given)."""
    from rudder.results.report import write_report as report

    if not Path(db_path).exists():
        return {"db": db_path, "out_dir": out_dir, "result": None, "reason": "nothing collected"}
    out = report(db_path, out_dir, study=study)
    return {"db": db_path, "out_dir": out_dir, "result": _plain(out)}


def _plain(x: Any) -> Any:
    """Something that pickles anywhere (paths and dataclasses as strings/dicts)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "__dataclass_fields__"):
        import dataclasses

        return _plain(dataclasses.asdict(x))
    return str(x)
