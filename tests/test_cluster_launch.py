"""How a run starts its machines is a value (execution.launch), handed from the study through
the train task and the run's process to make_cluster; nothing is read from the environment."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rudder.cluster import ClusterError, ClusterSpec, LocalCluster
from rudder.cluster.launch import Launch, make_cluster
from rudder.cluster.slurm import SlurmCluster

REPO = Path(__file__).resolve().parents[1]


def test_launch_values():
    launch = Launch.of({"type": "slurm", "ifname": "hsn0", "srun_args": "-c 128 --cpu-bind=none"})
    assert launch.srun_args == ["-c", "128", "--cpu-bind=none"]
    assert Launch.of(launch.to_dict()) == launch  # the dict crosses process boundaries
    assert Launch.of(None) == Launch() and Launch().type == "local"
    with pytest.raises(ClusterError, match="launch type 'mpi'; valid: local, slurm"):
        Launch.of({"type": "mpi"})
    with pytest.raises(ClusterError, match="unknown key\\(s\\) ifnam"):
        Launch.of({"type": "slurm", "ifnam": "hsn0"})


def test_make_cluster_follows_the_value_not_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RUDDER_LAUNCHER", "slurm")  # the old switch: ignored now
    monkeypatch.setenv("RUDDER_IFNAME", "eth9")
    local = make_cluster(ClusterSpec(machines=1), tmp_path / "a")
    assert type(local) is LocalCluster
    slurm = make_cluster(ClusterSpec(machines=1), tmp_path / "b",
                         {"type": "slurm", "ifname": "hsn0", "srun_args": "-c 64"})
    assert isinstance(slurm, SlurmCluster)
    assert slurm.ifname == "hsn0" and slurm.srun_args == ["-c", "64"]
    assert make_cluster(ClusterSpec(machines=1), tmp_path / "c", {"type": "slurm"}).ifname is None


def test_block_reads_the_launch_from_its_request(tmp_path):
    """The run's process gets {config, launch} on stdin; a bad launch is a config error (2)
    before anything starts."""
    from rudder.config import RunConfig

    cfg = RunConfig.model_validate({"runs_dir": str(tmp_path / "runs")}).model_dump(mode="json")
    proc = subprocess.run([sys.executable, "-m", "rudder.workflow.block", "--run-id", "r"],
                          input=json.dumps({"config": cfg, "launch": {"type": "pbs"}}),
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "launch type 'pbs'" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "rudder.workflow.block", "--run-id", "r"],
                          input=json.dumps(cfg), capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 2 and '"config"' in proc.stderr
    assert not (tmp_path / "runs" / "r").exists()
