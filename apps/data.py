"""Data apps: stage a dataset, partition it. Both reuse what is already there and valid."""
from __future__ import annotations


def stage_dataset(name: str, root: str,
                  parsl_resource_specification: dict = {}) -> dict:  # noqa: B006 (Parsl reads it)
    """Parsl app: generate/import dataset `name` into `root`."""
    from rudder.workflow.tasks import stage_dataset as stage

    return stage(name, root)


def partition_graph(name: str, num_parts: int, method: str, balance_train: bool,
                    balance_edges: bool, root: str, feature_dtype: str = "float32", inputs=(),
                    parsl_resource_specification: dict = {}) -> dict:  # noqa: B006
    """Parsl app: partition `name` into `num_parts` (after `inputs`: its stage_dataset)."""
    from rudder.workflow.tasks import partition_graph as part

    return part(name, num_parts, method, balance_train, balance_edges, root, feature_dtype)
