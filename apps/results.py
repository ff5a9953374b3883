"""Results apps: the single DuckDB writer (collect, one at a time) and the report."""
from __future__ import annotations


def collect_metrics(run_dir: str, db_path: str, inputs=(),
                    parsl_resource_specification: dict = {}) -> dict:  # noqa: B006
    """Parsl app: ingest one run directory (idempotent). `inputs`: the run, settled, and the
    previous collect (so collects never overlap, whatever the executor)."""
    from rudder.workflow.tasks import collect_run

    return collect_run(run_dir, db_path)


def report(db_path: str, out_dir: str, study: str | None = None, inputs=(),
           parsl_resource_specification: dict = {}) -> dict:  # noqa: B006
    """Parsl app: tables and plots of the database (after every collect)."""
    from rudder.workflow.tasks import write_report

    return write_report(db_path, out_dir, study)
