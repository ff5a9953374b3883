"""The Slurm path on a real one-node Slurm cluster started by the test (SLURM_CONF in a temp
dir, nothing under /etc): SlurmCluster sruns one machine supervisor per node; and a small study
goes Parsl MPIExecutor -> SlurmProvider -> sbatch -> srun -> DGL server + trainer, end to end;
and a Globus Compute engine runs its workers through the SlurmProvider.
Every daemon and job is stopped afterwards (scancel, daemons by pid, stray slurmstepd)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rudder.workflow.testcluster import SlurmTestCluster, missing_binaries

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(missing_binaries()), reason="Slurm binaries missing "
                       f"({', '.join(missing_binaries())}): run scripts/install_slurm.sh"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test cluster runs slurmd as root"),
]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    sc = SlurmTestCluster(tmp_path_factory.mktemp("slurm"))
    sc.start()
    try:
        yield sc
    finally:
        hard = sc.stop()
        assert sc.ctld.returncode is not None and sc.slurmd.returncode is not None
        assert not sc.stray_stepds(), "slurmstepd left behind"
        assert not hard or all(h.startswith("slurmstepd") for h in hard), hard


@pytest.mark.timeout(180)
def test_slurm_cluster_finds_its_nodes(slurm, tmp_path, monkeypatch):
    """Inside an allocation: nodes from SLURM_JOB_NODELIST (or PARSL_MPI_NODELIST), each node's
    address probed on the configured interface by one srun step; too few nodes is a clear error.
    (Running the supervisors is checked end to end below.)"""
    from rudder.cluster import ClusterSpec
    from rudder.cluster.launch import make_cluster
    from rudder.cluster.slurm import SlurmCluster, allocation_nodes

    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("SLURM_JOB_NODELIST", slurm.node)  # as inside sbatch/salloc
    monkeypatch.delenv("PARSL_MPI_NODELIST", raising=False)
    assert allocation_nodes() == [slurm.node]
    monkeypatch.setenv("PARSL_MPI_NODELIST", f"{slurm.node},other")  # the MPI executor's pick
    assert allocation_nodes() == [slurm.node, "other"]
    monkeypatch.delenv("PARSL_MPI_NODELIST")
    slurm_lo = {"type": "slurm", "ifname": "lo"}  # the execution config's launch, as data
    with make_cluster(ClusterSpec(machines=1, start_timeout_s=60), tmp_path / "run",
                      slurm_lo) as c:
        assert isinstance(c, SlurmCluster)
        assert c.hosts == [slurm.node]
        assert c.addresses == ["127.0.0.1"] and c.interfaces == ["lo"]
    with pytest.raises(Exception, match="interface 'nosuch0' has no IPv4 address"):
        with make_cluster(ClusterSpec(machines=1, start_timeout_s=60), tmp_path / "run1",
                          {"type": "slurm", "ifname": "nosuch0"}):
            pass
    with pytest.raises(Exception, match="2 machines asked but the allocation has 1 node"):
        with make_cluster(ClusterSpec(machines=2), tmp_path / "run2", slurm_lo):
            pass
    assert not isinstance(make_cluster(ClusterSpec(machines=1), tmp_path / "run3",
                                       {"type": "local"}), SlurmCluster)
    deadline = time.monotonic() + 30
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not slurm.jobs()


@pytest.mark.timeout(600)
def test_study_through_slurm_provider_end_to_end(slurm, tmp_path):
    """configs/slurm_test.yaml: MPIExecutor + SlurmProvider -> sbatch; the run sruns its
    machine; one real run (synth-tiny, 1 machine, 1 epoch) completes and is collected."""
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "slurm-e2e", "datasets": ["synth-tiny"], "machines": [1], "policies": ["static"],
        "run": {"train": {"epochs": 1, "eval_every": 0}, "dataset": {"root": str(tmp_path / "data")}}}))
    env = slurm.env()
    env.pop("SLURM_JOB_NODELIST", None)
    t0 = time.time()
    proc = subprocess.run([sys.executable, "workflows/scaling_study.py", "--study", str(study),
                           "--execution", "configs/slurm_test.yaml", "--runs-dir",
                           str(tmp_path / "runs"), "--no-live"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=540)
    wall = time.time() - t0
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((tmp_path / "runs" / "slurm-e2e" / "study.json").read_text())
    (run,) = summary["runs"]
    assert run["status"] == "done" and run["collected"] is True
    run_dir = tmp_path / "runs" / "slurm-e2e" / run["run_id"]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "complete"
    srun_log = (run_dir / "logs" / "srun.log").read_text()  # the machines came from srun
    assert "rudder.cluster.slurm node" in srun_log and "--ntasks-per-node=1" in srun_log
    sup = (run_dir / "logs" / "machine0.supervisor.log").read_text()
    assert f"node {slurm.node}: machine 0 of 1" in sup and "exit 0" in sup
    assert (run_dir / "ip_config.txt").read_text().startswith("127.0.0.1 ")
    print(f"slurm study wall {wall:.1f} s")
    deadline = time.monotonic() + 30  # the Parsl block was scancelled at cleanup
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not slurm.jobs(), slurm.jobs()


@pytest.mark.timeout(300)
def test_globus_engine_with_slurm_provider(slurm, tmp_path, monkeypatch):
    """The endpoint side on Slurm: a real GlobusComputeEngine whose SlurmProvider sbatches its
    workers; a task packed as the SDK packs it runs inside the job and its Result comes back."""
    from parsl.launchers import SrunLauncher
    from parsl.providers import SlurmProvider

    from apps import collect_metrics
    from rudder.workflow.execution import prepare_environment
    from rudder.workflow.globus import LocalEngineExecutor, start_local_engine

    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    prepare_environment(REPO)
    provider = SlurmProvider(nodes_per_block=1, init_blocks=1, min_blocks=0, max_blocks=1,
                             walltime="00:10:00", exclusive=False, cmd_timeout=30,
                             launcher=SrunLauncher())
    t0 = time.time()
    engine = start_local_engine(tmp_path / "gce", provider=provider, max_workers=1,
                                heartbeat_period=5, heartbeat_threshold=30)
    try:
        gx = LocalEngineExecutor(engine)
        res = gx.submit(collect_metrics, str(tmp_path / "norun"), str(tmp_path / "r.db")).result(180)
        assert res["collected"] is False and res["reason"] == "no run.json"
        from rudder.cluster.slurm import allocation_nodes

        # inside the job: SLURM_JOB_NODELIST is set there (here it is not: this would raise)
        assert gx.submit(allocation_nodes).result(60) == [slurm.node]
        print(f"engine on Slurm: first result after {time.time() - t0:.1f} s")
    finally:
        engine.shutdown()
    deadline = time.monotonic() + 30  # the engine cancelled its block
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not slurm.jobs(), slurm.jobs()
