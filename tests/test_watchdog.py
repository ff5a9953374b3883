"""ProgressWatchdog on its own: bounds derived from the measured minibatch time, silent trainers
named with their /proc state (a real SIGSTOPped process), finished trainers ignored."""
from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from rudder.cluster.watchdog import ProgressWatchdog, describe_state, process_state


def status(trainers: dict[int, int | None], server_pid: int | None = None, done=()) -> list[dict]:
    procs = [{"key": f"machine0/trainer{r}", "label": f"trainer {r} on machine 0",
              "role": "trainer", "rank": r, "pid": pid, "returncode": 0 if r in done else None}
             for r, pid in trainers.items()]
    if server_pid:
        procs.append({"key": "machine0/server", "label": "server on machine 0", "role": "server",
                      "rank": None, "pid": server_pid, "returncode": None})
    return [{"machine": 0, "procs": procs}]


def write_records(run_dir, rank, n, epoch=0, start=0):
    with open(run_dir / f"minibatches-r{rank}.jsonl", "a") as f:
        for i in range(start, start + n):
            f.write(json.dumps({"epoch": epoch, "step": i}) + "\n")


@pytest.fixture
def sleeper():
    p = subprocess.Popen(["sleep", "300"])
    yield p
    p.kill()
    p.wait()


def test_bound_before_first_record_then_derived_from_minibatch_time(tmp_path, sleeper):
    wd = ProgressWatchdog(tmp_path, first_s=100, floor_s=30, factor=10, poll_s=0)
    st = status({0: sleeper.pid})
    assert wd.check(st, now=0.0) == ""
    assert wd.check(st, now=99.0) == ""
    reason = wd.check(st, now=101.0)
    assert "before its first minibatch" in reason and "trainer 0 on machine 0" in reason
    assert f"pid {sleeper.pid}, " in reason  # and its state (sleeping, or running at exec)

    wd = ProgressWatchdog(tmp_path, first_s=100, floor_s=30, factor=10, poll_s=0)
    wd.check(st, now=0.0)
    t = 10.0
    write_records(tmp_path, 0, 1)
    wd.check(st, now=t)
    for i in range(1, 40):  # 5 s per minibatch: bound max(30, 10 x 5) = 50 s
        t += 5.0
        write_records(tmp_path, 0, 1, start=i)
        assert wd.check(st, now=t) == ""
    assert wd.bound_s(0) == pytest.approx(50.0)
    assert wd.check(st, now=t + 49) == ""
    reason = wd.check(st, now=t + 51)
    assert "no progress for 51 s" in reason and "median minibatch 5.000 s" in reason
    assert "after epoch 0 step 39" in reason


def test_fast_minibatches_use_the_floor_and_epoch_end_allows_validation(tmp_path, sleeper):
    (tmp_path / "context-r0.json").write_text(json.dumps({"steps_per_epoch": 20}))
    wd = ProgressWatchdog(tmp_path, first_s=100, floor_s=30, factor=10, poll_s=0)
    st = status({0: sleeper.pid})
    wd.check(st, now=0.0)
    t = 1.0
    for i in range(20):
        write_records(tmp_path, 0, 1, start=i)
        wd.check(st, now=t)
        t += 2.0
    # last step of the epoch: floor 30 s + a validation pass of up to 20 x 2 s
    assert wd.bound_s(0) == pytest.approx(30 + 20 * 2.0)
    assert wd.check(st, now=t + 60) == ""
    assert wd.check(st, now=t + 75)


def test_fixed_timeout_zero_off_and_finished_trainers_ignored(tmp_path, sleeper):
    st = status({0: sleeper.pid})
    off = ProgressWatchdog(tmp_path, timeout_s=0, poll_s=0)
    off.check(st, now=0.0)
    assert off.check(st, now=1e6) == ""
    fixed = ProgressWatchdog(tmp_path, timeout_s=5, first_s=50, poll_s=0)
    fixed.check(st, now=0.0)
    assert fixed.check(st, now=6.0) == ""  # start-up keeps max(5, first_s)
    assert "bound 50 s before the first minibatch" in fixed.check(st, now=51.0)
    write_records(tmp_path, 0, 1)
    fixed.check(st, now=52.0)
    assert fixed.check(st, now=56.0) == ""
    assert "bound 5 s" in fixed.check(st, now=58.0)
    done = ProgressWatchdog(tmp_path, timeout_s=5, poll_s=0)
    done.check(status({0: sleeper.pid}, done=(0,)), now=0.0)
    assert done.check(status({0: sleeper.pid}, done=(0,)), now=60.0) == ""
    with pytest.raises(ValueError):
        ProgressWatchdog(tmp_path, timeout_s=-1)


def test_a_stopped_process_is_named_with_its_state(tmp_path, sleeper):
    other = subprocess.Popen(["sleep", "300"])
    try:
        other.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_state(other.pid)["state"] != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert describe_state(process_state(other.pid)) == "stopped (T)"
        write_records(tmp_path, 0, 1)
        wd = ProgressWatchdog(tmp_path, timeout_s=5, poll_s=0)
        st = status({0: sleeper.pid}, server_pid=other.pid)
        wd.check(st, now=0.0)
        reason = wd.check(st, now=10.0)
        assert "silent trainer 0 on machine 0" in reason
        assert f"not running: server on machine 0 (pid {other.pid}, stopped (T))" in reason
    finally:
        other.kill()
        other.wait()
    assert process_state(other.pid) is None and describe_state(None) == "gone"


def test_torn_line_is_not_counted_until_complete(tmp_path, sleeper):
    wd = ProgressWatchdog(tmp_path, timeout_s=0.5, poll_s=0)
    st = status({0: sleeper.pid})
    wd.check(st, now=0.0)
    (tmp_path / "minibatches-r0.jsonl").write_text('{"epoch": 0, "st')
    wd.check(st, now=0.2)
    with open(tmp_path / "minibatches-r0.jsonl", "a") as f:
        f.write('ep": 3}\n')
    assert wd.check(st, now=0.4) == ""
    assert wd._ranks[0].records == 1 and wd._ranks[0].last == {"epoch": 0, "step": 3}


def test_records_seen_all_at_once_still_give_a_reason(tmp_path, sleeper):
    """The first look found several records at once: no minibatch time measured yet."""
    wd = ProgressWatchdog(tmp_path, first_s=100, floor_s=30, poll_s=0)
    st = status({0: sleeper.pid})
    write_records(tmp_path, 0, 6)
    wd.check(st, now=0.0)
    reason = wd.check(st, now=31.0)
    assert "no minibatch time measured yet" in reason and "after epoch 0 step 5" in reason
    assert wd.check([{"procs": [{"role": "trainer", "rank": "x", "pid": 1}]}], now=99) == ""


def test_a_link_that_is_not_up_is_named(tmp_path, sleeper):
    write_records(tmp_path, 0, 1)
    wd = ProgressWatchdog(tmp_path, timeout_s=5, poll_s=0,
                          links={"link of machine 0": "lo", "link of machine 1": "rdqnonexist0"})
    st = status({0: sleeper.pid})
    wd.check(st, now=0.0)
    reason = wd.check(st, now=6.0)
    # loopback's operstate is "unknown" (not up); a missing interface is "gone"
    assert "links not up: " in reason and "link of machine 1 (rdqnonexist0 gone)" in reason
