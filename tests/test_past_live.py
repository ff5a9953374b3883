"""Issue 18 (h18f): the past counterfactual computed live. The training loader (rudder.pipeline,
a plain tensor for the DistTensor) measures it with the replay's code (rudder.prefetch.past):
on the trace it recorded, a replay (rudder.sim.replay.BufferReplayer) gives every window the
same past_* numbers; a policy that does not ask gets none; a real 2-machine run carries them
(slow)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from rudder.pipeline import MinibatchPipeline, TimedCollate
from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.features import BufferedFeatures
from rudder.prefetch.metrics import MetricsCollector
from rudder.prefetch.past import PENDING, PastCounterfactual, index_copy, past_fields, settle
from rudder.prefetch.policy import Replace, ScriptedRounds
from rudder.sim.replay import BufferReplayer, PositionTrace, replay
from rudder.trace import Trace, TraceWriter

N, DIM, STEPS, EPOCHS, W, C = 2000, 4, 13, 3, 4, 150
ALPHA, PERIOD = 0.1, 6
FEAT = torch.arange(N * DIM, dtype=torch.float32).reshape(N, DIM)
HALO = torch.arange(N // 2, N)  # nodes N/2.. are remote, all of them halo nodes


def _rounds(depth: int) -> dict[str, Replace]:
    r = {"big": Replace("massivegnn", C, "t"), "half": Replace("massivegnn", C // 3, "t", stale_after=3.0)}
    if depth:
        r["ahead"] = Replace("lookahead", C // 4, "t")
    return r


def _at(depth: int) -> dict[int, Replace]:
    """The run's own rounds, at windows 1, 3 and 6's first minibatches (window 1's is a past round)."""
    return {W: _rounds(depth)["half"], 3 * W: Replace("massivegnn", C // 4, "t", stale_after=3.0),
            6 * W: Replace("lookahead", C // 5, "t") if depth else Replace("massivegnn", C // 2, "t")}


def sampled(epoch: int):
    """Minibatches of unique ids: 20 local seeds and ~150 remote ids drawn with a skew (reuse)."""
    g = torch.Generator().manual_seed(100 + epoch)
    collate = TimedCollate(lambda seeds: (torch.unique(torch.cat([
        seeds, N // 2 + (torch.rand(220, generator=g) ** 2.5 * (N // 2)).long()])), seeds, None))
    for _ in range(STEPS):
        yield collate(torch.randperm(N // 2, generator=g)[:20])


def live(depth: int, wants: dict[str, Replace] | None, past_thread: bool = False) -> tuple[list[dict], Trace]:
    """Trains the loader's side (the training thread only takes the minibatches): the window
    records it made (settled, as the run's writer does: past_thread measures off the loader) and
    the trace it recorded."""
    buf = HaloBuffer(HALO, C, DIM, alpha=ALPHA, period=PERIOD)
    init = torch.sort(HALO[torch.randperm(HALO.numel(), generator=torch.Generator().manual_seed(3))[:C]]).values
    buf.fill(init, FEAT[init])
    feats = BufferedFeatures(FEAT, lambda ids: (ids >= N // 2).long(), 0, buf, local_id=0)
    writer = TraceWriter("unused.npz", HALO, init, C)
    pipe = MinibatchPipeline(sampled, feats, torch.arange(N) % 3, ScriptedRounds(_at(depth), wants), MetricsCollector(W),
                             STEPS, EPOCHS, depth, queue_size=2, trace_writer=writer, past_thread=past_thread)
    windows = []
    for epoch in range(EPOCHS):
        for mb in pipe.epoch(epoch):
            assert torch.equal(mb.feats, FEAT[mb.input_nodes])  # the measurement moved no row
            if mb.window is not None:
                windows.append(settle(mb.window))
    return windows, writer.trace()


def replayed(trace: Trace, depth: int, wants) -> list[dict]:
    pt = PositionTrace(trace)
    pol = ScriptedRounds(_at(depth), wants)
    rp = BufferReplayer(pt, pol, C, alpha=ALPHA, period=PERIOD, depth=depth, window=W)
    rp.fill(trace.init_positions())
    replay(pt, rp)
    return rp.windows


def past(w: dict) -> dict:
    return {k: v for k, v in w.items() if k.startswith("past_")}


@pytest.mark.parametrize("past_thread", [False, True])
@pytest.mark.parametrize("depth", [0, 2])
def test_live_windows_carry_the_replays_past_counterfactual(depth, past_thread):
    """The same accesses through the loader and through the replay: every window's past_*
    fields equal, the measured seconds in the live record, the run's own counts untouched;
    measured on the loader thread or off it (prefetch.past_thread)."""
    rounds = _rounds(depth)
    lw, trace = live(depth, rounds, past_thread)
    assert trace.num_minibatches == STEPS * EPOCHS and len(lw) == STEPS * EPOCHS // W
    rw = replayed(trace, depth, rounds)
    assert [past(w) for w in lw] == [past(w) for w in rw]
    assert [w["fetched_rows"] for w in lw] == [w["fetched_rows"] for w in rw]  # the same run
    for w in lw:
        assert set(past(w)) == {"past_minibatches", "past_keep_fetched", "past_round_slots",
                                *(f"past_fetched_{k}" for k in rounds)}
        assert w["past_minibatches"] == W and 0 <= w["t_past_cf"] < 5.0
    # without a round of its own in the window, the keep branch is the window itself
    own = {g // W for g in _at(depth)}
    assert all(w["past_keep_fetched"] == w["fetched_rows"] for w in lw if w["window"] not in own)
    assert any(w["past_keep_fetched"] != w["fetched_rows"] for w in lw if w["window"] in own)
    assert lw[1]["past_fetched_half"] == lw[1]["fetched_rows"]  # the branch of the run's own round
    # not vacuous: some round would have changed some window's rows, either way
    diffs = [w[f"past_fetched_{k}"] - w["past_keep_fetched"] for w in lw for k in rounds]
    assert min(diffs) < 0 < max(diffs)
    # a policy that does not ask: no past field, no time, the same run
    plain, _ = live(depth, None)
    assert all(not past(w) and "t_past_cf" not in w for w in plain)
    def counts(ws):  # the window records without the measurement and the timings
        return [{k: v for k, v in w.items() if not k.startswith(("past_", "t_"))} for w in ws]

    assert counts(plain) == counts(lw)


def test_the_index_copy_holds_no_rows_and_replays_alike():
    buf = HaloBuffer(HALO, C, DIM, alpha=ALPHA, period=PERIOD)
    buf.fill(HALO[:C], FEAT[HALO[:C]])
    cp = index_copy(buf)
    assert cp.feats.numel() == 0 and not cp.store_features and buf.feats.shape == (C, DIM)
    assert torch.equal(cp.slot_of, buf.slot_of) and cp.slot_of.data_ptr() != buf.slot_of.data_ptr()
    ids = [N // 2 + torch.randperm(N // 2, generator=torch.Generator().manual_seed(s))[:200] for s in range(3)]
    rounds = {"r": Replace("massivegnn", C, "t", stale_after=1.0)}
    a = past_fields(index_copy(buf), ids, rounds)
    b = past_fields(cp, ids, rounds)
    assert a == b and a["past_minibatches"] == 3
    assert torch.equal(buf.feats, FEAT[HALO[:C]]) and buf.size == C  # the buffer itself untouched


def test_a_window_closed_before_it_opened_measures_nothing():
    pc = PastCounterfactual(lambda: {"r": Replace("massivegnn", 1, "t")})
    w = {}
    pc.close(w)
    assert w == {}


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="emulated machines need root (network namespaces)")
def test_a_real_run_carries_the_past_counterfactual_when_the_policy_asks(tmp_path):
    """2 emulated machines, synth-small, history only from a cold buffer. The agent with
    judge-history-2b asks (its model file does not load: every answer falls back to
    static, so the run replaces never and a replay of its trace is the same run): every window
    of both trainers carries the past counterfactual with its seconds, equal to the replay's
    on the recorded trace. With judge-history (no past variant) no window carries any."""
    from rudder.agent.steering import past_rounds
    from rudder.config import RunConfig
    from rudder.records import read_jsonl
    from rudder.runner import execute_run

    junk = tmp_path / "not-a-model.gguf"
    junk.write_bytes(b"not a GGUF file")

    def run(prompt: str):
        cfg = RunConfig.model_validate({
            "dataset": {"name": "synth-small", "root": str(tmp_path / "data")},
            "train": {"epochs": 2, "batch_size": 500, "hidden": 16, "eval_every": 0},
            "prefetch": {"policy": "agent", "lookahead": 0, "init": "random", "period": 10, "window": 5,
                         "alpha": 0.05},
            "agent": {"prompt": prompt, "model": {"name": "broken", "path": str(junk)}, "start_decision": False},
            "cluster": {"machines": 2, "start_timeout_s": 120, "run_timeout_s": 400},
            "runs_dir": str(tmp_path / "runs"),
        })
        res = execute_run(cfg)
        assert res.ok, res.reason
        return cfg, res.run_dir

    cfg, run_dir = run("judge-history-2b")
    _, plain = run("judge-history")
    for r in (0, 1):
        windows = read_jsonl(run_dir / f"windows-r{r}.jsonl")
        decisions = read_jsonl(run_dir / f"decisions-r{r}.jsonl")
        assert windows and all(d.get("applied_step") is None or not d["replace"] for d in decisions)
        trace = Trace.load(run_dir / f"trace-r{r}.npz")
        rounds = past_rounds(trace.capacity, cfg.prefetch)
        assert all(w["past_minibatches"] == 5 and w["t_past_cf"] > 0 for w in windows)
        # measured off the loader (prefetch.past_thread, the default): every window written once
        # measured, in order, with the loader's share of the seconds
        assert [w["window"] for w in windows] == list(range(len(windows)))
        assert all(PENDING not in w and w["t_past_loader"] >= 0 for w in windows)
        assert all(set(past(w)) == {"past_minibatches", "past_keep_fetched", "past_round_slots",
                                    *(f"past_fetched_{k}" for k in rounds)}
                   for w in windows)
        pt = PositionTrace(trace)
        rp = BufferReplayer(pt, ScriptedRounds({}, rounds), trace.capacity, alpha=0.05, period=10, depth=0, window=5)
        rp.fill(trace.init_positions()[:trace.capacity])
        replay(pt, rp)
        assert [past(w) for w in windows] == [past(w) for w in rp.windows[:len(windows)]]
        assert [w["fetched_rows"] for w in windows] == [w["fetched_rows"] for w in rp.windows[:len(windows)]]
        assert any(w["past_fetched_large_stale"] != w["past_keep_fetched"] for w in windows)
        t = np.array([w["t_past_cf"] for w in windows])
        print(f"\nrank {r}: {len(windows)} windows, t_past_cf median {np.median(t) * 1e3:.1f} ms, max {t.max() * 1e3:.1f} ms")
    windows = read_jsonl(plain / "windows-r0.jsonl")
    assert windows and not any(past(w) or "t_past_cf" in w for w in windows)
    assert json.loads((plain / "run.json").read_text())["config"]["agent"]["prompt"] == "judge-history"
