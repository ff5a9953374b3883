"""The study's per-node agent service: the first agent run on a node starts it (detached), the
next runs reuse it (the model loads once per node per study), the study stops it by pid; runs
outside a study keep their own service."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rudder.agent.policy import wait_http
from rudder.agent.service import NODE_CACHE_MB, NODE_N_BATCH, ensure_node_service, spare_cpus, stop_node_services
from rudder.config import RunConfig

REPO = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def test_single_runs_and_other_launchers_keep_their_own_service(tmp_path):
    from rudder.runner import agent_service_argv, node_agent_service

    cfg = RunConfig.model_validate({"prefetch": {"policy": "agent"},
                                    "agent": {"backend": "http", "prompt": "zero-shot"}})
    assert node_agent_service(cfg) is None and agent_service_argv(cfg) is not None
    argv = agent_service_argv(cfg)  # it warms the prefix of the prompt the trainers will send
    assert argv[argv.index("--prompt") + 1] == "zero-shot"
    assert node_agent_service(cfg, {"type": "local"}) is None  # no node folder: a single run
    study = {"agent_node_dir": str(tmp_path)}
    assert node_agent_service(cfg, {"type": "slurm", **study}) is None  # Slurm: a service per run
    inproc = RunConfig.model_validate({"prefetch": {"policy": "agent"}})
    assert node_agent_service(inproc, {"type": "local", **study}) is None  # in-process stays
    assert not list(tmp_path.iterdir())


def test_the_study_hands_its_node_folder_to_local_runs_in_their_launch(tmp_path):
    """The folder travels as data (the launch each train app gets), not through the environment."""
    from rudder.cluster.launch import Launch
    from rudder.workflow.dag import StudyDAG
    from rudder.workflow.execution import split_execution_file
    from rudder.workflow.study import expand, parse_study

    study = expand(parse_study({"name": "s", "datasets": ["synth-tiny"], "machines": [2],
                                "policies": ["agent"]}), runs_dir="runs")
    local, _ = split_execution_file(REPO / "configs" / "local.yaml")
    dag = StudyDAG(study, local, tmp_path / "runs", tmp_path / "r.duckdb", None, cwd=tmp_path)
    assert dag.agent_node_dir == str(tmp_path / "runs" / "s" / "agent-node")
    launch = Launch.of({**local.launch.model_dump(), "agent_node_dir": dag.agent_node_dir})
    assert Launch.of(launch.to_dict()) == launch  # survives the trip to the run's process
    slurm = local.model_copy(update={"launch": local.launch.model_copy(update={"type": "slurm"})})
    assert StudyDAG(study, slurm, tmp_path / "runs", tmp_path / "r.duckdb", None).agent_node_dir is None
    assert StudyDAG(study, local, tmp_path / "runs", tmp_path / "r.duckdb", None,
                    remote=True).agent_node_dir is None


def test_spare_cpus_only_when_the_node_has_cores_to_spare():
    # a core per trainer, the model's threads and one more (DistDGL's servers): else not pinned
    assert spare_cpus(1, 2, cpus=range(2)) is None  # this 2-core host: they share
    assert spare_cpus(1, 2, cpus=range(3)) is None
    assert spare_cpus(1, 2, cpus=range(4)) == [3]
    assert spare_cpus(2, 4, cpus=range(8)) == [6, 7]
    assert spare_cpus(2, 4, cpus=range(6)) is None
    assert spare_cpus(1, 1, cpus=[5, 9, 2, 9]) == [9]  # the last allowed core, not the last index
    assert spare_cpus(1, 0, cpus=range(3)) == [2]  # no trainer yet still leaves one for them
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        spare_cpus(0, 2, cpus=range(8))
    n = len(os.sched_getaffinity(0))  # default: the cores this process may use
    assert spare_cpus(1, n) is None
    if n >= 3:
        assert spare_cpus(1, n - 2) == [sorted(os.sched_getaffinity(0))[-1]]


@pytest.mark.slow
def test_started_once_reused_then_stopped(tmp_path):
    core = sorted(os.sched_getaffinity(0))[-1]  # pinned as on a node with cores to spare
    first = ensure_node_service(tmp_path, "smollm2-135m", threads=1, prompt="default", cpus=[core])
    try:
        assert not first["reused"] and _alive(first["pid"]) and first["cpus"] == [core]
        again = ensure_node_service(tmp_path, "smollm2-135m", threads=1)
        assert again["reused"] and again["pid"] == first["pid"]  # one model per node
        url = f"http://127.0.0.1:{first['port']}"
        waited = wait_http(url, 240.0)
        assert waited < 240.0, (tmp_path / f"{first['node']}.log").read_text()[-2000:]
        # the model server (the node service's child) and each of its threads run on that core only
        server = _children(first["pid"])
        assert len(server) == 1, server
        # it keeps each trainer's state (prompt cache, small batch) for the trainers' turns
        cmd = open(f"/proc/{server[0]}/cmdline", "rb").read().split(b"\0")
        # the choice-decoding server (rudder.agent.server), not llama_cpp.server
        assert cmd[cmd.index(b"-m") + 1] == b"rudder.agent.server"
        assert cmd[cmd.index(b"--cache-mb") + 1] == str(NODE_CACHE_MB).encode()
        assert cmd[cmd.index(b"--n-batch") + 1] == str(NODE_N_BATCH).encode()
        assert first["turn_file"] == str(tmp_path / f"{first['node']}.turn")
        # every thread of it on that core (rudder.agent.server with one llama.cpp thread may be a
        # single thread between requests; a request's thread comes from a pinned one); a request
        # thread that ended while we looked is skipped
        affinity = {}
        for t in map(int, os.listdir(f"/proc/{server[0]}/task")):
            try:
                affinity[t] = os.sched_getaffinity(t)
            except ProcessLookupError:
                pass
        assert affinity and all(a == {core} for a in affinity.values()), affinity
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


def test_node_service_is_started_with_a_prompt_cache_and_a_turn_file(tmp_path, monkeypatch):
    """The study's node server keeps each trainer's state (--cache-mb), and its record names
    the turn file its trainers ask in turn on (RUDDER_AGENT_TURN)."""
    import subprocess

    from rudder.agent import service

    seen = {}

    class FakePopen:
        pid = 4242

        def __init__(self, argv, **kw):
            seen["argv"] = argv

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setattr(service, "_alive", lambda pid: False)
    rec = ensure_node_service(tmp_path, "smollm2-135m", threads=1)
    argv = seen["argv"]
    assert argv[argv.index("--cache-mb") + 1] == str(service.NODE_CACHE_MB)
    assert rec["turn_file"] == str(tmp_path / f"{rec['node']}.turn")
    argv = (ensure_node_service(tmp_path / "b", "smollm2-135m", cache_mb=0), seen["argv"])[1]
    assert "--cache-mb" not in argv
