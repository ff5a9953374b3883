"""The training app: one run (DGL servers + agent service + trainers on `machines` machines)."""
from __future__ import annotations


def train_block(config: dict, run_id: str, study: str, launch: dict | None = None,
                timeout_s: float | None = None, cwd: str | None = None, rerun: bool = False,
                inputs=(),
                parsl_resource_specification: dict = {}) -> dict:  # noqa: B006 (Parsl reads it)
    """Parsl app: one run in a subprocess (a crashing run cannot take the worker down); raises
    RunFailed when the run did not complete, so Parsl retries apply. `inputs`: its partition;
    cwd: where relative paths of the config resolve (the study's folder; None = the worker's).
    parsl_resource_specification: on MPI executors, {num_nodes: machines, ...}: the nodes of
    this run (PARSL_MPI_NODELIST). rerun: run it even if complete (the study's --rerun)."""
    from rudder.workflow.tasks import run_block

    return run_block(config, run_id, study, launch=launch, timeout_s=timeout_s, cwd=cwd,
                     rerun=rerun)
