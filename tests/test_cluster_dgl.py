"""Real DistDGL runs on LocalCluster: a 5k-node random graph in 2 partitions, one DGL server
and one probe trainer (tests/cluster_probe_trainer.py) per emulated machine. The probe pulls
features owned by the other machine and checks every row against the original."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rudder.cluster import ClusterSpec, LocalCluster, netns_available

PROBE = Path(__file__).with_name("cluster_probe_trainer.py")
NODES, EDGES, DIM = 5000, 40000, 64

pytestmark = [pytest.mark.slow]
ROOT = os.geteuid() == 0


def _partition(out: Path, parts: int) -> Path:
    import dgl
    import numpy as np
    import torch

    torch.manual_seed(0)
    g = dgl.rand_graph(NODES, EDGES)
    feat = torch.randn(NODES, DIM)
    g.ndata["feat"] = feat
    orig_nids, _ = dgl.distributed.partition_graph(
        g, "probe", parts, str(out), part_method="random", return_mapping=True)
    np.save(out / "features.npy", feat[orig_nids].numpy())  # rows in partitioned id order
    return out / "probe.json"


@pytest.fixture(scope="module")
def parts2(tmp_path_factory) -> Path:
    return _partition(tmp_path_factory.mktemp("parts2"), 2)


@pytest.fixture(scope="module")
def parts1(tmp_path_factory) -> Path:
    return _partition(tmp_path_factory.mktemp("parts1"), 1)


def probe_argv(part_config: Path, out: Path, *extra: str) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    return [sys.executable, str(PROBE), "--graph-name", "probe",
            "--features", str(part_config.parent / "features.npy"), "--out", str(out), *extra]


def reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def leftovers(tag: str, run_dir: Path) -> list[str]:
    found = []
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [f"netns {line}" for line in ns.splitlines() if tag and tag in line]
    found += [f"link {line.split(':')[1]}" for line in links.splitlines() if tag and tag in line]
    procs = subprocess.run(["pgrep", "-af", str(run_dir)], capture_output=True, text=True).stdout
    found += [f"process {line}" for line in procs.splitlines()]
    return found


def spec(**kw) -> ClusterSpec:
    # Generous bounds: each test takes ~20-30 s on 2 idle cores, several times that on a busy
    # host (every process imports torch + dgl); the cluster's own timeout fires before pytest's.
    return ClusterSpec(**{"machines": 2, "trainers_per_machine": 1, "start_timeout_s": 90,
                          "run_timeout_s": 150, "kill_grace_s": 2, **kw})


@pytest.mark.netns
@pytest.mark.skipif(not ROOT, reason="network namespaces need root")
@pytest.mark.timeout(200)
def test_two_machines_pull_remote_features(parts2, tmp_path):
    run_dir = tmp_path / "run"
    with LocalCluster(spec(), run_dir) as cluster:
        tag = cluster.net.tag
        res = cluster.run(parts2, probe_argv(parts2, tmp_path / "out"))
    assert res.ok, res.summary()
    reps = reports(tmp_path / "out")
    assert [r["rank"] for r in reps] == [0, 1]
    for r in reps:
        assert r["matched"] and r["checked"] == 500
        # Distinct addresses: DGL found each trainer's machine (no override needed).
        assert r["partid"] == r["machine"] == r["rank"]
        assert r["addr"] == res.addresses[r["machine"]]
    ready = max(r["t_ddp"] for r in reps) - min(r["t_start"] for r in reps)
    print(f"\n2-machine cluster: network {cluster.net_setup_s:.2f} s, servers up + trainers "
          f"started {res.startup_s:.1f} s, trainers in DGL+gloo {ready:.1f} s after their "
          f"start, whole run {res.wall_s:.1f} s")
    assert not leftovers(tag, run_dir)


@pytest.mark.netns
@pytest.mark.skipif(not ROOT, reason="network namespaces need root")
@pytest.mark.timeout(200)
def test_bandwidth_shaping_applies(parts2, tmp_path):
    rate_mbit = 20
    run_dir = tmp_path / "run"
    with LocalCluster(spec(bandwidth=f"{rate_mbit}mbit"), run_dir) as cluster:
        net = cluster.net
        tag = net.tag
        host_q = subprocess.run(["tc", "qdisc", "show", "dev", net.host_veth(0)],
                                capture_output=True, text=True).stdout
        ns_q = subprocess.run(["ip", "netns", "exec", net.namespace(1), "tc", "qdisc", "show",
                               "dev", net.ns_veth(1)], capture_output=True, text=True).stdout
        assert "tbf" in host_q and f"{rate_mbit}Mbit" in host_q, host_q
        assert "tbf" in ns_q and f"{rate_mbit}Mbit" in ns_q, ns_q
        res = cluster.run(parts2, probe_argv(parts2, tmp_path / "out", "--pull-rounds", "4"))
    assert res.ok, res.summary()
    for r in reports(tmp_path / "out"):
        mbit = r["pull_bytes"] * 8 / r["pull_s"] / 1e6
        print(f"\nrank {r['rank']}: pulled {r['pull_bytes'] / 1e6:.1f} MB in "
              f"{r['pull_s']:.2f} s = {mbit:.1f} Mbit/s through a {rate_mbit} Mbit/s link")
        assert r["pull_bytes"] > 2e6
        assert mbit < 1.5 * rate_mbit
    assert not leftovers(tag, run_dir)


@pytest.mark.netns
@pytest.mark.skipif(not ROOT, reason="network namespaces need root")
@pytest.mark.timeout(300)
def test_two_clusters_at_once_do_not_clash(parts2, tmp_path):
    results, tags, nets_ = {}, {}, {}

    def one(name: str) -> None:
        with LocalCluster(spec(start_timeout_s=150, run_timeout_s=250), tmp_path / name) as c:
            tags[name], nets_[name] = c.net.tag, c.net.subnet
            results[name] = c.run(parts2, probe_argv(parts2, tmp_path / name / "out"))

    threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=280)
    assert set(results) == {"a", "b"}
    assert tags["a"] != tags["b"] and nets_["a"] != nets_["b"]
    for name, res in results.items():
        assert res.ok, res.summary()
        assert all(r["matched"] for r in reports(tmp_path / name / "out"))
        assert not leftovers(tags[name], tmp_path / name)


@pytest.mark.netns
@pytest.mark.skipif(not ROOT, reason="network namespaces need root")
@pytest.mark.timeout(200)
def test_crashed_trainer_ends_run_and_leaves_nothing(parts2, tmp_path):
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    with LocalCluster(spec(), run_dir) as cluster:
        tag = cluster.net.tag
        res = cluster.run(parts2, probe_argv(parts2, tmp_path / "out", "--fail-rank", "1",
                                             "--fail-code", "3"))
    took = time.monotonic() - t0
    ended = time.time()
    assert not res.ok
    assert res.reason == "trainer 1 on machine 1 exited with code 3", res.summary()
    codes = res.exit_codes
    assert codes["machine1/trainer1"] == 3
    assert codes["machine0/trainer0"] is not None  # the sleeping peer was stopped, not left
    crash = json.loads((tmp_path / "out" / "crash1.json").read_text())["time"]
    # From the crash to everything gone: detection (<1 s), SIGTERM, 2 s grace, SIGKILL, netns.
    print(f"\ncrash -> run torn down in {ended - crash:.1f} s (whole run {took:.1f} s)")
    assert ended - crash < 15
    assert took < 150
    assert not leftovers(tag, run_dir)
    assert "failing on purpose" in Path(res.logs["machine1/trainer1"]).read_text()


@pytest.mark.timeout(200)
def test_one_machine_on_loopback(parts1, tmp_path):
    with LocalCluster(ClusterSpec(machines=1, netns=False, start_timeout_s=90,
                                  run_timeout_s=150, kill_grace_s=2), tmp_path / "run") as c:
        res = c.run(parts1, probe_argv(parts1, tmp_path / "out"))
    assert res.ok, res.summary()
    (rep,) = reports(tmp_path / "out")
    assert rep["machine"] == rep["partid"] == 0 and rep["matched"] and rep["checked"] == 500
    assert not leftovers("", tmp_path / "run")


def test_netns_available_reports_why():
    ok, why = netns_available()
    assert ok == ROOT, why  # as root a real run gets namespaces; without root it never does
    assert why and (ok or "root" in why or ROOT)


@pytest.mark.timeout(300)
def test_two_loopback_runs_at_once(parts1, tmp_path):
    """Two one-machine runs on this host's loopback at the same time (what two Slurm runs on one
    node, or two non-root users, do): each holds its own DGL and rendezvous ports, so neither
    binds the other's port nor joins the other's server."""
    results = {}

    def one(name: str) -> None:
        with LocalCluster(ClusterSpec(machines=1, netns=False, start_timeout_s=150,
                                      run_timeout_s=250, kill_grace_s=2), tmp_path / name) as c:
            results[name] = c.run(parts1, probe_argv(parts1, tmp_path / name / "out"))

    threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=280)
    ports = set()
    for name in ("a", "b"):
        res = results[name]
        assert res.ok, res.summary()
        (rep,) = reports(tmp_path / name / "out")
        assert rep["matched"] and rep["checked"] == 500
        ports.add((tmp_path / name / "ip_config.txt").read_text().split()[1])
        assert "machine0/store" in res.exit_codes
    assert len(ports) == 2
    assert not leftovers("", tmp_path / "a") and not leftovers("", tmp_path / "b")
