"""Perlmutter's code path on a real multi-node Slurm started by the test: four slurmd "nodes",
each in its own network, UTS and mount namespace (own address on a private bridge, own
hostname, own /dev/shm), one slurmctld, a private SLURM_CONF (rudder.workflow.testcluster.
NetnsSlurmCluster). On it:
  - Parsl's MPI executor backlog: reproduced (a result is dropped, its future never completes),
    then the same tasks through our NodeGate all complete;
  - a study end to end through MPIExecutor + SlurmProvider (one 4-node block, two runs at once)
    with runs of 1, 2 and 4 machines and every policy, the agent with one service per node, the
    machines of a run on distinct nodes with distinct addresses, collected into DuckDB.
Afterwards nothing of the cluster is left: daemons, slurmstepd, namespaces, links."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from rudder.workflow.testcluster import NetnsSlurmCluster, missing_binaries

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NODES = 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(missing_binaries()), reason="Slurm binaries missing "
                       f"({', '.join(missing_binaries())}): run scripts/install_slurm.sh"),
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and slurmd need root"),
    pytest.mark.skipif(any(shutil.which(b) is None for b in ("ip", "nsenter", "unshare")),
                       reason="needs ip, nsenter and unshare"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    sc = NetnsSlurmCluster(tmp_path_factory.mktemp("mslurm"), nodes=NODES)
    sc.start()
    try:
        yield sc
    finally:
        hard = sc.stop()
        assert not sc.leftovers(), sc.leftovers()
        assert not hard, f"had to be killed hard: {hard}"


def mpi_execution(sc: NetnsSlurmCluster, max_workers: int) -> dict:
    """configs/perlmutter/*.yaml's executor with the test's values: the MPI executor on one
    SlurmProvider block of all nodes, workers reaching the study at the bridge address, each
    run srun-ing one machine supervisor per node, DGL on the nodes' eth0."""
    return {
        "retries": 0,
        "strategy_period": 1,
        "executors": {"nodes": {
            "type": "MPIExecutor",
            "address": sc.address,  # hsn0's address on Perlmutter
            "mpi_launcher": "srun",
            "max_workers": max_workers,
            "heartbeat_period": 5,
            "heartbeat_threshold": 60,
            "provider": {
                "type": "SlurmProvider", "account": "test", "qos": "debug",
                "nodes_per_block": NODES, "exclusive": True, "walltime": "00:30:00",
                "init_blocks": 0, "min_blocks": 0, "max_blocks": 1, "cmd_timeout": 30,
                "worker_init": "",  # the job inherits PATH/PYTHONPATH/SLURM_CONF
                "launcher": {"type": "SimpleLauncher"}}}},
        "apps": {"stage": "nodes", "partition": "nodes", "train": "nodes"},
        "launch": {"type": "slurm", "ifname": "eth0", "srun_args": ""},
    }


def wait_queue_empty(sc: NetnsSlurmCluster, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while sc.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not sc.jobs(), sc.jobs()


@pytest.mark.timeout(120)
def test_nodes_are_hosts_with_their_own_names_and_addresses(cluster):
    out = cluster.run(["srun", f"-N{NODES}", "--ntasks-per-node=1", "sh", "-c",
                       "echo $(hostname) $SLURMD_NODENAME "
                       "$(ip -4 -o addr show eth0 | awk '{print $4}')"], timeout=60).stdout
    rows = sorted(ln.split() for ln in out.splitlines() if ln.strip())
    assert rows == sorted([n, n, f"{a}/24"] for n, a in zip(cluster.node_names,
                                                              cluster.node_addrs))
    # a step on one node reaches a listener on another by its address
    a, b = cluster.node_names[1], cluster.node_names[2]
    b_addr = cluster.node_addrs[2]
    listen = subprocess.Popen(
        ["srun", "-w", b, "-N1", sys.executable, "-c",
         "import socket;s=socket.create_server(('0.0.0.0',47123));c,_=s.accept();"
         "print(c.recv(16).decode())"], env=cluster.env(), stdout=subprocess.PIPE, text=True)
    try:
        talk = cluster.run(["srun", "-w", a, "-N1", sys.executable, "-c",
                            "import socket,time\nfor i in range(100):\n try:\n"
                            f"  socket.create_connection(('{b_addr}',47123)).send(b'hi');break\n"
                            " except OSError: time.sleep(0.2)"], timeout=60)
        assert talk.returncode == 0, talk.stderr
        assert listen.communicate(timeout=30)[0].strip() == "hi"
    finally:
        if listen.poll() is None:
            listen.kill()
            listen.wait()
    wait_queue_empty(cluster)


@pytest.mark.timeout(400)
def test_mpi_backlog_recursion_and_the_gate(cluster, tmp_path, monkeypatch):
    """Parsl's MPIExecutor on a 4-node block, three tasks at once: 2 + 2 nodes run, the 4-node
    one waits in the pool's backlog. When the first 2-node task ends, the backlogged task still
    does not fit and _schedule_backlog_tasks recurses until RecursionError: the pool drops that
    result and its future never completes. The same tasks through NodeGate never enter the
    backlog, and all complete."""
    import parsl
    from parsl import python_app

    from rudder.cluster.slurm import task_nodes
    from rudder.workflow.execution import build_parsl_config, parse_execution, \
        prepare_environment
    from rudder.workflow.gate import NodeGate

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    prepare_environment(REPO)
    ex = parse_execution(mpi_execution(cluster, max_workers=3))
    dfk = parsl.load(build_parsl_config(ex, run_dir=tmp_path / "runinfo"))
    try:
        app = python_app(task_nodes, executors=["nodes"])

        def spec(n):
            return {"num_nodes": n, "ranks_per_node": 1, "num_ranks": n}

        def pool_log() -> str:
            return "".join(p.read_text(errors="replace")
                           for p in (tmp_path / "runinfo").rglob("manager.log"))

        # -- through the gate: nothing waits in Parsl's backlog, everything completes --------
        gate = NodeGate(capacity=NODES, slots=3, label="nodes")
        futs = [gate.submit(n, [], lambda h=h, n=n: app(h, parsl_resource_specification=spec(n)))
                for h, n in ((3, 2), (10, 2), (0, 4))]
        got = [f.result(timeout=240) for f in futs]
        assert [len(g) for g in got] == [2, 2, 4]
        assert not set(got[0]) & set(got[1])  # the two 2-node tasks ran side by side
        assert sorted(got[2]) == sorted(cluster.node_names)
        assert gate.peak_nodes == NODES and gate.nodes_in_flight == 0
        assert "into backlog" not in pool_log() and "RecursionError" not in pool_log()

        # -- straight to Parsl: the 4-node task waits in the backlog; when a 2-node task ends it
        # still does not fit, the recursion overflows and the pool drops what it held (that
        # task's result, and the 4-node task too when the overflow hits before it is back in
        # the backlog)
        futs = [app(3, parsl_resource_specification=spec(2)),
                app(10, parsl_resource_specification=spec(2)),
                app(0, parsl_resource_specification=spec(4))]
        deadline = time.monotonic() + 240
        while "RecursionError" not in pool_log() and time.monotonic() < deadline:
            time.sleep(1)
        # every task would end within ~10 s of the overflow (the 10 s hold), were it not dropped
        deadline = time.monotonic() + 20
        while not all(f.done() for f in futs) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not all(f.done() for f in futs), \
            "every future completed: has Parsl's backlog recursion been fixed?"
        text = pool_log()
        assert "into backlog" in text and "RecursionError" in text
        assert "Failed to send result to interchange" in text
    finally:
        dfk.cleanup()
        parsl.clear()
    wait_queue_empty(cluster)


def study_yaml(tmp_path: Path) -> Path:
    """Every policy; runs of 1, 2 and 4 machines (5 runs: a 5 x 3 grid minus 10 points)."""
    keep = {(1, "none"), (1, "static"), (2, "lookahead"), (2, "agent"), (4, "fixed")}
    policies = ["none", "static", "fixed", "lookahead", "agent"]
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump({
        "name": "multinode", "datasets": ["synth-tiny"], "machines": [1, 2, 4],
        "policies": policies,
        "exclude": [{"machines": m, "policy": pol} for m in (1, 2, 4) for pol in policies
                    if (m, pol) not in keep],
        "run": {
            "train": {"epochs": 1, "eval_every": 0, "batch_size": 100},
            "prefetch": {"window": 4},
            # SmolLM2 (ships in the venv); the shortest prompt warms in a third of the time
            "agent": {"backend": "http", "threads": 1, "prompt": "zero-shot"},
            "dataset": {"root": str(tmp_path / "data")},
            "cluster": {"netns": False, "start_timeout_s": 300, "run_timeout_s": 900}}}))
    return p


def _ts(s: str) -> float:
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%S").timestamp()


@pytest.mark.timeout(1800)
def test_study_on_four_nodes_end_to_end(cluster, tmp_path):
    exe = tmp_path / "execution.yaml"
    exe.write_text(yaml.safe_dump({"execution": mpi_execution(cluster, max_workers=2)}))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "workflows/scaling_study.py", "--study",
                           str(study_yaml(tmp_path)), "--execution", str(exe), "--runs-dir",
                           str(tmp_path / "runs"), "--no-live", "--no-report"], cwd=REPO,
                          env=cluster.env(), capture_output=True, text=True, timeout=1700)
    wall = time.time() - t0
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    study_dir = tmp_path / "runs" / "multinode"
    summary = json.loads((study_dir / "study.json").read_text())
    runs = summary["runs"]
    assert len(runs) == 5 and all(r["status"] == "done" and r["collected"] for r in runs), runs
    assert {r["machines"] for r in runs} == {1, 2, 4}
    assert {r["policy"] for r in runs} == {"none", "static", "fixed", "lookahead", "agent"}

    spans, busy = [], 0.0
    addr_of = dict(zip(cluster.node_names, cluster.node_addrs))
    for r in runs:
        run_dir = study_dir / r["run_id"]
        info = json.loads((run_dir / "run.json").read_text())
        assert info["status"] == "complete"
        m = r["machines"]
        hosts = json.loads((run_dir / "cluster" / "hosts.json").read_text())
        addrs = [ln.split()[0] for ln in (run_dir / "ip_config.txt").read_text().splitlines()]
        # the run's machines: distinct Slurm nodes, each at its own address, as on Perlmutter
        assert len(set(hosts)) == m and set(hosts) <= set(cluster.node_names)
        assert addrs == [addr_of[h] for h in hosts]
        for i, h in enumerate(hosts):
            sup = (run_dir / "logs" / f"machine{i}.supervisor.log").read_text()
            assert f"node {h}: machine {i} of {m}" in sup
        if r["policy"] == "agent":  # one agent service per node (the 4 services of a 4-machine
            for i in range(m):      # run took ~3.5 min to load on 2 busy cores: 2 here)
                sup = (run_dir / "logs" / f"machine{i}.supervisor.log").read_text()
                assert f"started service 0 on machine {i}" in sup
        spans.append((info["started_at"], info["ended_at"], set(hosts)))
        busy += m * (info["ended_at"] - info["started_at"])
    # at least two runs at once, never on the same node
    overlaps = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:]
                if a[0] < b[1] and b[0] < a[1]]
    assert overlaps, spans
    assert all(not (a[2] & b[2]) for a, b in overlaps)

    import duckdb

    con = duckdb.connect(str(study_dir / "results.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT machines, policy, status FROM runs ORDER BY machines, policy"
                           ).fetchall()
        decisions = con.execute("SELECT count(*) FROM decisions d JOIN runs r USING (run_id) "
                                "WHERE r.policy = 'agent'").fetchone()[0]
    finally:
        con.close()
    assert rows == [(1, "none", "complete"), (1, "static", "complete"),
                    (2, "agent", "complete"), (2, "lookahead", "complete"),
                    (4, "fixed", "complete")]
    assert decisions >= 1

    # block utilisation: node-seconds the runs held / node-seconds the block was allocated
    wait_queue_empty(cluster)
    jobs = cluster.job_records()
    blocks = [j for j in jobs if j.get("JobName", "").startswith("parsl.")
              and str(study_dir) in j.get("StdOut", "")]  # (not the backlog test's block)
    assert len(blocks) == 1, jobs
    (blk,) = blocks
    assert int(blk["NumNodes"]) == NODES
    allocated = NODES * (_ts(blk["EndTime"]) - _ts(blk["StartTime"]))
    print(f"\nmulti-node study: wall {wall:.1f} s, block {allocated / NODES:.1f} s x {NODES} "
          f"nodes, runs busy {busy:.1f} node-s, utilisation {busy / allocated:.2f}")
