"""Issue 18 (must-have 6): the past counterfactual off the loader thread (prefetch.past_thread).
The loader keeps the index copy at a window's start and hands the close's replays to a worker;
the window carries a future (PENDING) until `settle` merges it in. The fields are the loader's
own, window by window (one round and several windows spanned, MassiveGNN and lookahead rounds);
the close returns before the measurement ends; a measurement's error surfaces where the window
is settled; the run's record writer writes each window once measured, in order, never waiting
(tests/test_past_live.py: the live loader's windows, settled, are the replay's)."""
from __future__ import annotations

import threading

import pytest
import torch

from rudder.prefetch import past as past_mod
from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.past import PENDING, PastCounterfactual, settle
from rudder.prefetch.policy import Replace
from rudder.sim.tracegen import random_trace

from past_replays import W, run_rounds  # tests/past_replays.py


@pytest.fixture(scope="module")
def trace():
    return random_trace(halo=400, minibatches=40, batch=80, capacity=0.25, skew=0.8, epochs=2, seed=7,
                        init="random")


def _windows(trace, wants, past_windows: int, depth: int, background: bool) -> list[dict]:
    """The window records of a replay whose own rounds are a MassiveGNN one and a lookahead one,
    the past counterfactual measured on the loader's thread or off it (settled after)."""
    C = trace.capacity
    at = {2 * W: Replace("massivegnn", C // 3, "t"),
          5 * W: Replace("lookahead", C // 4, "t") if depth else Replace("massivegnn", C // 2, "t")}
    return run_rounds(trace, at, wants, past_windows, depth, background)[0]


def _fields(w: dict) -> dict:
    return {k: v for k, v in w.items() if not k.startswith("t_")}


@pytest.mark.parametrize("past_windows,depth", [(1, 0), (3, 0), (1, 2), (2, 2)])
def test_off_the_loader_the_fields_are_the_loaders_own(trace, past_windows, depth):
    C = trace.capacity
    wants = {"big_stale": Replace("massivegnn", C, "t"),
             "small_half": Replace("massivegnn", C // 10, "t", stale_after=3.0)}
    if depth:
        wants["ahead_any"] = Replace("lookahead", C // 5, "t", admit="any")
    inline = _windows(trace, wants, past_windows, depth, background=False)
    off = _windows(trace, wants, past_windows, depth, background=True)
    assert len(off) == len(inline) == 40 // W
    assert [_fields(w) for w in off] == [_fields(w) for w in inline]
    assert all(PENDING not in w and w["past_keep_fetched"] > 0 for w in off)
    # the loader's share is its own field; on the loader thread it is the whole measurement
    assert all(w["t_past_loader"] == w["t_past_cf"] for w in inline)
    assert all(w["t_past_loader"] >= 0 and w["t_past_cf"] > 0 for w in off)
    # not vacuous: the rounds would have changed some window's rows
    assert any(w["past_fetched_big_stale"] != w["past_keep_fetched"] for w in off)


def _one_window(pc: PastCounterfactual) -> dict:
    halo = torch.arange(100, 300)
    buf = HaloBuffer(halo, 50, 0, alpha=0.1, period=4)
    buf.fill(halo[:50])
    g = torch.Generator().manual_seed(0)
    for _ in range(W):
        pc.step(buf, torch.unique(100 + torch.randint(0, 200, (60,), generator=g)))
    window: dict = {"window": 0}
    pc.close(window)
    return window


def test_the_close_returns_before_the_measurement_ends(monkeypatch):
    """The loader is not held: close() hands the replays over and returns; the window waits in
    `settle` (the writer, the agent's thread) until they end, then holds the fields."""
    release, started = threading.Event(), threading.Event()

    def slow_fields(*args, **kwargs):
        started.set()
        release.wait(10)
        return {"past_minibatches": W, "past_keep_fetched": 1}

    monkeypatch.setattr(past_mod, "past_fields", slow_fields)
    pc = PastCounterfactual(lambda: {"big": Replace("massivegnn", 50, "t")}, background=True)
    window = _one_window(pc)
    assert PENDING in window and "past_keep_fetched" not in window  # handed over, not measured
    assert started.wait(10) and not window[PENDING].done()  # running on the worker meanwhile
    release.set()
    assert settle(window) is window
    assert window["past_keep_fetched"] == 1 and PENDING not in window and window["t_past_cf"] > 0
    assert settle(window) == window  # settled once; again a no-op
    pc.shutdown()


def test_a_measurement_error_surfaces_where_the_window_is_settled():
    pc = PastCounterfactual(lambda: {"odd": Replace("nonsense", 5, "t")}, background=True)
    window = _one_window(pc)
    with pytest.raises(ValueError, match="unknown replacement mechanism in past rounds: {'odd': 'nonsense'}"):
        settle(window)
    pc.shutdown()
    # on the loader thread the same error is raised by the close itself
    with pytest.raises(ValueError, match="unknown replacement mechanism"):
        _one_window(PastCounterfactual(lambda: {"odd": Replace("nonsense", 5, "t")}))


def test_the_record_writer_never_waits_and_keeps_the_order(tmp_path):
    """The run's record writer (rudder.train.RecordFiles) writes a window once its measurement
    has ended, the windows in order, without waiting for one (the training thread calls it);
    its close waits for what is still measured."""
    import json
    from concurrent.futures import Future

    from rudder.train import RecordFiles

    out = RecordFiles(tmp_path, 0)
    futures = {k: Future() for k in (0, 1, 3)}  # windows 0, 1 and 3 measured off the loader

    def written() -> list[dict]:
        return [json.loads(line) for line in (tmp_path / "windows-r0.jsonl").read_text().splitlines()]

    def at_once(**kw) -> None:  # a write that waited would leave its thread alive
        t = threading.Thread(target=out.write, kwargs=kw, daemon=True)
        t.start()
        t.join(5)
        assert not t.is_alive(), "the writer waited for a measurement"

    at_once(window={"window": 0, PENDING: futures[0]})
    at_once(window={"window": 1, PENDING: futures[1]})
    futures[1].set_result({"past_keep_fetched": 11})
    at_once(window={"window": 2})  # window 1 is measured, window 0 not yet: nothing is written
    assert written() == []
    futures[0].set_result({"past_keep_fetched": 10})
    at_once()
    assert written() == [{"window": 0, "past_keep_fetched": 10}, {"window": 1, "past_keep_fetched": 11},
                         {"window": 2}]
    at_once(window={"window": 3, PENDING: futures[3]})
    threading.Timer(0.2, futures[3].set_result, [{"past_keep_fetched": 13}]).start()
    out.close()
    assert written()[-1] == {"window": 3, "past_keep_fetched": 13}
