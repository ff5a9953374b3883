"""Results store: run directories collected into one DuckDB file, named queries, a report.

    store.py    ResultsStore: idempotent ingest (one writer, file-locked), query, Parquet
    schema.py   tables and column kinds (the record tables' columns: rudder.records' fields), DDL
    coerce.py   record values into typed columns, the rest into `extra`
    rundirs.py  finding run directories, reading their files, fingerprints
    locking.py  the writer/reader file lock;  progress.py  the collect progress bar
    queries.py  named example queries (speedup, remote_rows, hit_rate, pass_at_1, ...)
    report.py   write_report(db, out_dir): report.md with tables and PNG plots
    cli.py      `rudder collect | query | report | export`

Nothing is imported here eagerly, so `rudder --help` does not pay for duckdb/pandas.
"""
from __future__ import annotations

__all__ = ["ResultsStore", "find_run_dirs", "write_report"]


def __getattr__(name: str):
    if name in ("ResultsStore", "find_run_dirs"):
        from rudder.results import store

        return getattr(store, name)
    if name == "write_report":
        from rudder.results.report import write_report

        return write_report
    raise AttributeError(name)
