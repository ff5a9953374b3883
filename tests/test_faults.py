"""Faults injected into real runs on emulated machines (network namespaces, synth-tiny): a
SIGSTOPped server ends the run by the progress watchdog with the culprit named; a rerun into the
same run folder starts clean; a SIGKILLed `rudder run` is marked interrupted by the next command
and its namespaces are removed. Every leftover check looks at this run's own cluster only."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rudder.cluster.watchdog import POLL_S
from rudder.config import RunConfig
from rudder.records import read_jsonl
from rudder.runner import execute_run, reconcile_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="emulated machines need root (network namespaces)"),
]

# The fault tests' cluster.progress_timeout_s: synth-tiny minibatches of 100 seeds, so a live run
# records several a second.
PROGRESS_BOUND_S = 12.0


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def cfg_for(tmp_path, data_root, **over) -> RunConfig:
    data = {
        "dataset": {"name": "synth-tiny", "root": str(data_root)},
        "train": {"epochs": 1, "batch_size": 100, "hidden": 8, "eval_every": 0},
        "prefetch": {"policy": "none", "record_trace": False},
        "cluster": {"machines": 2, "start_timeout_s": 150, "run_timeout_s": 600},
        "runs_dir": str(tmp_path / "runs"),
    }
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v}
    return RunConfig.model_validate(data)


def cluster_tag(run_dir: Path) -> str:
    return json.loads((run_dir / "cluster" / "result.json").read_text())["cluster"]


def leftovers(tag: str, pids=()) -> list[str]:
    assert tag
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found = [line for line in (ns + links).splitlines() if tag in line]
    found += [f"pid {p}" for p in pids if Path(f"/proc/{p}").exists()]
    return found


def wait_for(cond, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    return None


@pytest.mark.timeout(400)
def test_stopped_server_ends_the_run_naming_it(tmp_path, data_root):
    bound = PROGRESS_BOUND_S
    cfg = cfg_for(tmp_path, data_root, train={"epochs": 2000},
                  cluster={"progress_timeout_s": bound})
    run_dir = tmp_path / "runs" / "stopped"
    stopped: dict = {}

    def inject():
        def server_pid():
            if len(read_jsonl(run_dir / "minibatches-r0.jsonl")) < 5:
                return None
            try:
                st = json.loads((run_dir / "cluster" / "machine1.status.json").read_text())
            except (OSError, ValueError):
                return None
            return next((p["pid"] for p in st["procs"] if p["role"] == "server"), None)

        pid = wait_for(server_pid, 300)
        if pid:
            os.kill(pid, signal.SIGSTOP)
            stopped.update(pid=pid, at=time.time())

    t = threading.Thread(target=inject, daemon=True)
    t.start()
    res = execute_run(cfg, run_id="stopped")
    ended = time.time()
    t.join(5)
    assert stopped, "the fault was never injected"
    assert not res.ok
    assert "no progress for" in res.reason, res.reason
    assert f"server on machine 1 (pid {stopped['pid']}, stopped (T))" in res.reason, res.reason
    took = ended - stopped["at"]
    print(f"\nSIGSTOP server -> run ended in {took:.1f} s (bound {bound:g} s): {res.reason}")
    # silence is timed from the watchdog's last poll that saw a new record (every POLL_S), which
    # may fall up to a poll before the fault
    assert bound - POLL_S - 1 <= took < bound + 60
    run = json.loads((res.run_dir / "run.json").read_text())
    assert run["status"] == "failed" and run["reason"] == res.reason
    assert not leftovers(cluster_tag(res.run_dir), [stopped["pid"]])


@pytest.mark.timeout(400)
def test_link_down_inside_a_namespace_ends_the_run_naming_it(tmp_path, data_root):
    from rudder.cluster.netns import ClusterNet

    bound = PROGRESS_BOUND_S
    cfg = cfg_for(tmp_path, data_root, train={"epochs": 2000},
                  cluster={"progress_timeout_s": bound})
    run_dir = tmp_path / "runs" / "linkdown"
    done: dict = {}

    def inject():
        if not wait_for(lambda: len(read_jsonl(run_dir / "minibatches-r0.jsonl")) >= 5, 300):
            return
        from rudder.cluster.netns import state_dir

        for reg in state_dir().glob("rdr*.json"):
            try:
                net = ClusterNet.load(reg)
            except (OSError, ValueError, TypeError):  # another cluster's, mid-write
                continue
            if net.owner_pid == os.getpid():
                subprocess.run(["ip", "-n", net.namespace(1), "link", "set", net.ns_veth(1),
                                "down"], check=True)
                done.update(at=time.time(), veth=net.host_veth(1))

    t = threading.Thread(target=inject, daemon=True)
    t.start()
    res = execute_run(cfg, run_id="linkdown")
    ended = time.time()
    t.join(5)
    assert done, f"the fault was never injected ({res.reason})"
    assert not res.ok and "no progress for" in res.reason, res.reason
    assert f"links not up: link of machine 1 ({done['veth']} down)" in res.reason, res.reason
    assert bound - POLL_S - 1 <= ended - done["at"] < bound + 60  # (as above)
    assert not leftovers(cluster_tag(res.run_dir))


@pytest.mark.timeout(400)
def test_rerun_into_the_same_folder_starts_clean(tmp_path, data_root):
    cfg = cfg_for(tmp_path, data_root, train={"epochs": 1, "max_steps_per_epoch": 3})
    first = execute_run(cfg, run_id="again")
    assert first.ok, first.reason
    second = execute_run(cfg, run_id="again")
    assert second.ok, second.reason
    for r in range(2):
        epochs = read_jsonl(second.run_dir / f"epochs-r{r}.jsonl")
        assert [e["epoch"] for e in epochs] == [0]  # once: never appended to the first attempt's
        assert len(read_jsonl(second.run_dir / f"minibatches-r{r}.jsonl")) == 3
        assert (second.run_dir / "attempts" / "1" / f"epochs-r{r}.jsonl").exists()
    run = json.loads((second.run_dir / "run.json").read_text())
    assert run["attempt"] == 2 and run["earlier_attempts"][0]["status"] == "complete"
    assert not leftovers(cluster_tag(second.run_dir))


@pytest.mark.timeout(400)
def test_killed_parent_is_marked_interrupted_and_its_namespaces_removed(tmp_path, data_root):
    import yaml

    from rudder.cluster.netns import state_dir

    cfg = cfg_for(tmp_path, data_root, train={"epochs": 2000})
    cfgp = tmp_path / "c.yaml"
    cfgp.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run_dir = tmp_path / "runs" / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "rudder.cli", "run", "--config", str(cfgp),
                             "--run-id", "killed"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: len(read_jsonl(run_dir / "minibatches-r0.jsonl")) >= 3, 300)
        regs = [p for p in state_dir().glob("rdr*.json")
                if json.loads(p.read_text())["owner_pid"] == proc.pid]
        assert len(regs) == 1
        tag = regs[0].stem
        os.kill(proc.pid, signal.SIGKILL)  # no teardown, no final run.json
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    assert leftovers(tag)  # the namespaces outlived their owner
    # the next command that meets the run: here the same call `rudder collect` makes
    assert reconcile_run(run_dir).startswith("failed: interrupted")
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "failed" and run["reason"].startswith("interrupted")
    # the supervisors died with their owner (PDEATHSIG); cleanup removed only this dead owner's
    assert wait_for(lambda: not leftovers(tag), 30), leftovers(tag)
