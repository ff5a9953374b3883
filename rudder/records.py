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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# ---- the four records ---------------------------------------------------------------------
# Each record is a dataclass: its fields, in order, are the contract (the *_FIELDS lists below and
# the DuckDB columns of rudder.results are derived from them). A field's column kind is read from
# its type (int/float/str/bool), or from metadata["kind"] where the type alone does not say it.
# metadata["extra"]: written when set, but not a column (the store keeps it in `extra`).
def _extra(default=None) -> Any:
    return field(default=default, metadata={"extra": True})


def _kind(kind: str, default=None) -> Any:
    return field(default=default, metadata={"kind": kind})


@dataclass
class StepStats:
    """What one minibatch did at the buffer: the step's statistics. Training's fetch fills one
    (rudder.prefetch.features.FetchStats is this type); the simulator builds one with `of_counts`."""

    input_rows: int | None = 0  # None: not recorded (a generated trace)
    local_rows: int | None = 0
    remote_rows: int = 0  # owned by another partition
    hits: int = 0  # remote rows served by the buffer
    misses: int = 0  # remote rows pulled
    replaced_rows: int = 0  # rows pulled only to be admitted into the buffer
    admitted_rows: int = 0  # slots changed this minibatch (admitted misses cost no extra row)
    fetched_rows: int = 0  # misses + replaced_rows: what crossed the network
    fetched_bytes: int = 0
    t_fetch: float = 0.0  # the pull (network)
    # what the buffer adds: lookup + bookkeeping + replacement + writing hit rows into the
    # output (the local/remote split is not counted: DistDGL's own pull does it too)
    t_buffer: float = 0.0

    @classmethod
    def of_counts(cls, input_rows: int | None, hits: int, misses: int, replaced_rows: int,
                  admitted_rows: int, row_bytes: int) -> "StepStats":
        """From a replay's counts (no timings); input_rows None or < 0 = unknown."""
        remote = hits + misses
        known = input_rows is not None and input_rows >= 0
        fetched = misses + replaced_rows
        return cls(input_rows if known else None, input_rows - remote if known else None, remote,
                   hits, misses, replaced_rows, admitted_rows, fetched, fetched * row_bytes)


def hit_rate(hits: float, remote_rows: float) -> float:
    """hits / remote_rows; 0 when nothing was remote."""
    return hits / remote_rows if remote_rows else 0.0


@dataclass
class MinibatchRecord:
    """One line of minibatches-r<R>.jsonl: made only by `of_step`, from the step's statistics
    (the loader/pipeline and the simulator; the trainer adds loss and compute time)."""

    epoch: int
    step: int  # within the epoch
    global_step: int  # across epochs
    input_rows: int | None
    local_rows: int | None
    remote_rows: int  # remote = owned by another partition
    hits: int  # remote rows served by the buffer
    misses: int  # ... and pulled
    replaced_rows: int  # rows admitted into the buffer this minibatch (pulled with the misses)
    fetched_rows: int  # misses + replaced_rows: what crossed the network
    fetched_bytes: int
    hit_rate: float  # hits / remote_rows (0 when remote_rows == 0)
    t_sample: float = 0.0  # seconds
    t_fetch: float = 0.0
    t_buffer: float = 0.0
    t_compute: float = 0.0
    t_stall: float = 0.0
    loss: float | None = None
    # The loader's stages (training only; None in replays): t_sample is the sampling work
    # itself (in a sampler process when train.samplers > 0), t_sample_wait what the loader waited
    # for it, t_plan the policy's plan, t_fetch the pull, t_assemble the rest of the minibatch's
    # feature and label assembly (buffer, local split, label pull), t_load the loader's wall time
    # for the minibatch (not counting waits for queue space); t_stall_max the slower rank's wait
    # for this step's minibatch (the max of t_stall over the ranks). With schedule_ahead a
    # minibatch is sampled before its turn: epoch 0's all in its first minibatch's t_load, a later
    # epoch's during the previous epoch, between hand-overs (its t_sample_wait, in no t_load).
    t_sample_wait: float | None = None
    t_plan: float | None = None
    t_assemble: float | None = None
    t_load: float | None = None
    t_stall_max: float | None = None
    admitted_rows: int = _extra(0)  # slots changed (StepStats)
    t_policy: float | None = _extra()  # the loader's seconds in policy.plan + observe
    t_labels: float | None = _extra()  # of t_assemble: the seeds' labels (training only)
    # of t_compute: backward with DDP's all-reduce, where a rank waits for the slower one, and
    # the optimizer step (training only); t_compute - t_backward is the forward and the loss
    t_backward: float | None = _extra()

    @classmethod
    def of_step(cls, epoch: int, step: int, global_step: int, stats: StepStats, *, t_sample: float = 0.0,
                t_compute: float = 0.0, t_stall: float = 0.0, loss: float | None = None,
                t_policy: float | None = None, **stages: float | None) -> "MinibatchRecord":
        """stats: the step's StepStats (training's FetchStats is the same type); stages: the loader's
        t_sample_wait, t_plan, t_assemble, t_load (training)."""
        s = stats
        return cls(epoch, step, global_step, s.input_rows, s.local_rows, s.remote_rows, s.hits,
                   s.misses, s.replaced_rows, s.fetched_rows, s.fetched_bytes,
                   hit_rate(s.hits, s.remote_rows), t_sample, s.t_fetch, s.t_buffer, t_compute,
                   t_stall, loss, admitted_rows=s.admitted_rows, t_policy=t_policy, **stages)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


@dataclass
class EpochRecord:
    """One line of epochs-r<R>.jsonl: the totals of an epoch's minibatch records (`EpochTotals`)
    and what only the epoch knows (accuracy, the initial fill)."""

    epoch: int
    t_epoch: float | None = None
    t_sample: float | None = None
    t_fetch: float | None = None
    t_buffer: float | None = None
    t_compute: float | None = None
    t_stall: float | None = None
    loss: float | None = None  # mean over the epoch's minibatches
    train_acc: float | None = None
    val_acc: float | None = None
    minibatches: int | None = None
    input_rows: int | None = None
    remote_rows: int | None = None
    hits: int | None = None
    fetched_rows: int | None = None
    fetched_bytes: int | None = None
    replaced_rows: int | None = None
    initial_fill_rows: int | None = None
    # sums of the minibatches' loader stages (None in replays)
    t_sample_wait: float | None = None
    t_plan: float | None = None
    t_assemble: float | None = None
    t_load: float | None = None
    t_stall_max: float | None = None
    # this epoch over all ranks (rudder.bounds, gathered by the trainers at the epoch's end):
    # the slowest rank's t_epoch, the compute-only and pipeline bounds, the epoch's ratio to each
    t_epoch_max: float | None = None
    bound_compute_s: float | None = None
    bound_pipeline_s: float | None = None
    epoch_over_compute: float | None = None
    epoch_over_pipeline: float | None = None
    # CPU seconds of the trainer process during the epoch (all its threads: compute, the loader's
    # sampling collection, buffer work and pulls, DGL's RPC), not its sampler processes; beside
    # t_epoch it shows how much of a shared host's cores the rank took (None in replays)
    cpu_s: float | None = None
    t_policy: float | None = _extra()
    t_initial_fill: float | None = _extra()

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


class EpochTotals:
    """Sums an epoch's MinibatchRecords into an EpochRecord (trainer and simulator alike)."""

    SUMS = ("t_sample", "t_fetch", "t_buffer", "t_compute", "t_stall", "input_rows", "remote_rows",
            "hits", "fetched_rows", "fetched_bytes", "replaced_rows")
    STAGES = ("t_sample_wait", "t_plan", "t_assemble", "t_load", "t_stall_max")  # None: not recorded

    def __init__(self) -> None:
        self.sums: dict[str, Any] = dict.fromkeys(self.SUMS, 0)
        self.stages: dict[str, float | None] = dict.fromkeys(self.STAGES)
        self.t_policy: float | None = None
        self.loss = 0.0
        self.losses = 0
        self.n = 0

    def add(self, r: MinibatchRecord) -> None:
        for k in self.SUMS:
            v, tot = getattr(r, k), self.sums[k]
            self.sums[k] = None if v is None or tot is None else tot + v  # unknown stays unknown
        for k in self.STAGES:
            v = getattr(r, k)
            if v is not None:
                self.stages[k] = (self.stages[k] or 0.0) + v
        if r.t_policy is not None:
            self.t_policy = (self.t_policy or 0.0) + r.t_policy
        if r.loss is not None:
            self.loss += r.loss
            self.losses += 1
        self.n += 1

    def record(self, epoch: int, **only_epoch: Any) -> EpochRecord:
        """only_epoch: t_epoch, train_acc, val_acc, initial_fill_rows, t_initial_fill, cpu_s and the
        epoch's bounds (t_epoch_max, bound_*, epoch_over_*)."""
        loss = self.loss / max(self.n, 1) if self.losses else None
        return EpochRecord(epoch=epoch, **self.sums, loss=loss, minibatches=self.n,
                           t_policy=self.t_policy, **self.stages, **only_epoch)


@dataclass
class WindowRecord:
    """One line of windows-r<R>.jsonl: made by rudder.prefetch.metrics.MetricsCollector."""

    window: int
    first_step: int
    last_step: int
    minibatches: int
    hit_rate: float
    remote_rows: int
    fetched_rows: int
    replaced_rows: int
    t_fetch: float  # mean per minibatch
    t_stall: float
    t_minibatch: float
    buffer_fill: int = 0  # the buffer at the window's close (rudder.prefetch.metrics.buffer_state)
    stale_slots: int = 0
    lookahead_missing: int = 0
    lookahead_rows: int = 0
    # the window's missed halo nodes as a set, against the window before's (HaloBuffer.roll_misses):
    # distinct nodes missed, of them missed in the window before too, and the two sets' union
    missed_nodes: int = 0
    missed_again: int = 0
    missed_union: int = 0
    # slots an evict=half round at the next minibatch may take (stale at half the period after
    # that minibatch's decay, if not hit; rudder.prefetch.metrics.buffer_state)
    stale_half: int | None = _extra()
    # how many sampled-ahead minibatches lookahead_missing counts over: `lookahead`, or under
    # prefetch.schedule_ahead what is sampled so far: the epoch's rest, then the next epoch's
    lookahead_minibatches: int | None = _extra()

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


@dataclass
class DecisionRecord:
    """One line of decisions-r<R>.jsonl (agent: rudder.agent.messages.Decision.to_record;
    windowed policies: rudder.agent.trajectories)."""

    decision: int | None = None
    window: int | None = None
    decided_step: int | None = None
    applied_step: int | None = None
    staleness: float | None = None  # minibatches between decided_step and applied_step
    policy: str | None = None
    model: str | None = None
    backend: str | None = None
    prompt_hash: str | None = None
    raw: str | None = None
    replace: bool | None = None
    budget: float | None = None  # a share of capacity (or the agent's word: kept in `extra`)
    # a prediction may be a direction ("up"/"down"/"flat") or a number: kept as text
    expected_hit_rate: str | None = None
    expected_remote_rows: str | None = None
    reason: str | None = None
    latency_s: float | None = None
    fallback: Any = _kind("flag")  # True/False, or which fallback applied ("timeout": True, kept)
    # the measured outcome, window after vs the window the decision judged, as a direction
    # (up|down|flat|null: `direction` below) and as a number (null when not measured):
    outcome_hit_rate: str | None = None  # directions
    outcome_remote_rows: str | None = None
    outcome_hit_delta: float | None = None  # hit-rate change in fraction units (0.01 = 1 point)
    outcome_rows_delta: float | None = None  # relative change of fetched rows per minibatch (0.1 = +10%)
    correct: bool | None = None
    # the counterfactual (rudder.agent.hindsight.judge_run, after the run, from its trace): the
    # decision taken and its alternative (replace vs keep) replayed from the same buffer state at
    # applied_step over the next windows; null where not judged (fallbacks, the run's last windows)
    cf_rows_saved: int | None = None  # rows the alternative fetches minus rows the decision fetched
    cf_replace_share: float | None = None  # rows replacing saves vs keeping / the horizon's remote rows
    correct_cf: bool | None = None  # the action was right by the counterfactual (rudder.agent.judge)
    admit: str | None = _extra()  # the round's admission where the decider chose it (rule)
    evict: str | None = _extra()  # which slots a history-only round counted stale (evict word)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


def _as_dict(rec: Any) -> dict[str, Any]:
    """Fields in order; an extra field only when set."""
    return {f.name: getattr(rec, f.name) for f in fields(rec)
            if not (f.metadata.get("extra") and getattr(rec, f.name) is None)}


def contract_fields(cls: type) -> list[str]:
    """The record's column fields, in order (extras left out)."""
    return [f.name for f in fields(cls) if not f.metadata.get("extra")]


_KINDS = {"int": "int", "float": "float", "str": "str", "bool": "bool"}


def column_kinds(cls: type) -> dict[str, str]:
    """{field: column kind} (int, float, str, bool, flag) for the results store."""
    out = {}
    for f in fields(cls):
        if f.metadata.get("extra"):
            continue
        kind = f.metadata.get("kind") or _KINDS.get(str(f.type).split("|")[0].strip())
        if kind is None:
            raise TypeError(f"{cls.__name__}.{f.name}: no column kind for type {f.type!r}")
        out[f.name] = kind
    return out


MINIBATCH_FIELDS = contract_fields(MinibatchRecord)
EPOCH_FIELDS = contract_fields(EpochRecord)
WINDOW_FIELDS = contract_fields(WindowRecord)
DECISION_FIELDS = contract_fields(DecisionRecord)
RECORDS = {"minibatches": MinibatchRecord, "epochs": EpochRecord, "windows": WindowRecord,
           "decisions": DecisionRecord}  # file prefix / DuckDB table -> record

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
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict):
            out.append(rec)
        elif i < len(lines) - 1:
            logging.getLogger("rudder.records").warning(
                "%s: line %d of %d is not a JSON record (torn or corrupt): skipped", path, i + 1, len(lines))
    return out


def read_jsonl_strict(path: str | Path, what: str) -> list[tuple[int, Any]]:
    """(line number, record) of each non-blank line of a file a user hands in (a script of
    answers, labelled windows), where a line that is not JSON is an error naming path:line and
    `what` the line should be. A run's own records are read with read_jsonl (a torn last line
    there is a crash's, skipped)."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not {what} ({exc.msg})") from None
        out.append((n, rec))
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


def unwritable_folder(path: str | Path) -> str | None:
    """Why records could not be written under the folder `path` (made if missing), or None:
    its nearest existing ancestor must be a folder this user may write (a dry run's check)."""
    probe = Path(path).absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user"
    return None


def read_run(run_dir: str | Path, missing_ok: bool = False) -> dict:
    """The run directory's run.json ({} when it is absent and missing_ok; else an error naming
    the path)."""
    path = Path(run_dir) / "run.json"
    if not path.exists():
        if missing_ok:
            return {}
        what = "no run.json in" if Path(run_dir).is_dir() else "no run directory at"
        raise FileNotFoundError(f"{what} {run_dir}")
    return read_json_object(path)


def read_json_object(path: str | Path) -> dict:
    """A JSON object from a file; a torn file or another kind of value is an error naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def update_run_json(run_dir: Path, **fields: Any) -> dict:
    data = read_run(run_dir, missing_ok=True)
    path = Path(run_dir) / "run.json"
    data.update(fields)
    data["updated_at"] = time.time()
    write_json_atomic(path, data)
    return data
