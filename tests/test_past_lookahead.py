"""Issue 18: the past counterfactual of lookahead rounds and the `judge-past` prompt. With
lookahead on, a "replace" decision is a lookahead round before every minibatch until the next
decision; the past counterfactual replays the window just closed from the buffer as it was at its
start with such a round before each of its minibatches (each planned on what was sampled ahead of
that minibatch in the run) and without. judge-past shows it beside judge's signals."""
from __future__ import annotations

import json

import jsonschema
import pytest

from rudder.agent.context import ContextBuilder
from rudder.agent.prompt_texts import CANNED_CONTEXT, JUDGE_PAST_CANNED
from rudder.agent.messages import Answer
from rudder.agent.signals import past_counterfactual, past_line
from rudder.agent.steering import past_rounds
from rudder.config import PrefetchConfig
from rudder.prefetch.policy import Replace
from rudder.sim.tracegen import random_trace

from past_replays import W, run_rounds  # tests/past_replays.py

DEPTH = 4


def _run(trace, at, wants, past_windows=1):
    return run_rounds(trace, at, wants, past_windows, depth=DEPTH)[0]


def _every(first: int, n: int, r: Replace) -> dict[int, Replace]:
    """The regime of one replace decision: its round before each of n minibatches from `first`."""
    return {s: r for s in range(first, first + n)}


@pytest.fixture(scope="module")
def trace():
    return random_trace(halo=400, minibatches=40, batch=80, capacity=0.25, skew=0.8, epochs=2, seed=7,
                        init="random")


def _rounds(C):
    return {"small": Replace("lookahead", C // 10, "t", "misses"), "large": Replace("lookahead", C, "t", "misses"),
            "large_any": Replace("lookahead", C, "t", "any")}


def test_a_lookahead_branch_equals_a_run_with_that_round_before_every_minibatch(trace):
    rounds = _rounds(trace.capacity)
    wins = _run(trace, {}, rounds)  # a run that never replaces: its keep branch is the window itself
    assert all(w["past_keep_fetched"] == w["fetched_rows"] for w in wins)
    saved = False
    for k in (1, 4, 7):
        for label, r in rounds.items():
            other = _run(trace, _every(k * W, W, r), None)
            assert wins[k][f"past_fetched_{label}"] == other[k]["fetched_rows"], (k, label)
            saved |= other[k]["fetched_rows"] < wins[k]["fetched_rows"]
            # one round at the window's first minibatch only is another branch (not the regime)
            once = _run(trace, {k * W: r}, None)
            if label == "large":
                assert once[k]["fetched_rows"] != other[k]["fetched_rows"]
    assert saved
    # a run in the replace regime: its own round's branch is the window itself, keep is no round
    own = _run(trace, _every(3 * W, W, rounds["large"]), rounds)
    assert own[3]["past_fetched_large"] == own[3]["fetched_rows"]
    assert own[3]["past_keep_fetched"] == wins[3]["fetched_rows"]


def test_over_several_windows_the_rounds_run_before_every_minibatch_spanned(trace):
    r = _rounds(trace.capacity)
    wins = _run(trace, {}, {"large_misses": r["large"]}, past_windows=2)
    other = _run(trace, _every(4 * W, 2 * W, r["large"]), None)
    assert wins[5]["past_windows"] == 2 and wins[5]["past_minibatches"] == 2 * W
    assert wins[5]["past_fetched_large_misses"] == other[4]["fetched_rows"] + other[5]["fetched_rows"]
    assert past_line(wins[5]).startswith("lookahead rounds before each minibatch of the last 2 windows")


def test_past_rounds_with_lookahead_are_every_budget_and_admission():
    pc = PrefetchConfig(lookahead=8, period=10, admit="misses")
    r = past_rounds(1000, pc, "lookahead")
    assert list(r) == [f"{b}_{a}" for a in ("misses", "any") for b in ("small", "medium", "large")]
    assert all(x.mechanism == "lookahead" for x in r.values())
    assert r["large_any"].admit == "any" and r["small_misses"].admit == "misses"
    assert [x.max_rows for x in r.values()][:3] == [50, 200, 1000]
    assert list(past_rounds(1000, pc))[:1] == ["small_stale"]  # MassiveGNN: as before


def test_the_line_names_lookahead_rounds_and_the_best_one():
    w = {"past_keep_fetched": 1000, "past_fetched_small_misses": 950, "past_fetched_medium_misses": 900,
         "past_fetched_large_misses": 890, "past_fetched_large_any": 1020}
    assert past_counterfactual(w) == pytest.approx(
        {"small/misses": -0.05, "medium/misses": -0.1, "large/misses": -0.11, "large/any": 0.02})
    line = past_line(w)
    assert line.startswith("lookahead rounds before each of this window's minibatches (replayed) would have: ")
    assert "small/misses saved 5.0%" in line and "large/any cost 2.0%" in line
    assert line.endswith("best large/misses saved 11.0%")


def test_judge_past_shows_the_replayed_rounds_and_its_examples_follow_them():
    w = dict(JUDGE_PAST_CANNED[1]["window"], window=4)
    a = ContextBuilder(CANNED_CONTEXT, "judge-past").build(w, [], [])
    b = ContextBuilder({**CANNED_CONTEXT, "rank": 1, "capacity": 7_000}, "judge-past").build(dict(w, window=9), [], [])
    assert a.messages[:-1] == b.messages[:-1] and a.variant == "judge-past"  # one cached prefix
    assert "lookahead rounds, replayed" in a.messages[0]["content"]
    assert "best large/misses saved 8.3%" in a.messages[-1]["content"]
    answers = [json.loads(m["content"]) for m in a.messages[2:-1:2]]
    assert [x["replace"] for x in answers] == [False, True, True]
    for e, x in zip(JUDGE_PAST_CANNED, answers):
        Answer.model_validate(x)
        jsonschema.validate(x, a.schema)
        best = past_counterfactual(e["window"])
        top = min(best, key=best.get)
        if x["replace"]:  # the budget and admission of the best replayed round, its saving quoted
            assert f'{x["budget"]}/{x["admit"]}' == top and f"best {top} {-100 * best[top]:.1f}%" in x["reason"].replace("saved ", "")
        else:
            assert -best[top] < 0.005
    # judge's own prompt does not show it; judge-past's design is its own
    old = ContextBuilder(CANNED_CONTEXT, "judge").build(w, [], [])
    assert "replayed" not in old.messages[-1]["content"] and old.hash != a.hash


def test_a_steering_policy_with_lookahead_measures_lookahead_rounds(trace, monkeypatch):
    """The steering skeleton asks for lookahead rounds where the run has lookahead and its decider
    wants the past (the agent with judge-past: rudder.agent.policy), none where it does not."""
    from rudder.agent.rule import RuleDecider
    from rudder.sim.simulate import parse_policy, simulate

    pc = PrefetchConfig(lookahead=DEPTH, period=6, window=W)
    plain = simulate(trace, parse_policy("rule", pc))
    assert not any("past_keep_fetched" in w for w in plain.windows)
    monkeypatch.setattr(RuleDecider, "wants_past", True)
    res = simulate(trace, parse_policy("rule", pc))
    assert len(res.windows) == 40 // W
    for w in res.windows:
        assert {"past_keep_fetched", "past_fetched_small_misses", "past_fetched_large_any"} <= set(w)
        assert not any(k.endswith(("_stale", "_half")) for k in w if k.startswith("past_fetched_"))
    # measuring changes nothing of the run
    assert plain.summary()["fetched_rows"] == res.summary()["fetched_rows"]


def test_a_past_prompt_must_fit_the_runs_rounds():
    """judge-past describes lookahead rounds, judge-history* a MassiveGNN round: a run config
    that pairs either with the other mechanism is refused, naming both keys."""
    from pydantic import ValidationError

    from rudder.config import RunConfig

    def cfg(prompt, lookahead, policy="agent"):
        return RunConfig.model_validate({"prefetch": {"policy": policy, "lookahead": lookahead},
                                         "agent": {"prompt": prompt}})

    with pytest.raises(ValidationError, match="judge-past shows lookahead rounds: it needs prefetch.lookahead > 0"):
        cfg("judge-past", 0)
    with pytest.raises(ValidationError, match="judge-history-2b is for runs without lookahead.*got 8"):
        cfg("judge-history-2b", 8)
    assert cfg("judge-past", 8).agent.prompt == "judge-past"
    assert cfg("judge-history-2b", 0).prefetch.lookahead == 0
    assert cfg("judge-past", 0, policy="fixed").prefetch.policy == "fixed"  # no agent: no prompt read


def test_a_round_of_an_unknown_mechanism_is_named(trace):
    with pytest.raises(ValueError, match="unknown replacement mechanism in past rounds: {'x': 'lru'}"):
        _run(trace, {}, {"x": Replace("lru", 10, "t")})
