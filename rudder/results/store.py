"""ResultsStore: run directories (rudder.records layout) collected into one DuckDB file.

One writer by design. DuckDB lets a single process open a database file read-write, and a
study has a single collect step; concurrent collectors would otherwise fail on DuckDB's own
lock, or, inside one process, interleave their transactions. So a writer takes an exclusive
`fcntl.flock` on `<db>.lock` for as long as it is open, and readers take a shared one: a second
collector (or a report started mid-collection) waits for the first to finish instead of failing,
up to `lock_timeout_s`. (flock is node-local on some network file systems: keep the database on
the node that runs the collect step, or on a file system mounted with flock support.)

Idempotent ingest: a run's rows (runs + child tables) are deleted and inserted again in one
transaction (ingest_runs puts up to BATCH_RUNS runs in one), so re-collecting a run replaces its
rows and never duplicates them; a crash mid-ingest leaves the previous version. A content
fingerprint of the run directory is stored with the run: an unchanged run is skipped unless
`force=True`.

Records are read with `rudder.records.read_jsonl` (a torn last line is skipped). Fields of the
contract (MINIBATCH_FIELDS, ...) become typed columns; extra fields, and values that do not fit
their column's type, are kept in the row's `extra` JSON column, so nothing a run wrote is lost.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from operator import itemgetter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import duckdb
import pyarrow as pa

from rudder.records import (
    DECISION_FIELDS,
    EPOCH_FIELDS,
    HIT_TOL,
    MINIBATCH_FIELDS,
    ROWS_TOL,
    WINDOW_FIELDS,
    direction,
    read_jsonl,
)

log = logging.getLogger(__name__)

# v2: decisions.outcome_hit_rate/outcome_remote_rows are directions (VARCHAR), the numbers are
#     outcome_hit_delta/outcome_rows_delta (DOUBLE)
SCHEMA_VERSION = 2  # bump when a table changes shape; an older file must be re-collected
INGEST_VERSION = 2  # bump when ingest logic changes; part of the fingerprint (forces re-ingest)

# --- column types ------------------------------------------------------------------------------
# Kinds: int -> BIGINT, float -> DOUBLE, bool -> BOOLEAN, str -> VARCHAR, ts -> TIMESTAMP (UTC),
# json -> JSON; flag -> BOOLEAN where any other text counts as true (and is kept in `extra`). Every contract field has a kind here; a field missing from a record is NULL.
_COUNT = "int"
_SEC = "float"
FIELD_KINDS: dict[str, dict[str, str]] = {
    "minibatches": {
        "epoch": "int", "step": "int", "global_step": "int",
        "input_rows": _COUNT, "local_rows": _COUNT, "remote_rows": _COUNT,
        "hits": _COUNT, "misses": _COUNT, "replaced_rows": _COUNT,
        "fetched_rows": _COUNT, "fetched_bytes": _COUNT, "hit_rate": "float",
        "t_sample": _SEC, "t_fetch": _SEC, "t_buffer": _SEC, "t_compute": _SEC, "t_stall": _SEC,
        "loss": "float",
    },
    "epochs": {
        "epoch": "int", "t_epoch": _SEC, "t_sample": _SEC, "t_fetch": _SEC, "t_buffer": _SEC,
        "t_compute": _SEC, "t_stall": _SEC, "loss": "float", "train_acc": "float",
        "val_acc": "float", "minibatches": _COUNT, "input_rows": _COUNT, "remote_rows": _COUNT,
        "hits": _COUNT, "fetched_rows": _COUNT, "fetched_bytes": _COUNT,
        "replaced_rows": _COUNT, "initial_fill_rows": _COUNT,
    },
    "windows": {
        "window": "int", "first_step": "int", "last_step": "int", "minibatches": _COUNT,
        "hit_rate": "float", "remote_rows": _COUNT, "fetched_rows": _COUNT,
        "replaced_rows": _COUNT, "t_fetch": _SEC, "t_stall": _SEC, "t_minibatch": _SEC,
        "buffer_fill": _COUNT, "stale_slots": _COUNT, "lookahead_missing": _COUNT,
        "lookahead_rows": _COUNT,
    },
    "decisions": {
        "decision": "int", "window": "int", "decided_step": "int", "applied_step": "int",
        "staleness": "float",  # minibatches between decided_step and applied_step
        "policy": "str", "model": "str", "backend": "str", "prompt_hash": "str", "raw": "str",
        "replace": "bool", "budget": "float",
        # a prediction may be a direction ("up"/"down"/"flat") or a number: kept as text
        "expected_hit_rate": "str", "expected_remote_rows": "str",
        "reason": "str", "latency_s": "float",
        "fallback": "flag",  # True/False, or which fallback applied ("timeout": True, kept)
        # the measured outcome: directions (up/down/flat) and numbers (rudder.records)
        "outcome_hit_rate": "str", "outcome_remote_rows": "str",
        "outcome_hit_delta": "float",  # hit-rate change, 0..1 units (0.01 = 1 point)
        "outcome_rows_delta": "float",  # relative change of fetched rows per minibatch
        "correct": "bool",
    },
}
# The contract lists are the source of truth for names: fail at import if they drift apart.
for _table, _fields in (("minibatches", MINIBATCH_FIELDS), ("epochs", EPOCH_FIELDS),
                        ("windows", WINDOW_FIELDS), ("decisions", DECISION_FIELDS)):
    assert list(FIELD_KINDS[_table]) == list(_fields), f"{_table}: FIELD_KINDS != records fields"

# Per child table: the record field that identifies a row within (run_id, rank), and the file.
ROW_KEY = {"minibatches": "global_step", "epochs": "epoch", "windows": "window",
           "decisions": "decision"}
FILE_PREFIX = {"minibatches": "minibatches", "epochs": "epochs", "windows": "windows",
               "decisions": "decisions"}
CHILD_TABLES = tuple(FIELD_KINDS)
TABLES = ("studies", "runs") + CHILD_TABLES
BATCH_RUNS = 64  # runs written per transaction by ingest_runs ...
BATCH_ROWS = 2_000_000  # ... or fewer, when their records add up to this many rows
_RANK_FILE = re.compile(r"^(minibatches|epochs|windows|decisions)-r(\d+)\.jsonl$")

# runs: flattened key config columns (name, kind, path into the resolved RunConfig dict).
CONFIG_COLUMNS: list[tuple[str, str, tuple[str, ...]]] = [
    ("dataset", "str", ("dataset", "name")),
    ("machines", "int", ("cluster", "machines")),
    ("trainers_per_machine", "int", ("cluster", "trainers_per_machine")),
    ("bandwidth", "str", ("cluster", "bandwidth")),
    ("policy", "str", ("prefetch", "policy")),
    ("prefetch_fraction", "float", ("prefetch", "prefetch_fraction")),
    ("model", "str", ("agent", "model", "name")),  # see _flatten_config: only agent/classifier
    ("batch_size", "int", ("train", "batch_size")),
    ("planned_epochs", "int", ("train", "epochs")),
]
RUN_COLUMNS: dict[str, str] = {
    "run_id": "str", "study": "str",
    **{name: kind for name, kind, _ in CONFIG_COLUMNS},
    "status": "str", "reason": "str", "simulated": "bool",
    "started_at": "ts", "ended_at": "ts", "wall_s": "float", "ranks": "int",
    "config": "json", "config_hash": "str", "timings": "json", "versions": "json",
    "host": "json", "seeds": "json", "run_dir": "str", "fingerprint": "str",
    "collected_at": "ts", "extra": "json",
}
_RUN_JSON_KEYS = {"run_id", "study", "config", "config_hash", "status", "reason", "started_at",
                  "ended_at", "wall_s", "simulated", "versions", "host", "seeds", "timings"}

_SQL_TYPE = {"int": "BIGINT", "float": "DOUBLE", "bool": "BOOLEAN", "flag": "BOOLEAN",
             "str": "VARCHAR",
             "ts": "TIMESTAMP", "json": "JSON"}
_ARROW_TYPE = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
               "flag": pa.bool_(), "str": pa.string(),
               "ts": pa.timestamp("us"), "json": pa.string()}


def _ddl() -> list[str]:
    stmts = [
        "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
        """CREATE TABLE IF NOT EXISTS studies (
            study VARCHAR PRIMARY KEY, runs_root VARCHAR, runs BIGINT,
            first_collected_at TIMESTAMP, collected_at TIMESTAMP)""",
    ]
    cols = ",\n  ".join(f"{c} {_SQL_TYPE[k]}" for c, k in RUN_COLUMNS.items())
    stmts.append(f"CREATE TABLE IF NOT EXISTS runs (\n  {cols},\n  PRIMARY KEY (run_id))")
    for table, kinds in FIELD_KINDS.items():
        # Key (run_id, rank, <ROW_KEY>) is made unique by ingest (last record wins), not by a
        # constraint: an index over millions of minibatch rows would cost more than it protects.
        cols = ",\n  ".join(f'"{c}" {_SQL_TYPE[k]}' for c, k in kinds.items())
        stmts.append(f"CREATE TABLE IF NOT EXISTS {table} (\n  run_id VARCHAR NOT NULL,\n"
                     f"  rank INTEGER NOT NULL,\n  {cols},\n  extra JSON)")
    return stmts


# --- value coercion ----------------------------------------------------------------------------
_MISSING = object()
_TRUE = {"true", "yes", "y", "1", "t"}
_FALSE = {"false", "no", "n", "0", "f", "", "none", "null"}


class _FlagText(str):
    """A `flag` value given as text: stored as True, the text kept in `extra`."""


def _coerce(value: Any, kind: str) -> Any:
    """Value for a column of `kind`, or _MISSING when it does not fit (kept in `extra`)."""
    if value is None:
        return None
    if kind == "int":
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value if -2**63 <= value < 2**63 else _MISSING
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                return _MISSING
        return _MISSING
    if kind == "float":
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return _MISSING
        return _MISSING
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            low = value.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
        return _MISSING
    if kind == "flag":
        b = _coerce(value, "bool")
        return b if b is not _MISSING else _FlagText(value)
    if kind == "str":
        return value if isinstance(value, str) else json.dumps(value, default=str)
    if kind == "json":
        return json.dumps(value, default=str, sort_keys=True)
    if kind == "ts":
        try:
            if isinstance(value, (int, float)) and math.isfinite(value):
                return datetime.fromtimestamp(value, tz=timezone.utc).replace(tzinfo=None)
            if isinstance(value, str):
                dt = datetime.fromisoformat(value)
                if dt.tzinfo is not None:
                    dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
                return dt
        except (ValueError, OverflowError, OSError):
            pass
        return _MISSING
    raise ValueError(f"unknown column kind {kind!r}")


def _decision_outcomes(rec: dict) -> dict:
    """A decision record written before outcome_hit_delta/outcome_rows_delta existed carries
    numbers in outcome_hit_rate/outcome_remote_rows (classifier policies did): they become the
    deltas, and the direction columns get their directions (rudder.records.outcome_fields)."""
    hit, rows = rec.get("outcome_hit_rate"), rec.get("outcome_remote_rows")
    numeric = [isinstance(v, (int, float)) and not isinstance(v, bool) for v in (hit, rows)]
    if not any(numeric) or "outcome_hit_delta" in rec or "outcome_rows_delta" in rec:
        return rec
    out = dict(rec)
    if numeric[0]:
        out["outcome_hit_rate"] = direction(float(hit), HIT_TOL)
        out["outcome_hit_delta"] = float(hit)
    if numeric[1]:
        out["outcome_remote_rows"] = direction(float(rows), ROWS_TOL)
        out["outcome_rows_delta"] = float(rows)
    return out


def _records_table(run_id: str, rows: list[tuple[int, dict]], kinds: dict[str, str]) -> pa.Table:
    """(rank, record) pairs -> an Arrow table with the child table's columns."""
    n = len(rows)
    names = list(kinds)
    extras: list[dict | None] = [None] * n
    columns: dict[str, pa.Array] = {
        "run_id": pa.array([run_id] * n, pa.string()),
        "rank": pa.array([r for r, _ in rows], pa.int32()),
    }
    getter = itemgetter(*names)
    try:  # records usually carry every field: one C call per record
        tuples = [getter(rec) for _, rec in rows]
    except KeyError:
        tuples = [tuple(rec.get(k) for k in names) for _, rec in rows]
    by_column = list(zip(*tuples)) if tuples else [()] * len(names)
    for name, values in zip(names, by_column):
        kind = kinds[name]
        arr = _fast_array(list(values), kind)
        if arr is not None:
            columns[name] = arr
            continue
        out = []
        for i, v in enumerate(values):
            c = _coerce(v, kind)
            if c is _MISSING or isinstance(c, _FlagText):
                extras[i] = extras[i] or {}
                extras[i][name] = v
                c = True if isinstance(c, _FlagText) else None
            out.append(c)
        columns[name] = pa.array(out, _ARROW_TYPE[kind])
    known = frozenset(names) | {"run_id", "rank"}
    all_keys = set().union(*(rec.keys() for _, rec in rows))
    beyond = not all_keys <= frozenset(names)  # usually False: nothing beyond the contract
    for i, (rank, rec) in enumerate(rows if beyond else ()):
        unknown = rec.keys() - known
        if "rank" in rec and rec["rank"] != rank:  # a record's own rank disagrees: keep it
            unknown.add("rank")
        if "run_id" in rec and rec["run_id"] != run_id:
            unknown.add("run_id")
        if unknown:
            extras[i] = extras[i] or {}
            extras[i].update((k, rec[k]) for k in sorted(unknown))
    columns["extra"] = pa.array(
        [None if e is None else json.dumps(e, default=str, sort_keys=True) for e in extras],
        pa.string())
    return pa.table(columns)


_FAST_OK = {  # inferred Arrow type -> fine as is for this kind (nulls are fine everywhere)
    "int": (pa.int64(),),
    "float": (pa.int64(), pa.float64()),
    "bool": (pa.bool_(),),
    "flag": (pa.bool_(),),
    "str": (pa.string(),),
}


def _fast_array(values: list, kind: str) -> pa.Array | None:
    """The column as Arrow when every value already has the column's type (type inferred in
    C), else None: the caller coerces value by value. (Not pa.array(values, type): pyarrow
    would silently truncate 1.5 to 1 in an int64 column.)"""
    if kind not in _FAST_OK:
        return None
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None
    if arr.type == pa.null():
        return pa.nulls(len(values), _ARROW_TYPE[kind])
    if arr.type not in _FAST_OK[kind]:
        return None
    return arr.cast(_ARROW_TYPE[kind]) if arr.type != _ARROW_TYPE[kind] else arr


def _dig(d: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


# --- run directories ---------------------------------------------------------------------------
def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories (those holding a run.json) at or below each path, sorted, no duplicates.

    A path may be one run directory or any directory above run directories (runs/, a study's
    folder). A run directory is not searched further (its logs/ holds no runs).
    """
    found: dict[Path, None] = {}
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"no such runs directory: {p}")
        if (p / "run.json").is_file():
            found[p.resolve()] = None
            continue
        if not p.is_dir():
            raise FileNotFoundError(f"not a run directory (no run.json) nor a folder: {p}")
        for root, dirs, files in os.walk(p):
            if "run.json" in files:
                found[Path(root).resolve()] = None
                dirs[:] = []
            else:
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(found)


def _read_records(path: Path) -> list:
    """records.read_jsonl, faster: the whole file parsed in one call when every line is a JSON
    object; otherwise (a torn or corrupt line) line by line through read_jsonl itself."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    try:
        recs = json.loads("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        return read_jsonl(path)
    if len(recs) != len(lines) or not all(isinstance(r, dict) for r in recs):
        return read_jsonl(path)  # a line held more (or less) than one record
    return recs


def _rank_files(run_dir: Path) -> dict[str, dict[int, Path]]:
    out: dict[str, dict[int, Path]] = {t: {} for t in CHILD_TABLES}
    for f in run_dir.iterdir():
        m = _RANK_FILE.match(f.name)
        if m and f.is_file():
            out[m.group(1)][int(m.group(2))] = f
    return out


def _fingerprint(run_dir: Path, files: list[Path], study: str | None) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"ingest-v{INGEST_VERSION}|study={study}|".encode())
    for f in sorted(files):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class IngestResult:
    """What `ingest_run` did with one run directory."""

    run_id: str
    run_dir: Path
    status: str | None
    skipped: bool = False  # unchanged since the last collect (same fingerprint)
    rows: dict[str, int] = field(default_factory=dict)  # child table -> rows inserted


@dataclass
class CollectSummary:
    """What `ingest_runs` / `ingest_study` did; `errors` lists run dirs that could not be read."""

    results: list[IngestResult] = field(default_factory=list)
    errors: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def ingested(self) -> int:
        return sum(not r.skipped for r in self.results)

    @property
    def skipped(self) -> int:
        return sum(r.skipped for r in self.results)


# --- locking -----------------------------------------------------------------------------------
class StoreLockedError(RuntimeError):
    """Another process holds the results database (a collector is writing, or readers are open
    while a collector waits) for longer than the lock timeout."""


def _acquire(lock_path: Path, exclusive: bool, timeout_s: float):
    try:
        fh = open(lock_path, "a+")
    except OSError as exc:
        if exclusive:
            raise
        # A read-only directory: nobody can write there, so there is nothing to wait for.
        log.debug("no lock file for reading %s: %s", lock_path, exc)
        return None
    op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    waiting = False
    while True:
        try:
            fcntl.flock(fh.fileno(), op | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                fh.close()
                raise
            if time.monotonic() >= deadline:
                fh.close()
                raise StoreLockedError(
                    f"{lock_path.with_suffix('')} is in use by another process "
                    f"({'a collector or open readers' if exclusive else 'a collector'}); "
                    f"waited {timeout_s:.0f} s") from None
            if not waiting:
                waiting = True
                log.info("waiting for %s (held by another process; up to %.0f s)",
                         lock_path, timeout_s)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    if exclusive:  # who holds it, for whoever waits
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        fh.flush()
    return fh


# --- the store ---------------------------------------------------------------------------------
class ResultsStore:
    """One DuckDB file of results. Open as the writer (default) or `read_only=True`.

    Use as a context manager (or call close()): the writer holds an exclusive lock on
    `<path>.lock` while open, readers a shared one.
    """

    def __init__(self, path: str | Path = "results.duckdb", read_only: bool = False,
                 lock_timeout_s: float = 600.0):
        self.path = Path(path)
        self.read_only = read_only
        self._lock = None
        if read_only and not self.path.exists():
            raise FileNotFoundError(
                f"no results database at {self.path} (collect runs first: "
                f"`rudder collect RUNS_DIR --db {self.path}`)")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        self._lock = _acquire(lock_path, exclusive=not read_only, timeout_s=lock_timeout_s)
        try:
            self.con = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.IOException as exc:
            self._release()
            raise StoreLockedError(f"cannot open {self.path}: {exc}") from None
        except BaseException:
            self._release()
            raise
        if not read_only:
            self._create_schema()
        else:
            self._check_schema()

    # lifecycle
    def close(self) -> None:
        con = getattr(self, "con", None)
        if con is not None:
            con.close()
            self.con = None
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            try:
                fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
            finally:
                self._lock.close()
                self._lock = None

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a forgotten store must not keep the lock
        try:
            self.close()
        except Exception:
            pass

    def _create_schema(self) -> None:
        self.con.execute("BEGIN")
        try:
            for stmt in _ddl():
                self.con.execute(stmt)
            row = self._one("SELECT value FROM meta WHERE key = 'schema_version'")
            if row is None:
                self.con.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                                 [str(SCHEMA_VERSION)])
            elif row[0] != str(SCHEMA_VERSION):
                raise ValueError(
                    f"{self.path} has results schema v{row[0]}, this rudder writes "
                    f"v{SCHEMA_VERSION}: collect into a new file (the runs are the source)")
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def _check_schema(self) -> None:
        try:
            row = self._one("SELECT value FROM meta WHERE key = 'schema_version'")
        except duckdb.CatalogException:
            row = None
        if row is None:
            raise ValueError(f"{self.path} is not a rudder results database (no meta table)")

    # ingest
    def ingest_run(self, run_dir: str | Path, study: str | None = None,
                   force: bool = False) -> IngestResult:
        """Collect one run directory, replacing whatever the store held for that run, in one
        transaction.

        study: a study name for a run whose run.json names none (a run.json's own study wins).
        force: re-ingest even if the directory is unchanged since the last collect.
        """
        self._need_writer()
        parsed = self._parse_run(Path(run_dir), study, force, known=None)
        if isinstance(parsed, _Parsed):
            self._write([parsed])
            return parsed.result
        return parsed

    def ingest_runs(self, dirs: Iterable[str | Path], study: str | None = None,
                    force: bool = False, progress: bool = False) -> CollectSummary:
        """Collect every run directory at or below `dirs`.

        Runs are written in batches (one transaction each, up to BATCH_RUNS runs or
        BATCH_ROWS rows): a batch replaces its runs' rows all at once. A run that cannot be read
        is reported in `errors` and does not stop the others.

        study: runs whose run.json names no study are tagged with it; with a study given, runs
        whose run.json names a *different* study are left out (listed in the log).
        """
        self._need_writer()
        dirs = list(dirs)
        run_dirs = find_run_dirs(dirs)
        summary = CollectSummary()
        known = dict(self.con.execute("SELECT run_id, fingerprint FROM runs").fetchall())
        batch: dict[str, _Parsed] = {}
        bar = _progress(progress, len(run_dirs))

        def flush() -> None:
            if not batch:
                return
            parsed = list(batch.values())
            batch.clear()
            try:
                self._write(parsed)
            except duckdb.Error as exc:  # find the culprit: one run per transaction
                log.warning("batch of %d runs failed (%s); writing them one by one",
                            len(parsed), exc)
                for p in parsed:
                    try:
                        self._write([p])
                    except duckdb.Error as exc1:
                        summary.errors.append((p.result.run_dir, str(exc1)))
                        continue
                    summary.results.append(p.result)
                return
            summary.results.extend(p.result for p in parsed)

        try:
            for d in run_dirs:
                try:
                    if study is not None:
                        named = _run_json_study(d)
                        if named not in (None, study):
                            log.info("skip %s: study %r, not %r", d, named, study)
                            continue
                    parsed = self._parse_run(d, study, force, known)
                except (OSError, ValueError) as exc:
                    log.warning("cannot collect %s: %s", d, exc)
                    summary.errors.append((d, str(exc)))
                    continue
                finally:
                    bar.advance()
                if not isinstance(parsed, _Parsed):
                    summary.results.append(parsed)  # unchanged, skipped
                    continue
                rid = parsed.result.run_id
                if rid in batch:
                    log.warning("run_id %r in both %s and %s; the latter wins", rid,
                                batch[rid].result.run_dir, d)
                batch[rid] = parsed
                if len(batch) >= BATCH_RUNS or \
                        sum(p.rows for p in batch.values()) >= BATCH_ROWS:
                    flush()
            flush()
        finally:
            bar.stop()
        if study is not None:  # the study row: where it was collected from, how many runs
            self._in_transaction(self._touch_study, study,
                                 ", ".join(str(Path(d).resolve()) for d in dirs), True)
        return summary

    def _parse_run(self, run_dir: Path, study: str | None, force: bool,
                   known: dict[str, str] | None) -> "_Parsed | IngestResult":
        """Reads a run directory into Arrow tables; an IngestResult(skipped) if unchanged.
        known: run_id -> fingerprint already stored (None: look it up)."""
        run_json = run_dir / "run.json"
        if not run_json.is_file():
            raise FileNotFoundError(f"{run_dir}: no run.json (not a run directory)")
        try:
            meta = json.loads(run_json.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{run_json}: unreadable JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise ValueError(f"{run_json}: top level is not an object")
        run_id = str(meta.get("run_id") or run_dir.name)
        study = meta.get("study") or study

        files = _rank_files(run_dir)
        all_files = [run_json] + [p for per in files.values() for p in per.values()]
        fp = _fingerprint(run_dir, all_files, study)
        if not force:
            if known is None:
                row = self._one("SELECT fingerprint FROM runs WHERE run_id = ?", [run_id])
                stored = row[0] if row else None
            else:
                stored = known.get(run_id)
            if stored == fp:
                return IngestResult(run_id, run_dir, meta.get("status"), skipped=True)

        tables: dict[str, pa.Table] = {}
        for table, per_rank in files.items():
            rows: list[tuple[int, dict]] = []
            for rank in sorted(per_rank):
                recs = [r for r in _read_records(per_rank[rank]) if isinstance(r, dict)]
                if table == "decisions":
                    recs = [_decision_outcomes(r) for r in recs]
                rows.extend((rank, r) for r in _dedupe(recs, ROW_KEY[table]))
            if rows:
                tables[table] = _records_table(run_id, rows, FIELD_KINDS[table])
        ranks = set().union(*(per.keys() for per in files.values()))
        run_row = self._run_row(meta, run_id, study, run_dir, fp, len(ranks))
        result = IngestResult(run_id, run_dir, meta.get("status"),
                              rows={t: tables[t].num_rows if t in tables else 0
                                    for t in CHILD_TABLES})
        return _Parsed(result, run_row, tables, study)

    def _write(self, parsed: list["_Parsed"]) -> None:
        """Replaces the rows of these runs, in one transaction."""
        con = self.con
        ids = pa.table({"run_id": pa.array([p.result.run_id for p in parsed], pa.string())})
        con.execute("BEGIN")
        try:
            con.register("_ids", ids)
            for table in CHILD_TABLES + ("runs",):
                con.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT run_id FROM _ids)")
            _insert(con, "runs", pa.concat_tables([p.run_row for p in parsed]))
            for table in CHILD_TABLES:
                parts = [p.tables[table] for p in parsed if table in p.tables]
                if parts:
                    _insert(con, table, pa.concat_tables(parts))
            studies = {p.study: str(p.result.run_dir.parent) for p in parsed if p.study}
            for name, root in studies.items():
                self._touch_study(name, runs_root=root)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            con.unregister("_ids")

    def ingest_study(self, study_name: str, runs_root: str | Path, force: bool = False,
                     progress: bool = False) -> CollectSummary:
        """Collect a study: `runs_root/<study_name>/` if that folder exists, else every run under
        `runs_root` whose run.json names the study (runs naming none are tagged with it)."""
        root = Path(runs_root)
        sub = root / study_name
        base = sub if sub.is_dir() else root
        return self.ingest_runs([base], study=study_name, force=force, progress=progress)

    def delete_run(self, run_id: str) -> None:
        """Remove one run and its records (e.g. a run collected by mistake)."""
        self._need_writer()

        def delete():
            for table in CHILD_TABLES + ("runs",):
                self.con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])

        self._in_transaction(delete)

    def _in_transaction(self, fn, *args) -> None:
        self.con.execute("BEGIN")
        try:
            fn(*args)
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def _touch_study(self, study: str, runs_root: str, set_root: bool = False) -> None:
        """Upsert the study row (inside the caller's transaction). runs_root: the folder the
        study was collected from (set_root) or, until one is known, the first run's parent."""
        n = self._one("SELECT count(*) FROM runs WHERE study = ?", [study])[0]
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        self.con.execute(
            """INSERT INTO studies VALUES (?, ?, ?, ?, ?)
               ON CONFLICT (study) DO UPDATE SET runs = excluded.runs,
                 collected_at = excluded.collected_at,
                 runs_root = %s""" % ("excluded.runs_root" if set_root else
                                      "coalesce(studies.runs_root, excluded.runs_root)"),
            [study, runs_root, n, now, now])

    def _run_row(self, meta: dict, run_id: str, study: str | None, run_dir: Path, fp: str,
                 ranks: int) -> pa.Table:
        config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
        extra: dict[str, Any] = {k: v for k, v in meta.items() if k not in _RUN_JSON_KEYS}
        if meta.get("config") is not None and not isinstance(meta.get("config"), dict):
            extra["config"] = meta["config"]
        raw: dict[str, Any] = {
            "run_id": run_id, "study": study,
            **_flatten_config(config),
            "status": meta.get("status"), "reason": meta.get("reason"),
            "simulated": bool(meta.get("simulated", False)),
            "started_at": meta.get("started_at"), "ended_at": meta.get("ended_at"),
            "wall_s": meta.get("wall_s"), "ranks": ranks,
            "config": config or None, "config_hash": meta.get("config_hash"),
            "timings": meta.get("timings"), "versions": meta.get("versions"),
            "host": meta.get("host"), "seeds": meta.get("seeds"),
            "run_dir": str(run_dir.resolve()), "fingerprint": fp,
            "collected_at": datetime.now(timezone.utc).timestamp(),
        }
        if raw["wall_s"] is None and isinstance(meta.get("started_at"), (int, float)) \
                and isinstance(meta.get("ended_at"), (int, float)):
            raw["wall_s"] = meta["ended_at"] - meta["started_at"]
        cols: dict[str, pa.Array] = {}
        for name, kind in RUN_COLUMNS.items():
            if name == "extra":
                continue
            v = raw.get(name)
            c = None if kind == "json" and v is None else _coerce(v, kind)
            if c is _MISSING:
                extra[name] = v
                c = None
            cols[name] = pa.array([c], _ARROW_TYPE[kind])
        cols["extra"] = pa.array(
            [json.dumps(extra, default=str, sort_keys=True) if extra else None], pa.string())
        return pa.table(cols)

    # reading
    def query(self, sql: str, params: list | dict | None = None):
        """Runs SQL, returns a pandas DataFrame (duckdb.Error on bad SQL)."""
        return self.con.execute(sql, params).df()

    def scalar(self, sql: str, params: list | dict | None = None) -> Any:
        """The first value of the first row (None when there is no row)."""
        rows = self.con.execute(sql, params).fetchall()
        return rows[0][0] if rows else None

    def relation(self, sql: str) -> duckdb.DuckDBPyRelation:
        """Runs SQL lazily as a DuckDB relation (valid while the store is open)."""
        return self.con.sql(sql)

    def counts(self) -> dict[str, int]:
        """Rows per table."""
        return {t: self._one(f"SELECT count(*) FROM {t}")[0] for t in TABLES}

    def _one(self, sql: str, params: list | None = None) -> tuple | None:
        """First row or None. (duckdb 2 refuses new work on a connection while an execute()
        result is unfinished, so results are always read to the end.)"""
        rows = self.con.execute(sql, params).fetchall()
        return rows[0] if rows else None

    def export_parquet(self, out_dir: str | Path) -> dict[str, Path]:
        """Writes every table to `<out_dir>/<table>.parquet` (zstd); returns table -> path."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        order = {"studies": "study", "runs": "run_id", **{
            t: f'run_id, rank, "{ROW_KEY[t]}"' for t in CHILD_TABLES}}
        paths = {}
        for t in TABLES:
            p = out / f"{t}.parquet"
            quoted = str(p).replace("'", "''")
            self.con.execute(f"COPY (SELECT * FROM {t} ORDER BY {order[t]}) TO '{quoted}' "
                             "(FORMAT parquet, COMPRESSION zstd)")
            paths[t] = p
        return paths

    def _need_writer(self) -> None:
        if self.read_only:
            raise ValueError(f"{self.path} is open read-only; open ResultsStore(path) to write")


@dataclass
class _Parsed:
    """A run read from disk, ready to be written."""

    result: IngestResult
    run_row: pa.Table
    tables: dict[str, pa.Table]
    study: str | None

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.tables.values())


def _insert(con: duckdb.DuckDBPyConnection, table: str, data: pa.Table) -> None:
    con.register("_ingest", data)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _ingest")
    finally:
        con.unregister("_ingest")


def _flatten_config(config: dict) -> dict[str, Any]:
    out = {name: _dig(config, path) for name, _, path in CONFIG_COLUMNS}
    # `model` is the decision model: the agent's LLM, or a classifier's name. Every config
    # carries agent.model.name (a default), so for other policies it would only mislead.
    policy = out.get("policy") or ""
    if isinstance(policy, str) and policy.startswith("classifier:"):
        out["model"] = policy.split(":", 1)[1]
    elif policy != "agent":
        out["model"] = None
    return out


def _dedupe(records: list[dict], key: str) -> list[dict]:
    """Last record per key wins (a resumed writer may repeat one); records without key stay."""
    seen: dict[Any, int] = {}
    for i, r in enumerate(records):
        k = r.get(key)
        if k is not None:
            try:
                seen[k] = i
            except TypeError:  # unhashable key value: keep the record
                pass
    if len(seen) == sum(r.get(key) is not None for r in records):
        return records
    keep = set(seen.values())
    return [r for i, r in enumerate(records)
            if r.get(key) is None or i in keep or not _hashable(r.get(key))]


def _hashable(x: Any) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def _run_json_study(run_dir: Path) -> str | None:
    try:
        meta = json.loads((run_dir / "run.json").read_text())
        return meta.get("study") if isinstance(meta, dict) else None
    except (OSError, json.JSONDecodeError):
        return None


class _NoBar:
    def advance(self) -> None:
        pass

    def stop(self) -> None:
        pass


class _Bar:
    def __init__(self, total: int):
        from rich.progress import Progress

        self._p = Progress(transient=True)
        self._p.start()
        self._task = self._p.add_task("collecting runs", total=total)

    def advance(self) -> None:
        self._p.advance(self._task)

    def stop(self) -> None:
        self._p.stop()


def _progress(enabled: bool, total: int):
    return _Bar(total) if enabled and total > 1 else _NoBar()
