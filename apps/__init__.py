"""Parsl apps of a Rudder study: thin wrappers (a few lines each) around rudder.workflow.tasks.

    stage_dataset    dataset -> data/<name>/               (once per dataset)
    partition_graph  dataset, machines -> data/<name>/parts (once per dataset x machines)
    train_block      one run, in its own process           (per dataset x machines x policy x ...)
    collect_metrics  run dir -> results.duckdb             (one at a time: the single writer)
    report           results.duckdb -> tables + plots      (once, at the end)

The functions are plain Python; `make_apps(route)` turns them into Parsl python_apps bound to
the executor each should run on (`route(app_name) -> label`, from the execution config). Workers
import this package by name, so the repository root must be on their PYTHONPATH
(rudder.workflow.execution.prepare_environment does it for local and Slurm workers; a Globus
Compute endpoint's worker_init must do it).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

from apps.data import partition_graph, stage_dataset
from apps.results import collect_metrics, report
from apps.train import train_block

APPS = {
    "stage": stage_dataset,
    "partition": partition_graph,
    "train": train_block,
    "collect": collect_metrics,
    "report": report,
}


def make_apps(route: Callable[[str], str], overrides: dict[str, Callable] | None = None):
    """Parsl apps for the loaded DataFlowKernel: .stage, .partition, .train, .collect, .report.
    `overrides` swaps a function (tests inject a fake train)."""
    from parsl import python_app

    funcs = {**APPS, **(overrides or {})}
    return SimpleNamespace(**{name: python_app(fn, executors=[route(name)])
                              for name, fn in funcs.items()})


__all__ = ["APPS", "make_apps", "stage_dataset", "partition_graph", "train_block",
           "collect_metrics", "report"]
