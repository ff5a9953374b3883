"""The study's per-node agent service: the first agent run on a node starts it (detached), the
next runs reuse it (the model loads once per node per study), the study stops it by pid; runs
outside a study keep their own service."""
from __future__ import annotations

import os
import time

import pytest

from rudder.agent.policy import wait_http
from rudder.agent.service import (NODE_DIR_ENV, ensure_node_service, spare_cpus,
                                  stop_node_services)
from rudder.config import RunConfig


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_single_runs_and_other_launchers_keep_their_own_service(monkeypatch, tmp_path):
    from rudder.runner import agent_service_argv, node_agent_service

    cfg = RunConfig.model_validate({"prefetch": {"policy": "agent"}, "agent": {"backend": "http"}})
    monkeypatch.delenv(NODE_DIR_ENV, raising=False)
    assert node_agent_service(cfg) is None and agent_service_argv(cfg) is not None
    monkeypatch.setenv(NODE_DIR_ENV, str(tmp_path))
    assert node_agent_service(cfg, {"type": "slurm"}) is None  # Slurm nodes: a service per run
    inproc = RunConfig.model_validate({"prefetch": {"policy": "agent"}})
    assert node_agent_service(inproc, {"type": "local"}) is None  # in-process stays in-process
    assert not list(tmp_path.iterdir())


def test_spare_cpus_only_when_the_node_has_cores_to_spare():
    n = len(os.sched_getaffinity(0))
    assert spare_cpus(1, n) is None  # every core has a trainer
    if n >= 2:
        assert spare_cpus(1, n - 1) == [sorted(os.sched_getaffinity(0))[-1]]


@pytest.mark.slow
def test_started_once_reused_then_stopped(tmp_path):
    first = ensure_node_service(tmp_path, "smollm2-135m", threads=1, prompt="default")
    try:
        assert not first["reused"] and _alive(first["pid"])
        again = ensure_node_service(tmp_path, "smollm2-135m", threads=1)
        assert again["reused"] and again["pid"] == first["pid"]  # one model per node
        url = f"http://127.0.0.1:{first['port']}"
        waited = wait_http(url, 240.0)
        assert waited < 240.0, (tmp_path / f"{first['node']}.log").read_text()[-2000:]
        # bound to every interface: reachable at a non-loopback address of this host too
        import socket

        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.connect(("10.255.255.255", 1))
            addr = s.getsockname()[0]
        except OSError:
            addr = None
        finally:
            s.close()
        if addr and addr != "0.0.0.0":
            assert wait_http(f"http://{addr}:{first['port']}", 10.0) < 10.0
    finally:
        assert stop_node_services(tmp_path) == 1
    deadline = time.monotonic() + 10
    while _alive(first["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(first["pid"])
    # the model server (its own session, under the service) went too: nothing listens on the port
    from rudder.listeners import listen_inodes

    while listen_inodes(first["port"]) and time.monotonic() < deadline + 15:
        time.sleep(0.2)
    assert not listen_inodes(first["port"]), "the model server outlived its node service"
    assert not list(tmp_path.glob("*.json"))
