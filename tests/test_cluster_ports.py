"""Loopback runs side by side (no namespaces: what each Slurm node runs, and the non-root
fallback): ports are bound and held for the run, not checked and bound later; a server counts
as ready only when the run's own server process listens; the torch rendezvous store listens on
machine 0's address (loopback here), never on every interface."""
from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from rudder.cluster import ClusterSpec, LocalCluster
from rudder.cluster.local import hold_port
from rudder.cluster.machine import listens

FAKE_SERVER = textwrap.dedent("""
    import os, socket, time
    addr, port = open(os.environ["DGL_IP_CONFIG"]).read().split()[:2]
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as DGL's server socket
    s.bind((addr, int(port)))
    s.listen(8)
    time.sleep(float(os.environ.get("FAKE_SERVER_LIFE", "1")))
""")

# A trainer that reports who listens on its MASTER_PORT (from /proc/net/tcp) and the ports it got
REPORT = textwrap.dedent("""
    import json, os, socket, struct
    port = int(os.environ["MASTER_PORT"])
    found = []
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        addr, p = f[1].split(":")
        if f[3] == "0A" and int(p, 16) == port:
            found.append(socket.inet_ntoa(struct.pack("<I", int(addr, 16))))
    dgl_port = int(open(os.environ["DGL_IP_CONFIG"]).read().split()[1])
    out = {"master_port": port, "store_addrs": found, "dgl_port": dgl_port,
           "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
           "threads": os.environ.get("RUDDER_THREADS")}
    open(os.path.join(os.environ["OUT"], "r" + os.environ["RANK"] + ".json"), "w").write(json.dumps(out))
""")


def test_held_port_refuses_others_but_not_the_server():
    held = hold_port()
    port = held.getsockname()[1]
    try:
        with socket.socket() as other:  # anything else: refused
            with pytest.raises(OSError):
                other.bind(("127.0.0.1", port))
        # the kernel does not hand it out for bind(0) either (what a second run asks for)
        for _ in range(200):
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("127.0.0.1", 0))
                assert probe.getsockname()[1] != port
        with socket.socket() as server:  # the run's server (SO_REUSEADDR, as DGL's): accepted
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen(1)
    finally:
        held.close()


def test_readiness_needs_the_servers_own_listener():
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen(1)
        port = mine.getsockname()[1]
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert listens(__import__("os").getpid(), port)
            assert not listens(other.pid, port)  # a port open by someone else is not readiness
        finally:
            other.kill()
            other.wait()
    assert not listens(__import__("os").getpid(), port)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_loopback_runs_at_once(tmp_path):
    server = tmp_path / "server.py"
    server.write_text(FAKE_SERVER)
    report = tmp_path / "report.py"
    report.write_text(REPORT)
    part = tmp_path / "part.json"
    part.write_text("{}")
    results = {}

    def one(name: str) -> None:
        spec = ClusterSpec(machines=1, trainers_per_machine=2, netns=False, start_timeout_s=120,
                           run_timeout_s=200, kill_grace_s=2)
        out = tmp_path / name / "out"
        out.mkdir(parents=True)
        # every trainer waits until the store listens (it imports torch first) and reports
        trainer = ["sh", "-c", f'for i in $(seq 600); do test -e "$RUDDER_RUN_DIR/cluster/ready/'
                               f'store" && break; sleep 0.2; done; exec {sys.executable} {report}']
        with LocalCluster(spec, tmp_path / name) as c:
            results[name] = c.run(part, trainer, server_argv=[sys.executable, str(server)],
                                  env={"OUT": str(out), "FAKE_SERVER_LIFE": "3"})

    threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=280)
    import json

    reps = {}
    for name in ("a", "b"):
        res = results[name]
        assert res.ok, res.summary()
        assert {p.key for p in res.processes} >= {"machine0/store"}
        reps[name] = [json.loads((tmp_path / name / "out" / f"r{r}.json").read_text())
                      for r in (0, 1)]
        for rep in reps[name]:
            assert rep["master_port"] > 0 and rep["agent_store"] == "True"
            assert rep["store_addrs"] == ["127.0.0.1"]  # loopback only, not 0.0.0.0
            assert int(rep["threads"]) >= 1
    a, b = reps["a"][0], reps["b"][0]
    assert a["dgl_port"] != b["dgl_port"] and a["master_port"] != b["master_port"]
    assert len({a["dgl_port"], b["dgl_port"], a["master_port"], b["master_port"]}) == 4


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_agent_service_on_loopback_and_its_url_handed_to_the_trainers(tmp_path):
    """The run's agent service (the runner's argv: the real llama.cpp server with the shipped
    SmolLM2) binds the machine's loopback on a port of its own; the trainers get its URL from
    its ready file and reach it there."""
    from rudder.config import RunConfig
    from rudder.runner import agent_service_argv

    cfg = RunConfig.model_validate({"prefetch": {"policy": "agent"},
                                    "agent": {"backend": "http", "prompt": "zero-shot",  # (short warm-up)
                                              "model": {"name": "smollm2-135m"}}})
    service = agent_service_argv(cfg)
    assert service[service.index("--host") + 1] == "127.0.0.1"
    server = tmp_path / "server.py"
    server.write_text(FAKE_SERVER)
    part = tmp_path / "part.json"
    part.write_text("{}")
    probe = ("import json, os, urllib.request; url = os.environ['RUDDER_AGENT_URL']; "
             "body = json.load(urllib.request.urlopen(url + '/v1/models', timeout=30)); "
             "print(url, body['data'][0]['id'])")
    spec = ClusterSpec(machines=1, trainers_per_machine=1, netns=False, start_timeout_s=200,
                       run_timeout_s=250, kill_grace_s=2, wait_services=True, rendezvous=False)
    with LocalCluster(spec, tmp_path / "run") as c:
        res = c.run(part, [sys.executable, "-c", probe], service_argv=service,
                    server_argv=[sys.executable, str(server)], env={"FAKE_SERVER_LIFE": "5"})
    assert res.ok, res.summary()
    url, model = Path(res.logs["machine0/trainer0"]).read_text().split()[-2:]
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":8431")
    assert model == "smollm2-135m"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_agent_service_port_taken_before_it_binds(tmp_path, monkeypatch):
    """The port the service chose is taken (by another run's server) before llama.cpp binds it:
    the other listener does not count as ready (not our process), our server's exit is seen, and
    a new port is chosen."""
    import rudder.agent.service as service
    from rudder.agent.models import resolve

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(4)
    taken = squatter.getsockname()[1]
    ports = iter([taken])
    real = service.free_port
    monkeypatch.setattr(service, "free_port", lambda host="127.0.0.1": next(ports, None) or real(host))
    svc = service.AgentService(resolve("smollm2-135m"), host="127.0.0.1", ready_timeout_s=120,
                               log_path=tmp_path / "svc.log", model_alias="smollm2-135m")
    assert svc.port == taken
    try:
        svc.start()
        assert svc.port != taken and svc.ready()
        assert "address already in use" in (tmp_path / "svc.log").read_text().lower()
    finally:
        svc.stop()
        squatter.close()
