#!/usr/bin/env python
"""Run a Rudder scaling study as a Parsl DAG.

    python workflows/scaling_study.py                  # the embedded default study, locally
    python workflows/scaling_study.py --dry-run        # print the DAG, run nothing
    python workflows/scaling_study.py --study configs/studies/my.yaml \\
        --execution configs/perlmutter/gpu.yaml        # on Perlmutter (inside or from a login node)
    python workflows/scaling_study.py --execution configs/perlmutter/gpu.yaml \\
        --endpoint 4b116d3c-...                        # through a Globus Compute endpoint

Each dataset is staged once, each (dataset, machines) partitioned once; the runs go as fast as
the executors allow; each run is collected into DuckDB as it ends (one writer at a time); the
report is written at the end. Rerunning the same command skips runs that completed and reruns
those that failed (runs are keyed by their config hash). Exit code: 0 when every run completed,
1 when some failed, 2 on a bad config or an unusable Globus Compute, 130 when interrupted.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python workflows/scaling_study.py` from anywhere
    sys.path.insert(0, str(REPO))

DEFAULT_STUDY = REPO / "configs" / "studies" / "local_default.yaml"
DEFAULT_EXECUTION = REPO / "configs" / "local.yaml"

log = logging.getLogger("rudder.workflow")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scaling_study.py",
        description="Run a Rudder scaling study (datasets x machines x trainers x policies x "
                    "repeats) as a Parsl DAG: stage -> partition -> train -> collect -> report.",
        epilog="Study files: configs/studies/*.yaml. Execution files: configs/local.yaml, "
               "configs/perlmutter/{cpu,gpu}.yaml. Results: SQL over the DuckDB file, e.g. "
               "`rudder query --db runs/<study>/results.duckdb --named speedup`.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", default=str(DEFAULT_STUDY), metavar="FILE",
                   help="study YAML (default: %(default)s)")
    p.add_argument("--execution", default=str(DEFAULT_EXECUTION), metavar="FILE",
                   help="execution YAML: where and how runs execute, plus run defaults "
                        "(default: %(default)s)")
    p.add_argument("--runs-dir", metavar="DIR",
                   help="run directories go to DIR/<study>/<run id>/ (default: the execution "
                        "file's runs_dir, else runs)")
    p.add_argument("--db", metavar="FILE",
                   help="DuckDB results file (default: RUNS_DIR/<study>/results.duckdb)")
    p.add_argument("--report-dir", metavar="DIR",
                   help="report folder (default: RUNS_DIR/<study>/report)")
    p.add_argument("--no-report", action="store_true", help="skip the report at the end")
    p.add_argument("--dry-run", action="store_true", help="print the DAG and exit")
    p.add_argument("--endpoint", metavar="UUID",
                   help="submit every app to this Globus Compute endpoint (paths then name "
                        "the endpoint's filesystem; use absolute ones)")
    p.add_argument("--retries", type=int, metavar="N",
                   help="Parsl retries of a failed app (default: the execution file's)")
    p.add_argument("--rerun", action="store_true",
                   help="run every run again, even those already complete")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                   help="a ${NAME} of the execution file (account, QOS, ...), instead of the "
                        "environment (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a run config key for every run, e.g. --set train.epochs=1 "
                        "(repeatable; part of each run's config hash)")
    p.add_argument("--no-live", action="store_true",
                   help="log lines instead of the live panel (automatic when not a terminal)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def parse_sets(items: list[str]) -> dict:
    from rudder.run_cli import parse_overrides  # the same KEY=VALUE syntax as `rudder run --set`

    return parse_overrides(items)


def parse_vars(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--var {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def load_inputs(args):
    """(study, execution config) from the files and flags; ConfigError on anything invalid,
    including a study that does not fit its execution (rudder.workflow.fit). Sets
    args.runs_dir to the runs root used (--runs-dir, else the execution file's runs_dir)."""
    from rudder.config import load_yaml
    from rudder.workflow.execution import split_execution_file, with_endpoint
    from rudder.workflow.fit import fit_study
    from rudder.workflow.study import expand, parse_study, set_dotted

    sets = parse_sets(args.set)
    provided = set(sets) | ({"runs_dir"} if args.runs_dir else set())  # dotted keys
    ex, base = split_execution_file(args.execution, parse_vars(args.var), provided)
    runs_dir = base.pop("runs_dir", None)
    args.runs_dir = args.runs_dir or runs_dir or "runs"
    if args.retries is not None:
        if args.retries < 0:
            raise ValueError("--retries must be >= 0")
        ex = ex.model_copy(update={"retries": args.retries})
    cfg = parse_study(load_yaml(args.study), args.study)
    run = dict(cfg.run)
    for key, value in sets.items():
        set_dotted(run, key, value)
    cfg = cfg.model_copy(update={"run": run})
    study = expand(cfg, base, args.study, runs_dir=args.runs_dir)
    # the same values make the endpoint's blocks (with_endpoint); locally the NodeGate admits runs
    ex = fit_study(ex, study, gated=not args.endpoint)
    if args.endpoint:
        ex = with_endpoint(ex, args.endpoint)
    return study, ex


def run_study(study, ex, runs_dir: str, db: str, report_dir: str | None, *,
              remote: bool = False, rerun: bool = False, execution_source: str = "",
              app_overrides: dict | None = None, view=None, globus_executor_factory=None):
    """Builds the DAG, runs it with Parsl, returns the StudyDAG (states, summary). Parsl's
    logs go to the execution's parsl_run_dir, else RUNS_DIR/<study>/runinfo (./runinfo with
    an endpoint)."""
    import parsl

    from apps import make_apps
    from rudder.workflow.dag import StudyDAG
    from rudder.workflow.execution import build_parsl_config, prepare_environment
    from rudder.workflow.gate import gate_apps

    from rudder.agent.service import stop_node_services

    # One agent service per node for the whole study (the first agent run on a node starts it,
    # the others use it): dag.agent_node_dir, handed to each run in its launch.
    dag = StudyDAG(study, ex, runs_dir, db, report_dir, remote=remote, rerun=rerun)
    prepare_environment(REPO)
    # (with an endpoint RUNS_DIR names the endpoint's filesystem: Parsl's logs stay here)
    parsl_dir = ex.parsl_run_dir or ("runinfo" if remote else str(Path(runs_dir) / study.name / "runinfo"))
    config = build_parsl_config(ex, run_dir=parsl_dir, globus_executor_factory=globus_executor_factory)
    dfk = parsl.load(config)
    try:
        # MPI executors: tasks reach Parsl only when their nodes fit (its backlog drops results)
        apps = gate_apps(make_apps(ex.route, app_overrides), ex)
        dag.submit(apps)
        dag.watch(apps, view)
    finally:
        dfk.cleanup()
        parsl.clear()
        if dag.agent_node_dir:  # the block has ended: its node services go with it
            if stop_node_services(dag.agent_node_dir):
                log.info("stopped the agent node service(s) in %s", dag.agent_node_dir)
    return dag


def setup_logging(verbose: bool) -> None:
    """Our loggers at INFO (DEBUG with -v) on stderr; everything else (Parsl logs at DEBUG
    into RUNS_DIR/<study>/runinfo/ itself) only from WARNING up."""
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.StreamHandler()
    root.setLevel(logging.WARNING)
    root.setFormatter(fmt)
    # Parsl logs a failed task with its traceback at ERROR: the summary says it in one line
    root.addFilter(lambda r: not r.name.startswith("parsl") or r.levelno >= logging.CRITICAL)
    logging.getLogger().addHandler(root)
    ours = logging.StreamHandler()
    ours.setFormatter(fmt)
    rl = logging.getLogger("rudder")
    rl.addHandler(ours)
    rl.setLevel(logging.DEBUG if verbose else logging.INFO)
    rl.propagate = False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)

    from rich.console import Console

    from rudder.config import ConfigError

    console = Console()
    if not console.is_terminal:  # logs and CI: wide enough for the summary table
        console = Console(width=200)
    try:
        study, ex = load_inputs(args)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"scaling_study: {exc}", file=sys.stderr)
        return 2
    runs_dir = args.runs_dir  # resolved by load_inputs
    study_dir = Path(runs_dir) / study.name
    db = args.db or str(study_dir / "results.duckdb")
    report_dir = None if args.no_report else (args.report_dir or str(study_dir / "report"))
    remote = bool(args.endpoint) or ex.is_remote()

    from rudder.workflow.dag import StudyDAG

    if args.dry_run:
        dag = StudyDAG(study, ex, runs_dir, db, report_dir, remote=remote, rerun=args.rerun)
        print(dag.describe(args.execution))
        if remote:  # datasets, models and URLs are the endpoint's: not checkable from here
            print("inputs not checked here: the runs execute on the endpoint", file=sys.stderr)
            return 0
        from rudder.records import unwritable_folder
        from rudder.runner import preflight

        seen: set[str] = set()
        problems: dict[str, list[str]] = {}  # each problem once, with the runs it stops
        for run in study.runs:  # what `rudder run --dry-run` checks, once per distinct config
            key = run.config.model_dump_json()
            if key in seen:
                continue
            seen.add(key)
            for line in preflight(run.config):
                problems.setdefault(line, []).append(run.run_id)
        for line, ids in problems.items():
            which = f"run {ids[0]}" if len(ids) == 1 else \
                f"{len(ids)} runs ({', '.join(ids[:2])}{', ...' if len(ids) > 2 else ''})"
            print(f"scaling_study: error: {which}: {line}", file=sys.stderr)
        outputs = []  # where the results go must take them, or the study fails at its end
        why = "a folder, not a database file" if Path(db).is_dir() else unwritable_folder(Path(db).parent)
        if why:
            outputs.append(f"--db {db}: {why}")
        if report_dir and (why := unwritable_folder(report_dir)):
            outputs.append(f"--report-dir {report_dir}: {why}")
        for line in outputs:
            print(f"scaling_study: error: {line}", file=sys.stderr)
        return 2 if problems or outputs else 0
    if remote:
        from rudder.workflow.globus import GlobusUnavailable, check_login

        if not Path(runs_dir).is_absolute():
            log.warning("--runs-dir %s is relative: on the endpoint it resolves against the "
                        "engine's task working directory; give an absolute path ($SCRATCH/...)",
                        runs_dir)

        try:  # before Parsl starts anything: no prompt, no hang
            check_login()
        except GlobusUnavailable as exc:
            print(f"scaling_study: {exc}", file=sys.stderr)
            return 2

    from rudder.workflow.view import StudyView, summary_table

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    view = StudyView(console, live=False if args.no_live else None)
    try:
        with view:
            dag = run_study(study, ex, runs_dir, db, report_dir, remote=remote,
                            rerun=args.rerun, execution_source=args.execution, view=view)
    except KeyboardInterrupt as exc:
        print(f"scaling_study: interrupted ({exc or 'Ctrl-C'}); completed runs are kept, "
              "rerun the same command to resume", file=sys.stderr)
        return 130
    except Exception as exc:
        from rudder.workflow.globus import GlobusUnavailable

        if isinstance(exc, GlobusUnavailable):
            print(f"scaling_study: {exc}", file=sys.stderr)
            return 2
        raise
    console.print(summary_table(dag))
    c = dag.counts()
    console.print(f"{c['done']} done, {c['skipped']} skipped (complete earlier), "
                  f"{c['failed']} failed; results {db}"
                  + (f"; report {report_dir}/report.md" if report_dir and not dag.report_error
                     else ""), highlight=False)
    if not remote:
        dag.write_summary(study_dir / "study.json")
    return 0 if dag.ok else 1


if __name__ == "__main__":
    sys.exit(main())
