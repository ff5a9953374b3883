"""Datasets: synthetic generation, staging on disk, importers and DistDGL partitioning.

    from rudder.data import stage, load_graph
    from rudder.data.partition import partition
    stage("synth-small")                     # -> Path data/synth-small
    info = partition("synth-small", 2)       # -> PartitionInfo(part_config, manifest, dir)

(`partition` is not re-exported here: `rudder.data.partition` stays the module.)
Importing this package is cheap (numpy only); torch/dgl load when a function needs them.
"""
from rudder.data.importers import LOADERS, import_edge_list, load_dataset
from rudder.data.partition import PartitionInfo, list_partitions
from rudder.data.store import list_datasets, load_graph, read_meta, stage
from rudder.data.synthetic import PRESETS, SyntheticSpec, generate

__all__ = [
    "LOADERS", "PRESETS", "PartitionInfo", "SyntheticSpec", "generate", "import_edge_list",
    "list_datasets", "list_partitions", "load_dataset", "load_graph", "read_meta", "stage",
]
