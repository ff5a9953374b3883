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

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import duckdb
import pyarrow as pa

from rudder.records import read_run
from rudder.results.coerce import MISSING, coerce, decision_outcomes, records_table
from rudder.results.locking import StoreLockedError, acquire, release
from rudder.results.progress import progress as _progress
from rudder.results.rundirs import (INGEST_VERSION, dedupe, find_run_dirs, fingerprint,  # noqa: F401
                                    rank_files, read_records, run_json_study)
from rudder.results.schema import (ARROW_TYPE, CHILD_TABLES, FIELD_KINDS, ROW_KEY, RUN_COLUMNS,  # noqa: F401
                                   RUN_JSON_KEYS, SCHEMA_VERSION, TABLES, ddl, flatten_config,
                                   migration)

log = logging.getLogger(__name__)

BATCH_RUNS = 64  # runs written per transaction by ingest_runs ...
BATCH_ROWS = 2_000_000  # ... or fewer, when their records add up to this many rows


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
        self._lock = acquire(lock_path, exclusive=not read_only, timeout_s=lock_timeout_s)
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
        lock, self._lock = self._lock, None
        release(lock)

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
            for stmt in ddl():
                self.con.execute(stmt)
            row = self._one("SELECT value FROM meta WHERE key = 'schema_version'")
            if row is None:
                self.con.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                                 [str(SCHEMA_VERSION)])
            elif row[0] != str(SCHEMA_VERSION):
                stmts = migration(int(row[0])) if row[0].isdigit() and int(row[0]) < SCHEMA_VERSION else None
                if stmts is not None:  # an older file that only lacks columns: add them
                    log.info("%s: results schema v%s -> v%d", self.path, row[0], SCHEMA_VERSION)
                    for stmt in stmts:
                        self.con.execute(stmt)
                    self.con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                                     [str(SCHEMA_VERSION)])
                    self.con.execute("COMMIT")
                    return
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
                        named = run_json_study(d)
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
            meta = read_run(run_dir)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{run_json}: unreadable JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise ValueError(f"{run_json}: top level is not an object")
        run_id = str(meta.get("run_id") or run_dir.name)
        study = meta.get("study") or study

        files = rank_files(run_dir)
        all_files = [run_json] + [p for per in files.values() for p in per.values()]
        fp = fingerprint(run_dir, all_files, study)
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
                recs = [r for r in read_records(per_rank[rank]) if isinstance(r, dict)]
                if table == "decisions":
                    recs = [decision_outcomes(r) for r in recs]
                rows.extend((rank, r) for r in dedupe(recs, ROW_KEY[table]))
            if rows:
                tables[table] = records_table(run_id, rows, FIELD_KINDS[table])
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
        extra: dict[str, Any] = {k: v for k, v in meta.items() if k not in RUN_JSON_KEYS}
        if meta.get("config") is not None and not isinstance(meta.get("config"), dict):
            extra["config"] = meta["config"]
        raw: dict[str, Any] = {
            "run_id": run_id, "study": study,
            **flatten_config(config),
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
            c = None if kind == "json" and v is None else coerce(v, kind)
            if c is MISSING:
                extra[name] = v
                c = None
            cols[name] = pa.array([c], ARROW_TYPE[kind])
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

    def check_study(self, study: str | None) -> None:
        """ValueError naming the studies present when `study` has no run here (a typo would
        otherwise give an empty report or table)."""
        if study is None or self._one("SELECT 1 FROM runs WHERE study = ? LIMIT 1", [study]):
            return
        have = [r[0] for r in self.con.execute(
            "SELECT DISTINCT study FROM runs WHERE study IS NOT NULL ORDER BY 1").fetchall()]
        raise ValueError(f"no runs of study {study!r} in {self.path}; its studies: "
                         f"{', '.join(have) or 'none (runs collected without --study)'}")

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
