"""Issue 18 (h18d): the past counterfactual and the `judge-history-2` prompt. At each window close
a replay plays the window's own minibatches again from the buffer as it was at its start, with
no round and with each round the policy names (Policy.past_rounds) at its first minibatch; the
window record carries the fetched rows of each (`past_keep_fetched`, `past_fetched_<label>`).
judge-history-2 shows them as "saved / cost" shares, its history as actions only; its prefix is
the same for every run, rank and window; the other variants are untouched (their pins:
test_step_contract)."""
from __future__ import annotations

import json

import jsonschema
import pytest

from rudder.agent.context import ContextBuilder
from rudder.agent.history_examples import HISTORY_CONTEXT, PAST_CANNED, PAST_CONTEXT
from rudder.agent.messages import Answer, HistoryEntry
from rudder.agent.signals import past_counterfactual, past_line
from rudder.agent.steering import past_rounds
from rudder.config import PrefetchConfig
from rudder.prefetch.policy import Replace
from rudder.sim.tracegen import random_trace

from past_replays import W  # tests/past_replays.py
from past_replays import run_rounds as _run

@pytest.fixture(scope="module")
def trace():
    return random_trace(halo=400, minibatches=40, batch=80, capacity=0.25, skew=0.8, epochs=2, seed=5,
                        init="random")


def test_the_past_counterfactual_equals_a_replay_of_each_branch(trace):
    C = trace.capacity
    rounds = {"big_stale": Replace("massivegnn", C, "t"), "small_half": Replace("massivegnn", C // 10, "t", stale_after=3.0)}
    # a run that never replaces: its keep branch is the window itself
    wins, _ = _run(trace, {}, rounds)
    assert len(wins) == 40 // W
    for w in wins:
        assert w["past_minibatches"] == W
        assert w["past_keep_fetched"] == w["fetched_rows"]
    # each round's branch: a run that applies that round (only) at the window's first minibatch
    saved_any = False
    for k in (1, 3, 6):
        for label, r in rounds.items():
            other, _ = _run(trace, {k * W: r}, None)
            assert "past_keep_fetched" not in other[k]  # not wanted: not measured
            assert wins[k][f"past_fetched_{label}"] == other[k]["fetched_rows"], (k, label)
            saved_any |= other[k]["fetched_rows"] != wins[k]["fetched_rows"]
    assert saved_any  # the branches differ somewhere (the test is not vacuous)
    # a run whose own rounds differ: the branches start from its own buffer, before its round
    mixed, _ = _run(trace, {2 * W: rounds["big_stale"]}, rounds)
    assert mixed[2]["past_fetched_big_stale"] == mixed[2]["fetched_rows"]
    assert mixed[2]["past_keep_fetched"] == wins[2]["fetched_rows"]


def test_every_budget_of_one_stale_threshold_equals_its_own_replay(trace):
    """The past counterfactual plans each stale threshold once and reads every budget off that
    plan (a smaller budget's plan is a prefix of a larger one's): each still equals a run that
    applies that round alone, budgets beyond the stale slots and an unbounded one included."""
    C = trace.capacity
    rounds = {f"b{n}": Replace("massivegnn", n, "t", stale_after=4.0) for n in (1, C // 10, C // 3, C, 10 * C)}
    rounds["all"] = Replace("massivegnn", None, "t", stale_after=4.0)
    rounds["period"] = Replace("massivegnn", C // 3, "t")
    wins, _ = _run(trace, {}, rounds)
    differ = set()
    for k in (1, 2, 5):
        for label, r in rounds.items():
            other, _ = _run(trace, {k * W: r}, None)
            assert wins[k][f"past_fetched_{label}"] == other[k]["fetched_rows"], (k, label)
            differ.add(other[k]["fetched_rows"])
    assert len(differ) > 3  # the budgets differ (not one number for all)


def test_measuring_changes_nothing_of_the_run(trace):
    C = trace.capacity
    at = {2 * W: Replace("massivegnn", C, "t")}
    a, ca = _run(trace, at, None)
    b, cb = _run(trace, at, {"x": Replace("massivegnn", C // 2, "t")})
    for k in ca:
        assert (ca[k] == cb[k]).all()
    # (t_past_cf, t_past_loader: the measuring's own seconds, in the windows it measured)
    strip = lambda ws: [{k: v for k, v in w.items() if not k.startswith(("past_", "t_past_"))} for w in ws]  # noqa: E731
    assert strip(a) == strip(b)


def test_past_rounds_are_every_budget_and_evict_word():
    pc = PrefetchConfig(lookahead=0, period=10, alpha=0.05)
    r = past_rounds(1000, pc)
    assert list(r) == ["small_stale", "medium_stale", "large_stale", "small_half", "medium_half", "large_half"]
    assert r["large_stale"].max_rows == 1000 and r["large_stale"].stale_after is None
    assert r["small_half"].max_rows == 50 and r["small_half"].stale_after == 5.0
    assert all(x.mechanism == "massivegnn" for x in r.values())


def test_the_line_shows_each_share_and_the_best():
    w = {"past_keep_fetched": 1000, **{f"past_fetched_{b}_{e}": v for (b, e), v in zip(
        [(b, e) for e in ("stale", "half") for b in ("small", "medium", "large")], [990, 950, 1000, 1020, 930, 1100])}}
    pc = past_counterfactual(w)
    assert pc["small/stale"] == pytest.approx(-0.01) and pc["medium/half"] == pytest.approx(-0.07)
    line = past_line(w)
    assert "small/stale saved 1.0%" in line and "large/stale no change" in line and "small/half cost 2.0%" in line
    assert line.endswith("best medium/half saved 7.0%")
    assert past_counterfactual({"hit_rate": 0.3}) is None and past_line({}) is None


def test_judge_history_2_builds_with_a_constant_prefix_and_actions_only():
    w = dict(PAST_CANNED[1]["window"], window=7, first_step=35, last_step=39)
    a = ContextBuilder(PAST_CONTEXT, "judge-history-2").build(w, [], PAST_CANNED[1]["recent"])
    b = ContextBuilder({**HISTORY_CONTEXT, "rank": 0, "part_id": 0, "capacity": 12_916, "halo_nodes": 51_665},
                       "judge-history-2").build(dict(w, window=3), [
                           HistoryEntry(decision=1, window=2, replace=True, budget="large", evict="half", rows=12916,
                                        expected_hit_rate="up", expected_remote_rows="down", correct=False,
                                        outcome_hit_rate="up", outcome_remote_rows="up", hit_delta=0.01,
                                        rows_delta=0.02)], [])
    assert a.messages[:-1] == b.messages[:-1]  # system + canned examples: one cached prefix
    assert a.hash == b.hash and a.variant == "judge-history-2"
    assert len(a.messages) == 1 + 2 * 4 + 1
    last = b.messages[-1]["content"]
    assert "- #1 window 2: replace large, evict half (12916 rows)" in last
    assert "correct" not in last and "wrong" not in last  # no before/after grade in this variant
    assert "best large/half saved 8.7%" in a.messages[-1]["content"]
    # the canned answers: valid, balanced, alternating, each reason quoting its window's best round
    answers = [json.loads(m["content"]) for m in a.messages[2:-1:2]]
    assert [x["replace"] for x in answers] == [False, True, False, True]
    for e, x in zip(PAST_CANNED, answers):
        Answer.model_validate(x)
        jsonschema.validate(x, a.schema)
        best = past_line(e["window"]).rsplit("; best ", 1)[1]
        assert best in x["reason"]
        assert (x["budget"] + "/" + x["evict"]) in best
    # judge-history's own prompt does not show it
    old = ContextBuilder(PAST_CONTEXT, "judge-history").build(w, [], []).messages[-1]["content"]
    assert "replayed" not in old


def test_judge_history_2b_shows_no_own_decisions():
    h = [HistoryEntry(decision=1, window=2, replace=False, budget="small", expected_hit_rate="flat",
                      expected_remote_rows="flat")]
    a = ContextBuilder(PAST_CONTEXT, "judge-history-2").build(PAST_CANNED[1]["window"], h, [])
    b = ContextBuilder(PAST_CONTEXT, "judge-history-2b").build(PAST_CANNED[1]["window"], h, [])
    assert a.messages[:-1] == b.messages[:-1] and a.hash != b.hash
    assert "- #1 window 2: keep" in a.messages[-1]["content"]
    assert "Recent decisions: none." in b.messages[-1]["content"] and "#1" not in b.messages[-1]["content"]


def test_the_past_counterfactual_over_several_windows(trace):
    """prefetch.past_windows 3: at each window close the replay starts at the start of the window
    two before (fewer at the run's first windows; never at the run's first minibatch, where no
    node had been missed yet, but for the first window itself) and runs over all three; its keep
    branch is the run itself when it never replaces, and each round's branch is a run that
    applies that round (only) there, summed over the windows spanned; the prompt says how many
    windows."""
    C = trace.capacity
    rounds = {"big_stale": Replace("massivegnn", C, "t"), "small_half": Replace("massivegnn", C // 10, "t", stale_after=3.0)}
    wins, _ = _run(trace, {}, rounds, past_windows=3)
    start = [0] + [max(1, k - 2) for k in range(1, len(wins))]  # the window each replay starts at
    for k, w in enumerate(wins):
        assert w["past_minibatches"] == (k - start[k] + 1) * W
        assert w.get("past_windows", 1) == k - start[k] + 1
        assert w["past_keep_fetched"] == sum(x["fetched_rows"] for x in wins[start[k]:k + 1])
    for k in (2, 3, 5):
        for label, r in rounds.items():
            other, _ = _run(trace, {start[k] * W: r}, None)
            assert wins[k][f"past_fetched_{label}"] == sum(x["fetched_rows"] for x in other[start[k]:k + 1]), (k, label)
    assert past_line(wins[4]).startswith("a round 3 windows ago (replayed on the 3 windows since) would have: ")
    assert past_line(wins[0]).startswith("a round at this window's start")


def test_a_round_with_nothing_to_swap_is_not_measured(trace):
    """`past_round_slots`: the most slots one of the replayed rounds swapped, each the rows a
    run applying that round there admits. A replay that starts at the run's first minibatch
    has no missed node to bring in, so every round swaps nothing: the prompt says that no round
    is measured yet rather than "no change"."""
    C = trace.capacity
    rounds = {"big_stale": Replace("massivegnn", C, "t"), "small_half": Replace("massivegnn", C // 10, "t", stale_after=3.0)}
    wins, _ = _run(trace, {}, rounds)
    assert wins[0]["past_round_slots"] == 0
    for k in (1, 3, 6):
        swapped = [_run(trace, {k * W: r}, None)[1]["admitted_rows"][k * W] for r in rounds.values()]
        assert wins[k]["past_round_slots"] == max(swapped) > 0, k
    unmeasured = "would have swapped no slot (no node had been missed before it, or no slot was stale)"
    assert past_line(wins[0]) == "a round at this window's start (replayed on its minibatches) " + unmeasured + \
        ": what a round does is not measured yet"
    assert unmeasured not in past_line(wins[1]) and "; best " in past_line(wins[1])
    # with past_windows 3, the windows after the first are not replayed from the run's start
    # (test_the_past_counterfactual_over_several_windows): each measures a round
    spanned, _ = _run(trace, {}, rounds, past_windows=3)
    assert [w["past_round_slots"] > 0 for w in spanned[:4]] == [False, True, True, True]
    # lookahead rounds swap per minibatch: no such field
    ahead, _ = _run(trace, {}, {"la": Replace("lookahead", C // 10, "misses")})
    assert "past_round_slots" not in ahead[1]


@pytest.mark.parametrize("offset", [0, 1 << 40])  # graph ids (counted densely) and sparse ones (sorted)
def test_later_accesses_are_counted_by_id(offset):
    """A window's accesses after its first minibatch, counted once and looked up per branch:
    equal to a count by hand, ids never accessed count 0, and ids no buffer holds (-1 in a
    replay's position space) count in the total only."""
    import numpy as np
    import torch

    from rudder.prefetch.past import _Later

    g = torch.Generator().manual_seed(0)
    remote = [torch.randint(0, 50, (n,), generator=g) + offset for n in (30, 40, 25, 35)]
    remote[2][:5] = -1
    later = _Later(remote)
    assert (later.ids is None) == (offset == 0)
    rest = torch.cat(remote[1:]).tolist()
    assert later.total == len(rest)
    query = np.array([offset + k for k in range(0, 60, 3)] + [offset + 10**6], dtype=np.int64)
    assert later.counts(query).tolist() == [rest.count(int(q)) for q in query]
    assert later.counts(np.zeros(0, dtype=np.int64)).size == 0
    assert _Later(remote[:1]).total == 0 and _Later(remote[:1]).counts(query).sum() == 0
