"""The run directory: what a run leaves behind, written so that a crash loses nothing.

runs/<run-id>/
  run.json                 config (resolved), seeds, versions, host, status, reason, timings
  minibatches-r<R>.jsonl   one line per minibatch of trainer rank R  (MINIBATCH_FIELDS)
  epochs-r<R>.jsonl        one line per epoch                         (EPOCH_FIELDS)
  windows-r<R>.jsonl       one line per metrics window                (WINDOW_FIELDS)
  decisions-r<R>.jsonl     one line per policy decision (agent, classifier) (DECISION_FIELDS)
  trace-r<R>.npz           remote-access trace: halo ids + per-minibatch remote input ids
  logs/                    stdout/stderr of every process the cluster started

Lines are flushed as written (JSON Lines), so a killed run keeps every finished record.
The field lists below are the contract with the results store (rudder.results): the DuckDB
columns carry the same names.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

MINIBATCH_FIELDS = [
    "epoch", "step", "global_step",  # step within epoch; global_step across epochs
    "input_rows", "local_rows", "remote_rows",  # remote = owned by another partition
    "hits", "misses",  # remote rows served by the buffer / pulled
    "replaced_rows",  # rows admitted into the buffer this minibatch (pulled with the misses)
    "fetched_rows", "fetched_bytes",  # misses + replaced_rows: what crossed the network
    "hit_rate",  # hits / remote_rows (0 when remote_rows == 0)
    "t_sample", "t_fetch", "t_buffer", "t_compute", "t_stall",  # seconds
    "loss",
]
EPOCH_FIELDS = [
    "epoch", "t_epoch", "t_sample", "t_fetch", "t_buffer", "t_compute", "t_stall",
    "loss", "train_acc", "val_acc", "minibatches", "input_rows", "remote_rows", "hits",
    "fetched_rows", "fetched_bytes", "replaced_rows", "initial_fill_rows",
]
WINDOW_FIELDS = [
    "window", "first_step", "last_step", "minibatches", "hit_rate", "remote_rows",
    "fetched_rows", "replaced_rows", "t_fetch", "t_stall", "t_minibatch",
    "buffer_fill", "stale_slots", "lookahead_missing", "lookahead_rows",
]
DECISION_FIELDS = [
    "decision", "window", "decided_step", "applied_step", "staleness", "policy", "model",
    "backend", "prompt_hash", "raw", "replace", "budget", "expected_hit_rate",
    "expected_remote_rows", "reason", "latency_s", "fallback",
    # the measured outcome, window after vs the window the decision judged, as a direction
    # (up|down|flat|null: `direction` below) and as a number (null when not measured):
    "outcome_hit_rate", "outcome_remote_rows",  # directions
    "outcome_hit_delta",  # hit-rate change in fraction units (0..1 scale: 0.01 = 1 point)
    "outcome_rows_delta",  # relative change of fetched rows per minibatch (0.1 = +10%)
    "correct",
]

# A hit-rate change under 1 point, or a fetched-rows change under 2%, counts as "flat": the
# window-to-window noise of shuffled minibatches is of that order.
HIT_TOL = 0.01
ROWS_TOL = 0.02


def direction(delta: float | None, tol: float) -> str | None:
    """"up" / "down" / "flat" (|delta| < tol) for a measured change; None when unmeasured."""
    if delta is None:
        return None
    return "flat" if abs(delta) < tol else ("up" if delta > 0 else "down")


def outcome_fields(hit_delta: float | None, rows_delta: float | None) -> dict[str, Any]:
    """The four outcome fields of a decision record from the two measured deltas."""
    return {"outcome_hit_rate": direction(hit_delta, HIT_TOL),
            "outcome_remote_rows": direction(rows_delta, ROWS_TOL),
            "outcome_hit_delta": None if hit_delta is None else float(hit_delta),
            "outcome_rows_delta": None if rows_delta is None else float(rows_delta)}


class JsonlWriter:
    """Appends dict records as JSON lines, flushed per line (crash-safe)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = open(path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, default=_jsonable) + "\n")

    def close(self) -> None:
        self._f.close()


def _jsonable(x: Any):
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def read_jsonl(path: Path) -> list[dict]:
    """Reads records; a torn last line (crash mid-write) is skipped, not fatal. A bad line
    before the last is damage, not a crash: skipped too, but reported (logged)."""
    out = []
    if not path.exists():
        return out
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                logging.getLogger("rudder.records").warning(
                    "%s: line %d of %d is not a JSON record (torn or corrupt): skipped",
                    path, i + 1, len(lines))
            continue
    return out


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for mod in ("torch", "dgl", "numpy", "llama_cpp", "parsl", "duckdb"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
    return out


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "user_is_root": os.geteuid() == 0,
    }


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_jsonable))
    os.replace(tmp, path)


def update_run_json(run_dir: Path, **fields: Any) -> dict:
    path = Path(run_dir) / "run.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(fields)
    data["updated_at"] = time.time()
    write_json_atomic(path, data)
    return data
