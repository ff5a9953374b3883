"""LocalCluster mechanics without DGL: names and subnets, the supervisor's failure handling and
teardown, stale cleanup. A fake "server" (listens on the DGL port, sleeps) stands in for DGL, so
these run in seconds; the real DistDGL runs are in test_cluster_dgl.py."""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rudder.cluster import ClusterError, ClusterSpec, LocalCluster, cleanup_stale, netns_available
from rudder.cluster import netns as nets
from rudder.cluster.exits import describe_exit
from rudder.cluster.local import hold_ports

FAKE_SERVER = textwrap.dedent("""
    import os, socket, sys, time
    m = int(os.environ["RUDDER_MACHINE_ID"])
    addr, port = open(os.environ["DGL_IP_CONFIG"]).read().splitlines()[m].split()
    assert addr == os.environ["RUDDER_MACHINE_ADDR"]
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, int(port)))
    s.listen(8)
    time.sleep(float(os.environ.get("FAKE_SERVER_LIFE", "0.5")))
""")

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="network namespaces need root")


@pytest.fixture
def fake(tmp_path):
    server = tmp_path / "fake_server.py"
    server.write_text(FAKE_SERVER)
    part = tmp_path / "part.json"
    part.write_text("{}")
    return {"server_argv": [sys.executable, str(server)], "part": part}


def leftovers(tag: str, run_dir: Path) -> list[str]:
    """Namespaces, links and processes of one cluster still on the host."""
    found = []
    if tag:
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        found += [f"netns {line}" for line in ns.splitlines() if tag in line]
        found += [f"link {line.split(':')[1]}" for line in links.splitlines() if tag in line]
    procs = subprocess.run(["pgrep", "-af", str(run_dir)], capture_output=True, text=True).stdout
    found += [f"process {line}" for line in procs.splitlines()]
    return found


# -- pure functions -----------------------------------------------------------------------------


def test_names_fit_ifnamsiz_and_carry_the_id():
    net = nets.ClusterNet("a1b2c3", "rdr", 12, "10.20.30.0/24")
    names = [net.bridge] + [f(i) for i in range(12) for f in (net.host_veth, net.ns_veth)]
    assert all(len(n) <= nets.IFNAME_MAX for n in names)
    assert all(n.startswith("rdra1b2c3") for n in names + net.namespaces)
    assert net.addresses[:2] == ["10.20.30.1", "10.20.30.2"]
    assert net.bridge_address == "10.20.30.254"


def test_pick_subnet_avoids_used_networks():
    first = nets.pick_subnet("abcdef", [])
    used = [ipaddress.ip_network(first), ipaddress.ip_network("10.0.0.0/9")]
    second = nets.pick_subnet("abcdef", used)
    assert second != first
    assert not any(ipaddress.ip_network(second).overlaps(u) for u in used)
    assert nets.pick_subnet("abcdef", []) == first  # deterministic per id


def test_prefix_and_spec_validation():
    with pytest.raises(ValueError):
        nets.check_prefix("toolong")
    with pytest.raises(ValueError):
        ClusterSpec(machines=0)
    spec = ClusterSpec.from_config({"machines": 3, "bandwidth": "1gbit", "unknown": 1})
    assert (spec.machines, spec.bandwidth) == (3, "1gbit")


def test_describe_exit():
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "was killed by signal SIGKILL"


def test_several_machines_without_netns(tmp_path, monkeypatch):
    """netns=False: several machines on loopback, each on its own 127.A.B.m address (a real run:
    tests/test_train_integration.py); without root or `unshare` (no private /dev/shm per machine)
    a clear error, and never bandwidth shaping."""
    with pytest.raises(ClusterError, match="bandwidth shaping needs network namespaces"):
        LocalCluster(ClusterSpec(machines=2, netns=False, bandwidth="1gbit"), tmp_path).start()
    if ROOT and shutil.which("unshare"):
        with LocalCluster(ClusterSpec(machines=3, netns=False), tmp_path) as c:
            a = c.addresses
            assert c.loopback and len(set(a)) == 3 and a[0].startswith("127.") and a[0] != "127.0.0.1"
            assert [x.rsplit(".", 1)[0] for x in a] == [a[0].rsplit(".", 1)[0]] * 3
            held = hold_ports(a)  # one port free on every machine's address
            assert len({s.getsockname()[1] for s in held}) == 1
            for s in held:
                s.close()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ClusterError, match="need root and `unshare`"):
        LocalCluster(ClusterSpec(machines=2, netns=False), tmp_path).start()


def test_netns_available_answers():
    ok, why = netns_available()
    assert isinstance(ok, bool) and why
    assert ok == ROOT, why
    assert ROOT or why.startswith("not root")


# -- one machine on loopback (no root needed) ---------------------------------------------------


def loopback(tmp_path, **kw) -> LocalCluster:
    kw = {"machines": 1, "trainers_per_machine": 2, "netns": False, "start_timeout_s": 10,
          "run_timeout_s": 20, "kill_grace_s": 1, "rendezvous": False, **kw}  # no torch here
    return LocalCluster(ClusterSpec(**kw), tmp_path / "run")


def test_loopback_run_ok_with_env_and_logs(tmp_path, fake):
    script = ('echo "$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $DGL_ROLE $DGL_NUM_CLIENT '
              '$RUDDER_MACHINE_ADDR $GLOO_SOCKET_IFNAME $EXTRA"')
    with loopback(tmp_path) as cluster:
        assert cluster.addresses == ["127.0.0.1"]
        res = cluster.run(fake["part"], ["sh", "-c", script], env={"EXTRA": "x"},
                          server_argv=fake["server_argv"])
    assert res.ok, res.summary()
    assert res.startup_s is not None and res.startup_s < res.wall_s
    assert res.exit_codes == {"machine0/server": 0, "machine0/trainer0": 0,
                              "machine0/trainer1": 0}
    out = Path(res.logs["machine0/trainer1"]).read_text().split()
    assert out == ["1", "2", "1", "127.0.0.1", "client", "2", "127.0.0.1", "lo", "x"]
    ip_config = (tmp_path / "run" / "ip_config.txt").read_text().split()
    assert ip_config[0] == "127.0.0.1"
    saved = json.loads((tmp_path / "run" / "cluster" / "result.json").read_text())
    assert saved["ok"] is True
    assert not leftovers("", tmp_path / "run")


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


def test_supervisor_records_each_childs_cpu_with_its_waited_descendants(tmp_path, fake):
    # trainer 1 burns 0.4 s of CPU in a grandchild it waits for (as a trainer's sampler
    # processes); trainer 0 and the server (it sleeps) burn next to nothing. CPU time, not wall
    # time: a busy host changes neither.
    burn = tmp_path / "burn.py"
    burn.write_text(BURN)
    script = f'[ "$RANK" = 1 ] && {sys.executable} {burn}; true'
    with loopback(tmp_path) as cluster:
        res = cluster.run(fake["part"], ["sh", "-c", script], server_argv=fake["server_argv"])
    assert res.ok, res.summary()
    st = json.loads((tmp_path / "run" / "cluster" / "machine0.status.json").read_text())
    cpu = {p["key"]: p["cpu_user_s"] + p["cpu_sys_s"] for p in st["procs"]}
    assert set(cpu) == {"machine0/server", "machine0/trainer0", "machine0/trainer1"}
    assert cpu["machine0/trainer1"] >= 0.39
    assert cpu["machine0/trainer0"] < 0.2 and cpu["machine0/server"] < 0.3  # python's start-up


def test_loopback_run_pinned_to_its_cpus(tmp_path, fake):
    """ClusterSpec.cpus: the supervisor pins itself, so server and trainers inherit the cores
    (a study's agent node service keeps the others), and each trainer's threads divide them."""
    core = sorted(os.sched_getaffinity(0))[0]
    script = 'grep Cpus_allowed_list /proc/self/status; echo "threads $RUDDER_THREADS $OMP_NUM_THREADS"'
    with loopback(tmp_path, cpus=[core]) as cluster:
        res = cluster.run(fake["part"], ["sh", "-c", script], server_argv=fake["server_argv"])
    assert res.ok, res.summary()
    for rank in (0, 1):
        out = Path(res.logs[f"machine0/trainer{rank}"]).read_text()
        assert f"Cpus_allowed_list:\t{core}\n" in out, out
        assert "threads 1 1" in out, out
    with pytest.raises(ValueError, match="cpus must be"):
        ClusterSpec(machines=1, cpus=[])


def test_trainers_keep_off_a_pinned_agent_services_cores():
    from rudder.runner import trainer_cpus

    mine = sorted(os.sched_getaffinity(0))
    assert trainer_cpus(None) is None and trainer_cpus({"cpus": None}) is None
    assert trainer_cpus({"cpus": mine}) is None  # nothing left: not pinned rather than no core
    if len(mine) > 1:
        assert trainer_cpus({"cpus": mine[-1:]}) == mine[:-1]


def test_loopback_trainer_crash_ends_run_with_its_name(tmp_path, fake):
    script = 'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; sleep 600'
    t0 = time.monotonic()
    with loopback(tmp_path) as cluster:
        res = cluster.run(fake["part"], ["sh", "-c", script],
                          server_argv=fake["server_argv"], env={"FAKE_SERVER_LIFE": "600"})
    assert time.monotonic() - t0 < 10
    assert not res.ok
    assert res.reason == "trainer 1 on machine 0 exited with code 3"
    codes = res.exit_codes
    assert codes["machine0/trainer1"] == 3 and codes["machine0/trainer0"] == -signal.SIGTERM
    assert not leftovers("", tmp_path / "run")


def test_loopback_run_timeout_kills_what_ignores_sigterm(tmp_path, fake):
    t0 = time.monotonic()
    with loopback(tmp_path, run_timeout_s=2) as cluster:
        res = cluster.run(fake["part"], ["sh", "-c", 'trap "" TERM; sleep 600'],
                          server_argv=fake["server_argv"])
    assert time.monotonic() - t0 < 10
    assert not res.ok and res.reason.startswith("timeout after 2 s (still running: trainer 0")
    assert res.exit_codes["machine0/trainer0"] == -signal.SIGKILL
    assert not leftovers("", tmp_path / "run")


def test_loopback_start_timeout_names_the_server(tmp_path, fake):
    with loopback(tmp_path, start_timeout_s=2) as cluster:
        res = cluster.run(fake["part"], ["true"], server_argv=["sleep", "600"])
    assert not res.ok
    assert "start-up timeout on machine 0" in res.reason and "not listening" in res.reason
    assert res.exit_codes["machine0/trainer0"] is None  # never started
    assert res.startup_s is None


def test_loopback_service_started_before_trainers_and_stopped_after(tmp_path, fake):
    service = ["sh", "-c", 'touch "$RUDDER_READY_FILE"; echo "$RUDDER_MACHINE_ADDR"; sleep 600']
    trainer = ["sh", "-c", 'test -e "$RUDDER_RUN_DIR/cluster/ready/service0.0"']
    with loopback(tmp_path, wait_services=True) as cluster:
        res = cluster.run(fake["part"], trainer, service_argv=service,
                          server_argv=fake["server_argv"])
    assert res.ok, res.summary()
    svc = next(p for p in res.processes if p.role == "service")
    assert svc.stopped and svc.returncode == -signal.SIGTERM
    assert Path(svc.log).read_text().strip() == "127.0.0.1"


def test_keyboard_interrupt_tears_down(tmp_path, fake):
    cluster = loopback(tmp_path)
    cluster.start()
    orig = cluster._watch

    def interrupted(*a, **kw):
        time.sleep(0.5)
        raise KeyboardInterrupt

    cluster._watch = interrupted
    with pytest.raises(KeyboardInterrupt):
        cluster.run(fake["part"], ["sleep", "600"], server_argv=fake["server_argv"])
    cluster._watch = orig
    cluster.close()
    assert not leftovers("", tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "cluster" / "result.json").read_text())
    assert saved["reason"].startswith("interrupted (KeyboardInterrupt")


# -- namespaces (root) --------------------------------------------------------------------------


@needs_root
@pytest.mark.netns
def test_two_machine_crash_tears_down_everything(tmp_path, fake):
    spec = ClusterSpec(machines=2, trainers_per_machine=1, start_timeout_s=10, run_timeout_s=20,
                       kill_grace_s=1, bandwidth="100mbit")
    script = 'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; sleep 600'
    t0 = time.monotonic()
    with LocalCluster(spec, tmp_path / "run") as cluster:
        tag = cluster.net.tag
        assert cluster.addresses[0] != cluster.addresses[1]
        qd = subprocess.run(["tc", "qdisc", "show", "dev", cluster.net.host_veth(1)],
                            capture_output=True, text=True).stdout
        assert "tbf" in qd and "100Mbit" in qd
        res = cluster.run(fake["part"], ["sh", "-c", script], server_argv=fake["server_argv"],
                          env={"FAKE_SERVER_LIFE": "600"})
    assert time.monotonic() - t0 < 15
    assert res.reason == "trainer 1 on machine 1 exited with code 3", res.summary()
    assert not leftovers(tag, tmp_path / "run")


@needs_root
@pytest.mark.netns
def test_cleanup_stale_removes_a_dead_owners_network(tmp_path):
    # An owner that builds a network and dies without tearing down (os._exit skips atexit).
    code = ("from rudder.cluster import netns as n, local; import os, sys; "
            "net = n.create_network(2, 'rdt'); print(net.tag, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    tag = out.stdout.strip()
    assert tag.startswith("rdt"), out.stderr
    assert leftovers(tag, tmp_path)  # it is really there
    # Processes inside a stale namespace are killed too.
    sleeper = subprocess.Popen(["ip", "netns", "exec", f"{tag}m0", "sleep", "600"])
    time.sleep(0.2)
    try:
        assert tag in cleanup_stale("rdt")
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        sleeper.kill()
    assert not leftovers(tag, tmp_path)
    assert not (nets.state_dir() / f"{tag}.json").exists()


# -- bandwidth schedule (cluster.bandwidth_schedule) ---------------------------------------------


def test_rates_and_schedules_are_checked_naming_the_bad_value():
    from rudder.bandwidth import check_schedule, parse_rate, rate_at

    assert parse_rate("25mbit") == 25e6 and parse_rate("100Mbit") == 100e6  # as tc prints it
    assert parse_rate("10mbps") == 80e6 and parse_rate("1.5gbit") == 1.5e9
    for bad in ("fast", "10 m", "0mbit", "10kb", None):
        with pytest.raises(ValueError, match=f"bad link rate {bad!r}"):
            parse_rate(bad)
    sched = check_schedule([[0, "100mbit"], [30, "5mbit"], [60.5, "1gbit"]])
    assert sched == [(0.0, "100mbit"), (30.0, "5mbit"), (60.5, "1gbit")]
    assert [rate_at(sched, None, t) for t in (0, 29.9, 30, 61)] == [100e6, 100e6, 5e6, 1e9]
    assert rate_at([(10.0, "5mbit")], None, 9) is None and rate_at([(10.0, "5mbit")], "1gbit", 9) == 1e9
    for bad, says in [([[0, "1gbit"], [0, "5mbit"]], "entry 1 .*times must increase"),
                      ([[5, "1gbit"], [3, "5mbit"]], "entry 1 .*times must increase"),
                      ([[0, "fast"]], "entry 0 .*bad link rate 'fast'"),
                      ([[-1, "1gbit"]], "entry 0 .*time -1 must be a number >= 0"),
                      ([[1]], "entry 0 .*expected \\[t_s, rate\\]"), ([], "non-empty list")]:
        with pytest.raises(ValueError, match=says):
            check_schedule(bad)
    with pytest.raises(ValueError, match="times must increase"):
        ClusterSpec(machines=1, bandwidth_schedule=[[2, "1gbit"], [1, "5mbit"]])
    from rudder.config import ConfigError, RunConfig, parse_config

    with pytest.raises(ConfigError, match="cluster.bandwidth_schedule: .*entry 1 .*'slow'"):
        parse_config(RunConfig, {"cluster": {"bandwidth_schedule": [[0, "1gbit"], [9, "slow"]]}})
    with pytest.raises(ConfigError, match="cluster.bandwidth: .*bad link rate '1 gigabit'"):
        parse_config(RunConfig, {"cluster": {"bandwidth": "1 gigabit"}})
    with pytest.raises(ClusterError, match="needs network namespaces"):
        LocalCluster(ClusterSpec(machines=1, netns=False, bandwidth_schedule=[[1, "5mbit"]]),
                     "unused").start()


@needs_root
@pytest.mark.netns
def test_bandwidth_schedule_changes_the_link_at_its_times_and_is_cleaned_up(tmp_path, fake):
    """The qdisc on both sides of the machine's link reads the scheduled rates in order, none
    before its time after launch; an entry past the run's end is never applied; afterwards the
    link is back at `bandwidth` and, once closed, nothing of the cluster is left."""
    import threading

    spec = ClusterSpec(machines=1, netns=True, start_timeout_s=10, run_timeout_s=30, kill_grace_s=1,
                       rendezvous=False, bandwidth="100mbit",
                       bandwidth_schedule=[[0.6, "20mbit"], [2.0, "5mbit"], [120, "1mbit"]])
    seen: list[tuple[float, str | None, str | None]] = []
    with LocalCluster(spec, tmp_path / "run") as cluster:
        net = cluster.net
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                # stamped after both reads: a rate seen was in place by then (a stamp taken
                # before the reads could precede a change the reads then see)
                outside, inside = nets.link_rate(net, 0), nets.link_rate(net, 0, inside=True)
                seen.append((time.time(), outside, inside))
                time.sleep(0.05)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            res = cluster.run(fake["part"], ["sh", "-c", "sleep 3.5"], server_argv=fake["server_argv"],
                              env={"FAKE_SERVER_LIFE": "3.5"})
        finally:
            done.set()
            poller.join()
        assert res.ok, res.summary()
        assert cluster.link_scheduler is None  # stopped with its run
        after = (nets.link_rate(net, 0), nets.link_rate(net, 0, inside=True))
    assert after == ("100Mbit", "100Mbit")
    changes = res.link_changes
    assert [(c["t_s"], c["rate"], c["error"]) for c in changes] == [(0.6, "20mbit", None), (2.0, "5mbit", None)]
    assert all(c["applied_s"] >= c["t_s"] for c in changes)
    logged = [json.loads(x) for x in (tmp_path / "run" / "cluster" / "link_changes.jsonl").read_text().splitlines()]
    assert logged == changes
    launched = changes[0]["at"] - changes[0]["applied_s"]  # applied_s is rounded to 1 ms
    for side in (1, 2):
        rates = [s[side] for s in seen]
        order = [r for k, r in enumerate(rates) if k == 0 or r != rates[k - 1]]
        assert order[:3] == ["100Mbit", "20Mbit", "5Mbit"], order  # (then back at 100Mbit: `after`)
        for rate, t_s in (("20Mbit", 0.6), ("5Mbit", 2.0)):  # never before its time
            first = next(s[0] for s in seen if s[side] == rate)
            assert first >= launched + t_s - 0.001
    assert not leftovers(net.tag, tmp_path / "run")
