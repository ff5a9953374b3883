"""agent.backend=last-example (rudder.agent.last_example): a control decider answering every
prompt with its last example's answer, no model. With judge-history-3 that is the held-out pool's
nearest window's answer (a 1-nearest-neighbour lookup); with fixed examples, one answer always
(issue 18, BENCHMARKS 7t: what the small models do)."""
from __future__ import annotations

import json

import pytest

from rudder.agent.context import ContextBuilder
from rudder.agent.decision import DecisionMaker
from rudder.agent.history_examples import PAST_CANNED, PAST_CONTEXT, example_pool
from rudder.agent.policy import service_url
from rudder.config import AgentConfig, PrefetchConfig
from rudder.sim.simulate import parse_policy, simulate
from rudder.sim.tracegen import random_trace


def _maker() -> DecisionMaker:
    return DecisionMaker.from_config(AgentConfig(backend="last-example", fallback="static"))


def test_it_answers_the_nearest_pool_window_under_retrieval():
    pool = example_pool()
    maker = _maker()
    seen = set()
    for e in pool.entries[:12]:
        b = ContextBuilder(PAST_CONTEXT, "judge-history-3")
        d = maker.decide(b.build(e["window"], [], e["recent"]))
        nearest = pool.example(pool.nearest(e["window"], e["recent"], PAST_CONTEXT["capacity"])[-1])["answer"]
        assert d.fallback is None and d.backend == "last-example" and d.model == "last-example"
        assert (d.replace, d.budget, d.evict) == (nearest["replace"], nearest["budget"], nearest["evict"])
        seen.add(d.replace)
    assert seen == {True, False}  # the lookup answers both ways over the pool's windows


def test_fixed_examples_give_one_answer_and_no_example_falls_back():
    maker = _maker()
    last = PAST_CANNED[-1]["answer"]
    for e in PAST_CANNED:
        d = maker.decide(ContextBuilder(PAST_CONTEXT, "judge-history-2b").build(e["window"], [], e["recent"]))
        assert (d.replace, d.budget, d.evict) == (last["replace"], last["budget"], last["evict"])
        assert json.loads(d.raw) == last
    w = PAST_CANNED[0]
    d = maker.decide(ContextBuilder(PAST_CONTEXT, "reason-first").build(w["window"], [], w["recent"]))
    assert d.fallback == "static" and "no example answer" in d.reason


def test_it_needs_no_model_or_service(monkeypatch):
    monkeypatch.setenv("RUDDER_AGENT_URL", "http://127.0.0.1:9")  # a node service: not used
    assert service_url(AgentConfig(backend="last-example")) is None
    with pytest.raises(ValueError, match="last-example"):
        AgentConfig(backend="last-exampel")


def test_a_replay_steers_with_it():
    trace = random_trace(halo=400, minibatches=40, batch=80, capacity=0.25, skew=0.8, epochs=2, seed=7,
                         init="random")
    pc = PrefetchConfig(policy="agent", lookahead=0, window=5, period=10, init="random")
    agent = AgentConfig(prompt="judge-history-2b", backend="last-example", timeout_s=30)
    res = simulate(trace, parse_policy("agent", pc), extra={"agent": agent}, agent_wait_s=30.0)
    ds = sorted(res.decisions, key=lambda d: d["decision"])
    last = PAST_CANNED[-1]["answer"]
    assert len(ds) == 8 and all(d["fallback"] is None for d in ds)
    assert all((d["replace"], d["budget"], d["evict"]) == (True, last["budget"], last["evict"]) for d in ds)
    assert res.total("replaced_rows") > 0  # its rounds ran
