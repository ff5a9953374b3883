"""`rudder collect | query | report | export`: the results store from the command line.

    rudder collect RUNS_DIR... [--db results.duckdb] [--study NAME] [--force]
    rudder query "SQL" [--db results.duckdb] [--csv]
    rudder query --named speedup [--study NAME] [--csv] [--sql]
    rudder query --list
    rudder report [--db results.duckdb] [--out report/] [--study NAME]
    rudder export --parquet DIR [--db results.duckdb]

Exit codes: 0 ok; 1 collect finished but some run directories could not be read; 2 bad input
(missing database, bad SQL, unknown named query, no run directories).
"""
from __future__ import annotations

import argparse
import sys

from rudder.arg_types import at_least, positive

DEFAULT_DB = "results.duckdb"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "collect", help="collect run directories into the results database (idempotent)",
        description="Collect run directories (or folders holding them) into a DuckDB file. "
                    "Re-collecting a run replaces its rows; unchanged runs are skipped.")
    p.add_argument("runs_dirs", nargs="+", metavar="RUNS_DIR",
                   help="a run directory (with run.json) or a folder of run directories")
    p.add_argument("--db", default=DEFAULT_DB, help=f"results database (default {DEFAULT_DB})")
    p.add_argument("--study", help="tag runs naming no study with NAME; skip runs of other "
                                   "studies")
    p.add_argument("--force", action="store_true", help="re-ingest unchanged runs too")
    p.add_argument("--lock-timeout", type=at_least(float, 0), default=600.0, metavar="S",
                   help="seconds to wait for another collector to finish (default 600)")
    p.set_defaults(func=cmd_collect)

    p = subparsers.add_parser(
        "query", help="SQL over the results database, or a named query",
        description="Run SQL (read-only) over the results database and print a table.")
    p.add_argument("sql", nargs="?", help="SQL to run (tables: studies, runs, epochs, "
                                          "minibatches, windows, decisions)")
    p.add_argument("--db", default=DEFAULT_DB, help=f"results database (default {DEFAULT_DB})")
    p.add_argument("--named", metavar="NAME", help="run a named query (see --list)")
    p.add_argument("--list", action="store_true", help="list the named queries")
    p.add_argument("--study", help="named queries: only the runs of this study")
    p.add_argument("--sql", dest="show_sql", action="store_true",
                   help="print the named query's SQL instead of running it")
    p.add_argument("--csv", action="store_true", help="CSV on stdout instead of a table")
    p.add_argument("--max-rows", type=positive(int), default=200, metavar="N",
                   help="table output: rows shown (default 200; --csv prints all)")
    p.set_defaults(func=cmd_query)

    p = subparsers.add_parser("report", help="Markdown report with tables and PNG plots",
                              description="Write report.md and plots from the results database.")
    p.add_argument("--db", default=DEFAULT_DB, help=f"results database (default {DEFAULT_DB})")
    p.add_argument("--out", default="report", help="output folder (default report/)")
    p.add_argument("--study", help="only the runs of this study")
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser("export", help="export the results tables (Parquet)",
                              description="Write every table of the results database to files.")
    p.add_argument("--parquet", required=True, metavar="DIR",
                   help="folder for <table>.parquet files")
    p.add_argument("--db", default=DEFAULT_DB, help=f"results database (default {DEFAULT_DB})")
    p.set_defaults(func=cmd_export)


def _err(cmd: str, msg: str) -> int:
    print(f"rudder {cmd}: error: {msg}", file=sys.stderr)
    return 2


def cmd_collect(args: argparse.Namespace) -> int:
    from rudder.results.store import ResultsStore, StoreLockedError, find_run_dirs

    try:
        run_dirs = find_run_dirs(args.runs_dirs)
        if not run_dirs:
            return _err("collect", "no run directories (with run.json) under "
                        + ", ".join(args.runs_dirs))
    except FileNotFoundError as exc:
        return _err("collect", str(exc))
    from rudder.cluster.attempts import reconcile_run

    for d in run_dirs:  # a run left `running` by a killed owner: failed, interrupted
        reconcile_run(d)
    try:
        store = ResultsStore(args.db, lock_timeout_s=args.lock_timeout)
    except (StoreLockedError, ValueError) as exc:
        return _err("collect", str(exc))
    with store:
        summary = store.ingest_runs(args.runs_dirs, study=args.study, force=args.force,
                                    progress=sys.stderr.isatty())
        counts = store.counts()
    statuses: dict[str, int] = {}
    for r in summary.results:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    by_status = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "none"
    print(f"collected {summary.ingested} runs, {summary.skipped} unchanged ({by_status}) "
          f"into {args.db}: {counts['runs']} runs, {counts['minibatches']} minibatch rows, "
          f"{counts['decisions']} decisions in total")
    for d, msg in summary.errors:
        print(f"rudder collect: cannot read {d}: {msg}", file=sys.stderr)
    return 1 if summary.errors else 0


def cmd_query(args: argparse.Namespace) -> int:
    from rudder.results import queries

    if args.list:
        for q in queries.NAMED.values():
            print(f"{q.name:12s} {q.description}")
        return 0
    if args.named and args.sql:
        return _err("query", "give SQL or --named NAME, not both")
    if args.named:
        try:
            sql = queries.render(args.named, args.study)
        except queries.UnknownQueryError as exc:
            return _err("query", str(exc))
        if args.show_sql:
            print(sql)
            return 0
    elif args.sql:
        sql = args.sql
    else:
        return _err("query", "give SQL, --named NAME or --list")

    import duckdb

    from rudder.results.store import ResultsStore, StoreLockedError

    try:
        store = ResultsStore(args.db, read_only=True)
    except (FileNotFoundError, StoreLockedError, ValueError) as exc:
        return _err("query", str(exc))
    with store:
        try:
            store.check_study(args.study if args.named else None)
            df = store.query(sql)
        except ValueError as exc:
            return _err("query", str(exc))
        except duckdb.Error as exc:
            return _err("query", f"SQL failed: {exc}")
    if args.csv:
        df.to_csv(sys.stdout, index=False)
    else:
        _print_table(df, args.max_rows, title=args.named)
    return 0


def _print_table(df, max_rows: int, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from rudder.results.report import fmt_cell

    table = Table(title=title, show_lines=False)
    for c in df.columns:
        numeric = df[c].dtype.kind in "iuf"
        table.add_column(str(c), justify="right" if numeric else "left", overflow="fold")
    for row in df.head(max_rows).itertuples(index=False):
        table.add_row(*(fmt_cell(v) for v in row))
    console = Console()
    if not console.is_terminal:  # piped or captured: don't fold columns to 80 characters
        console = Console(width=max(80, min(400, 3 + sum(
            3 + max([len(str(c))] + [len(fmt_cell(v)) for v in df[c].head(max_rows)])
            for c in df.columns))))
    console.print(table)
    if len(df) > max_rows:
        console.print(f"({len(df) - max_rows} more rows; --max-rows N or --csv for all)")
    elif df.empty:
        console.print("(no rows)")


def cmd_report(args: argparse.Namespace) -> int:
    from rudder.results.report import write_report
    from rudder.results.store import ResultsStore, StoreLockedError

    try:
        with ResultsStore(args.db, read_only=True) as store:
            store.check_study(args.study)
        path = write_report(args.db, args.out, study=args.study)
    except (FileNotFoundError, StoreLockedError, ValueError) as exc:
        return _err("report", str(exc))
    print(f"wrote {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from rudder.results.store import ResultsStore, StoreLockedError

    try:
        store = ResultsStore(args.db, read_only=True)
    except (FileNotFoundError, StoreLockedError, ValueError) as exc:
        return _err("export", str(exc))
    with store:
        paths = store.export_parquet(args.parquet)
        counts = store.counts()
    for t, p in paths.items():
        print(f"{p}  ({counts[t]} rows)")
    return 0
