"""How a run starts its machines, as a value: `Launch` travels from the execution config
(`execution.launch`) through the train app and the run's subprocess to `make_cluster`, as plain
data (a dict on the wire). Nothing is read from the environment.

    local  LocalCluster: one network namespace per emulated machine (root), else one machine
           on this host's loopback
    slurm  SlurmCluster: one machine per Slurm node of the allocation, started by one srun step
"""
from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rudder.cluster.local import ClusterError, ClusterSpec, LocalCluster

LAUNCHERS = ("local", "slurm")


@dataclass(frozen=True)
class Launch:
    type: str = "local"  # local | slurm
    ifname: str | None = None  # slurm: the interface in DGL's ip_config (hsn0 on Perlmutter)
    srun_args: list[str] = field(default_factory=list)  # slurm: extra options of the machines' srun
    # local: the folder of the study's per-node agent services (rudder.agent.service; set by the
    # study for its block, not by users); None: a run starts its own agent service
    agent_node_dir: str | None = None

    def __post_init__(self) -> None:
        if self.type not in LAUNCHERS:
            raise ClusterError(f"launch type {self.type!r}; valid: {', '.join(LAUNCHERS)}")
        if isinstance(self.srun_args, str):  # YAML gives one string
            object.__setattr__(self, "srun_args", shlex.split(self.srun_args))

    @classmethod
    def of(cls, value: "Launch | dict[str, Any] | None") -> "Launch":
        """From a Launch, a dict (execution.launch dumped) or None (local)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ClusterError(f"launch must be a mapping, got {type(value).__name__}")
        unknown = set(value) - {"type", "ifname", "srun_args", "agent_node_dir"}
        if unknown:
            raise ClusterError(f"launch: unknown key(s) {', '.join(sorted(unknown))}; "
                               "valid: type, ifname, srun_args, agent_node_dir")
        return cls(type=value.get("type") or "local", ifname=value.get("ifname") or None,
                   srun_args=value.get("srun_args") or [],
                   agent_node_dir=value.get("agent_node_dir") or None)

    def to_dict(self) -> dict:
        return asdict(self)


def make_cluster(spec: ClusterSpec, run_dir: str | Path,
                 launch: "Launch | dict | None" = None) -> LocalCluster:
    """The cluster a run uses: SlurmCluster for launch type slurm, else LocalCluster."""
    launch = Launch.of(launch)
    if launch.type == "slurm":
        from rudder.cluster.slurm import SlurmCluster

        return SlurmCluster(spec, run_dir, ifname=launch.ifname, srun_args=launch.srun_args)
    return LocalCluster(spec, run_dir)
