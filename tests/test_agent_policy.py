"""AgentPolicy: plan() never waits for the model, late decisions carry their staleness, bad
answers hand over to the fallback policy, and self-reflection scores predictions (Pass@1)."""
import json
import threading
import time

import pytest

from rudder.agent.decision import BackendError, Completion, DecisionMaker
from rudder.agent.messages import BUDGET_SHARE, budget_rows, conclusion
from rudder.agent.policy import AgentPolicy, measure, reflect
from rudder.agent.messages import Decision
from rudder.config import AgentConfig, ModelConfig, PrefetchConfig
from rudder.prefetch.policies import make_policy
from rudder.prefetch.policy import Replace, RunContext, StepInfo
from rudder.records import DECISION_FIELDS


def answer(replace=True, budget="medium", hit="up", rows="down"):
    return {"reason": "test" + conclusion(replace), "replace": replace, "budget": budget, "expected": {"hit_rate": hit, "remote_rows": rows}}


class ScriptedBackend:
    """Stands in for the model: answers from a script (dicts, or exceptions), after `delay` s."""

    name = "fake"

    def __init__(self, answers, delay=0.0):
        self.answers = list(answers)
        self.delay = delay
        self.prompts = []
        self.calls = 0

    def complete(self, messages, schema, max_tokens, timeout_s, cancel=None):
        self.prompts.append(messages)
        a = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if isinstance(a, Exception):
            raise a
        if isinstance(a, str):
            return Completion(a, "stop")
        return Completion(json.dumps(a), "stop")

    def close(self):
        pass


def ctx(window=5, lookahead=3, capacity=1000):
    return RunContext(rank=0, num_trainers=1, part_id=0, num_parts=2, num_nodes=10_000, partition_nodes=5_000,
                      halo_nodes=4_000, capacity=capacity, batch_size=100, fanouts=[10, 25], steps_per_epoch=100,
                      epochs=1, feat_dim=8, feat_bytes=32, window=window, lookahead=lookahead)


def make(backend, window=5, fallback="static", timeout_s=5.0, period=25, **agent):
    maker = DecisionMaker(backend, "fake", fallback=fallback, timeout_s=timeout_s)
    pol = AgentPolicy(PrefetchConfig(policy="agent", window=window, period=period),
                      agent=AgentConfig(fallback=fallback, timeout_s=timeout_s, **agent), decision_maker=maker)
    return pol


def win(i, hit, fetched_per_mb, n=5, **kw):
    w = {"window": i, "first_step": i * n, "last_step": i * n + n - 1, "minibatches": n, "hit_rate": hit,
         "remote_rows": 1000 * n, "fetched_rows": fetched_per_mb * n, "replaced_rows": 0, "t_fetch": 0.0,
         "t_stall": 0.0, "t_minibatch": 0.0, "buffer_fill": 1000, "stale_slots": 300,
         "lookahead_missing": 500, "lookahead_rows": 50}
    w.update(kw)
    return w


def step(g, total=100):
    return StepInfo(epoch=0, step=g, global_step=g, remaining_steps=total - g)


def wait_outbox(pol, timeout=5.0):
    deadline = time.monotonic() + timeout
    while pol.decider._outbox.qsize() == 0:
        assert time.monotonic() < deadline, "no decision arrived"
        time.sleep(0.005)


def test_registered_as_agent():
    pol = make_policy(PrefetchConfig(policy="agent"), agent=AgentConfig())
    assert isinstance(pol, AgentPolicy) and pol.records_decisions


def test_plan_never_blocks_with_a_slow_model():
    backend = ScriptedBackend([answer(True, "medium")], delay=0.25)
    pol = make(backend)
    pol.setup(ctx())
    times, replaces = [], []
    for g in range(80):
        t0 = time.perf_counter()
        r = pol.plan(step(g))
        times.append(time.perf_counter() - t0)
        if r is not None:
            replaces.append((g, r))
        time.sleep(0.01)  # the minibatch "computes"
        pol.observe({"global_step": g}, win(g // 5, 0.3, 700) if g % 5 == 4 else None)
    time.sleep(0.3)
    pol.plan(step(80))
    pol.close()
    # a plan() that waited for an answer would take the model's 0.25 s; a poll takes well under
    # a millisecond, and the max only bounds a preempted one on a loaded host
    assert sorted(times)[len(times) // 2] < 0.005 and max(times) < 0.05, \
        f"median plan() {sorted(times)[len(times) // 2] * 1e3:.2f} ms, slowest {max(times) * 1e3:.2f} ms"
    assert replaces, "no decision arrived"
    g0, r0 = replaces[0]
    assert r0.mechanism == "lookahead" and r0.max_rows == budget_rows("medium", 1000)
    assert r0.source.startswith("agent#")
    # every answer says replace: from the first arrival on, a round runs on every minibatch
    assert [g for g, _ in replaces] == list(range(g0, 80))
    recs = pol.decisions()
    assert recs and all(set(r) == set(DECISION_FIELDS) for r in recs)
    applied = [r for r in recs if r["applied_step"] is not None]
    assert applied and all(r["staleness"] > 0 for r in applied)
    assert all(r["applied_step"] - r["staleness"] == r["window"] * 5 + 4 for r in applied)
    assert pol.dropped_windows > 0  # the agent fell behind: oldest windows were dropped, not queued
    assert backend.calls < 16  # it judged fewer windows than closed


def test_massivegnn_mechanism_without_lookahead():
    """Without lookahead a replace decision is one MassiveGNN round (it swaps every stale slot at
    once), at the step the decision arrives; the following minibatches run none."""
    pol = make(ScriptedBackend([answer(True, "large")]))
    pol.setup(ctx(lookahead=0))
    assert pol.wait_for_decision(0.05) is False
    pol.observe({"global_step": 4}, win(0, 0.3, 700))
    assert pol.wait_for_decision(5.0)
    r = pol.plan(step(5))
    later = [pol.plan(step(g)) for g in range(6, 10)]
    pol.close()
    assert r.mechanism == "massivegnn" and r.max_rows == budget_rows("large", 1000) and r.source == "agent#1"
    assert later == [None] * 4


def drive(pol, windows, steps_per_window=5):
    """Closes each window, waits for its decision, then plans the next window's minibatches
    (as a zero-latency agent); returns {global step: Replace or None}."""
    plans = {}
    for i, w in enumerate(windows):
        pol.observe({"global_step": w["last_step"]}, w)
        assert pol.wait_for_decision(5.0)
        for g in range((i + 1) * steps_per_window, (i + 2) * steps_per_window):
            plans[g] = pol.plan(step(g))
    return plans


def test_lookahead_replace_decision_holds_a_round_every_minibatch_until_the_next():
    """With lookahead, replace=true sets a regime: the same lookahead round (budget rows) on every
    minibatch until the next decision arrives; replace=false stops the rounds; a new replace
    decision starts its own regime with its own budget."""
    backend = ScriptedBackend([answer(True, "medium"), answer(True, "medium"), answer(False, "small", "flat", "flat"),
                               answer(True, "large")])
    pol = make(backend)
    pol.setup(ctx(lookahead=3, capacity=1000))
    plans = drive(pol, [win(i, 0.3, 700) for i in range(4)])
    pol.close()
    medium, large = budget_rows("medium", 1000), budget_rows("large", 1000)
    assert medium < large
    for g in range(5, 10):  # decision #1 (window 0): the medium budget, every minibatch
        assert plans[g] == Replace("lookahead", medium, "agent#1"), g
    for g in range(10, 15):  # #2 arrives at step 10 and takes over
        assert plans[g] == Replace("lookahead", medium, "agent#2"), g
    assert [plans[g] for g in range(15, 20)] == [None] * 5  # #3 keep: no rounds at all
    for g in range(20, 25):  # #4: the large budget
        assert plans[g] == Replace("lookahead", large, "agent#4"), g
    recs = {r["decision"]: r for r in pol.decisions()}
    assert [recs[n]["applied_step"] for n in (1, 2, 3, 4)] == [5, 10, 15, 20]  # applied once each


def test_fallback_ends_a_replace_regime():
    """A bad answer hands over to the fallback (static: never replaces), so the agent's standing
    replace regime stops at once; the next valid replace answer starts a new one."""
    backend = ScriptedBackend([answer(True, "small"), "not json", answer(True, "small")])
    pol = make(backend, fallback="static")
    pol.setup(ctx(lookahead=3, capacity=1000))
    plans = drive(pol, [win(i, 0.3, 700) for i in range(3)])
    pol.close()
    small = budget_rows("small", 1000)
    assert all(plans[g] == Replace("lookahead", small, "agent#1") for g in range(5, 10))
    assert [plans[g] for g in range(10, 15)] == [None] * 5  # static fallback
    assert all(plans[g] == Replace("lookahead", small, "agent#3") for g in range(15, 20))


def test_reflection_scores_predictions_and_feeds_history():
    backend = ScriptedBackend([answer(True, "medium", "up", "down"),   # #1 on w0
                               answer(True, "small", "up", "down"),    # #2 on w1
                               answer(False, "small", "flat", "flat"),  # #3 on w2
                               answer(False, "small", "flat", "flat")])
    pol = make(backend, history=4, prompt="reason-first")
    pol.setup(ctx())
    windows = [win(0, 0.30, 800), win(1, 0.35, 700), win(2, 0.355, 690), win(3, 0.352, 695)]
    for i, w in enumerate(windows):
        pol.observe({"global_step": w["last_step"]}, w)
        if i < 3:
            wait_outbox(pol)
            r = pol.plan(step(w["last_step"] + 1))
            assert (r is not None) == (i < 2)
    wait_outbox(pol)  # decision #4 on w3 (never applied)
    recs = {r["decision"]: r for r in pol.decisions()}
    # #1: +5 pt hit, -12.5% rows -> up/down as predicted
    assert recs[1]["outcome_hit_rate"] == "up" and recs[1]["outcome_remote_rows"] == "down" and recs[1]["correct"]
    # ... and the same outcome as numbers: hit-rate delta in fraction units, relative rows delta
    assert recs[1]["outcome_hit_delta"] == pytest.approx(0.05)
    assert recs[1]["outcome_rows_delta"] == pytest.approx(-0.125)
    assert recs[2]["outcome_hit_delta"] == pytest.approx(0.005)
    # #2: +0.5 pt (< 1 pt) and -1.4% rows (< 2%) -> flat/flat, predicted up/down: wrong
    assert recs[2]["outcome_hit_rate"] == "flat" and recs[2]["outcome_remote_rows"] == "flat"
    assert recs[2]["correct"] is False
    # #3: kept, predicted flat/flat, measured flat/flat
    assert recs[3]["correct"] is True
    assert pol.pass_at_1 == pytest.approx(2 / 3)
    hist = pol.history()
    assert hist[0].hit_delta == pytest.approx(0.05) and hist[0].rows_delta == pytest.approx(-0.125)
    # the prompts after the outcomes were measured show them to the model
    last_user = backend.prompts[3][-1]["content"]
    assert f"#1 window 0: replace medium ({budget_rows('medium', 1000)} rows)" in last_user and "(down): correct" in last_user
    assert "#2 window 1" in last_user and "(flat): wrong" in last_user
    pol.close()
    left = pol.decisions()
    assert [r["decision"] for r in left] == [4] and left[0]["applied_step"] is None


def test_bad_answers_hand_over_to_the_fallback_policy():
    backend = ScriptedBackend(["not json", BackendError("timeout", "slow"), answer(False, "small", "flat", "flat")])
    pol = make(backend, fallback="fixed", period=3)
    pol.setup(ctx())
    pol.observe({"global_step": 4}, win(0, 0.3, 700))
    wait_outbox(pol)
    assert pol.plan(step(5)) is None  # 5 % 3 != 0: the fixed schedule does nothing yet
    r = pol.plan(step(6))
    assert r is not None and r.source == "fallback:fixed" and r.mechanism == "massivegnn"
    pol.observe({"global_step": 9}, win(1, 0.3, 700))
    wait_outbox(pol)
    pol.plan(step(10))
    pol.observe({"global_step": 14}, win(2, 0.3, 700))
    wait_outbox(pol)
    pol.plan(step(15))
    assert pol.plan(step(18)) is None  # a valid answer took the helm back from the fallback
    pol.close()
    recs = {r["decision"]: r for r in pol.decisions()}
    assert recs[1]["fallback"] == "fixed" and "invalid" in recs[1]["reason"] and recs[1]["correct"] is None
    assert recs[2]["fallback"] == "fixed" and "timeout" in recs[2]["reason"]
    assert recs[3]["fallback"] is None
    assert pol.pass_at_1 is None  # nothing judged yet: #3's next window never closed


def test_close_is_bounded_with_a_stuck_model():
    pol = make(ScriptedBackend([answer()], delay=5.0), timeout_s=0.5)
    pol.setup(ctx())
    pol.observe({"global_step": 4}, win(0, 0.3, 700))
    time.sleep(0.1)
    t0 = time.monotonic()
    pol.close()
    assert time.monotonic() - t0 < 3.5


def test_missing_model_fails_at_setup(tmp_path, monkeypatch):
    from rudder.agent.models import ModelError

    monkeypatch.setenv("RUDDER_MODELS_DIR", str(tmp_path))
    monkeypatch.delenv("RUDDER_AGENT_URL", raising=False)
    pol = AgentPolicy(PrefetchConfig(policy="agent"), agent=AgentConfig(model=ModelConfig(name="qwen2.5-coder-0.5b")))
    with pytest.raises(ModelError, match="scripts/models.sh qwen2.5-coder-0.5b"):
        pol.setup(ctx())


def test_wait_ready_blocks_only_until_the_model_is_loaded(monkeypatch):
    """Start-up waits (bounded) for a slow-loading model; afterwards plan() never waits."""
    import rudder.agent.models as models

    def slow_load(cfg, url=None):
        time.sleep(0.6)
        return DecisionMaker(ScriptedBackend([answer()]), "fake", timeout_s=5.0)

    monkeypatch.delenv("RUDDER_AGENT_URL", raising=False)
    monkeypatch.setattr(models, "resolve_model", lambda m: None)
    monkeypatch.setattr(DecisionMaker, "from_config", staticmethod(slow_load))
    for timeout, waited in ((0.1, (0.08, 0.4)), (10.0, (0.5, 5.0))):
        pol = AgentPolicy(PrefetchConfig(policy="agent", window=5), agent=AgentConfig())
        pol.setup(ctx())
        dt = pol.wait_ready(timeout)
        assert waited[0] <= dt <= waited[1]  # a short timeout gives up; a long one returns when loaded
        pol.observe({"global_step": 4}, win(0, 0.3, 700))
        wait_outbox(pol)
        assert pol.plan(step(5)) is not None  # the loaded model's replace decision applies
        pol.close()


def test_fallback_steers_until_the_first_answer():
    """auto: with lookahead the lookahead policy steers before the model's first answer (and the
    answer then takes over); without lookahead, static (no rounds)."""
    pol = make(ScriptedBackend([answer(False, "small", "flat", "flat")], delay=0.3), fallback="auto")
    pol.setup(ctx(lookahead=3, capacity=1000))
    r = pol.plan(step(0))
    assert r is not None and r.mechanism == "lookahead" and r.source == "fallback:lookahead"
    pol.observe({"global_step": 4}, win(0, 0.3, 700))
    assert pol.plan(step(5)).source == "fallback:lookahead"  # the answer is still on its way
    assert pol.wait_for_decision(5.0)
    assert pol.plan(step(6)) is None  # the answer (keep) took over
    pol.close()
    pol = make(ScriptedBackend([answer()]), fallback="auto")
    pol.setup(ctx(lookahead=0))
    assert pol.plan(step(0)) is None and pol.agent_cfg.fallback == "static"
    pol.close()


def test_measure_and_reflect_tolerances():
    a = win(0, 0.40, 1000)
    assert measure(a, win(1, 0.409, 1019)) == (pytest.approx(0.009), pytest.approx(0.019))
    d = Decision(expected_hit_rate="flat", expected_remote_rows="flat")
    reflect(d, a, win(1, 0.409, 1019))
    assert d.correct is True
    d = Decision(expected_hit_rate="up", expected_remote_rows="flat")
    reflect(d, a, win(1, 0.42, 985))
    assert d.outcome_hit_rate == "up" and d.outcome_remote_rows == "flat" and d.correct is True
    d = Decision(fallback="static")
    reflect(d, a, win(1, 0.5, 500))
    assert d.correct is None


def test_unusable_fallback_rejected_by_the_config():
    with pytest.raises(ValueError, match="fallback"):  # pydantic names the key and the choices
        AgentConfig(fallback="agent")


def test_service_url_resolution(monkeypatch):
    from rudder.agent.policy import service_url

    for k in ("RUDDER_AGENT_URL", "RUDDER_MACHINE_ADDR"):
        monkeypatch.delenv(k, raising=False)
    assert service_url(AgentConfig()) is None  # inproc
    assert service_url(AgentConfig(backend="http", url="http://h:1")) == "http://h:1"
    monkeypatch.setenv("RUDDER_MACHINE_ADDR", "10.88.0.2")
    assert service_url(AgentConfig(backend="http")) == "http://10.88.0.2:8431"
    assert service_url(AgentConfig()) is None  # inproc stays inproc without the cluster's URL
    monkeypatch.setenv("RUDDER_AGENT_URL", "http://10.88.0.2:9000")
    assert service_url(AgentConfig()) == "http://10.88.0.2:9000"


def test_every_decider_applies_replace_the_same_way():
    """One steering skeleton for every decider: a synchronous one (a scripted decider, as the
    classifier, collector and rule are) and the LLM apply the same replace/keep sequence as
    rounds on the same minibatches, with and without lookahead."""
    from rudder.agent.steering import Decider, Steering

    said = [True, False, True, True, False]

    class Scripted(Decider):
        label = "scripted"

        def decide(self, point):
            return self.verdict(point, said[self._count])

    for lookahead in (0, 3):
        agent = make(ScriptedBackend([answer(s, "medium") for s in said]))
        agent.setup(ctx(lookahead=lookahead))
        windows = [win(i, 0.3, 700) for i in range(len(said))]
        agent_plans = drive(agent, windows)
        agent.close()
        other = Steering(PrefetchConfig(window=5, budget=BUDGET_SHARE["medium"]), Scripted())
        other.setup(ctx(lookahead=lookahead))
        other_plans = {}
        for i, w in enumerate(windows):
            other.observe({}, w)
            for g in range((i + 1) * 5, (i + 2) * 5):
                other_plans[g] = other.plan(step(g))
        other.close()
        a = {g: (r.mechanism, r.max_rows) for g, r in agent_plans.items() if r is not None}
        b = {g: (r.mechanism, r.max_rows) for g, r in other_plans.items() if r is not None}
        assert a == b and a, lookahead
        if lookahead:
            assert len(a) == 5 * sum(said)  # every minibatch of each replace window
        else:
            assert len(a) == sum(said)  # one round per replace decision
        # both judged by the same skeleton: every decision but the last, one window later
        recs = other.decisions()
        assert [r["correct"] is not None for r in recs] == [True] * 4 + [False]
        assert all(r["staleness"] == 1 for r in recs[:-1])


def test_replace_regime_uses_the_configured_admission():
    """The agent's lookahead rounds admit as the lookahead policy does (prefetch.admit)."""
    maker = DecisionMaker(ScriptedBackend([answer(True, "small")]), "fake")
    pol = AgentPolicy(PrefetchConfig(policy="agent", window=5, admit="any"), agent=AgentConfig(),
                      decision_maker=maker)
    pol.setup(ctx(lookahead=3))
    plans = drive(pol, [win(0, 0.3, 700)])
    pol.close()
    assert all(r.admit == "any" and r.mechanism == "lookahead" for r in plans.values())


def test_start_decision_steers_from_the_first_minibatch():
    """Runs that sample ahead ask the model once before the first minibatch, on the initial
    buffer and what the sampled-ahead minibatches lack; its answer sets the regime from the step it
    arrives, is recorded as window START_WINDOW and is never scored for Pass@1 (no window before it)."""
    from rudder.agent.messages import START_WINDOW

    backend = ScriptedBackend([answer(True, "large"), answer(False, "small", "flat", "flat")])
    pol = make(backend)
    pol.setup(ctx())
    assert pol.start(lambda: {"buffer_fill": 1000, "stale_slots": 0, "lookahead_missing": 900, "lookahead_rows": 900})
    assert pol.wait_for_decision(5.0)
    plans = [pol.plan(step(g)) for g in range(5)]
    assert all(r is not None and r.mechanism == "lookahead" and r.max_rows == budget_rows("large", 1000)
               and r.source == "agent#1" for r in plans)
    prompt = backend.prompts[0][-1]["content"]
    assert "Start of training" in prompt and "lookahead missing 900 nodes (90% of capacity: much)" in prompt
    assert "hit_rate" not in prompt.split("Start of training")[1]  # nothing measured yet
    pol.observe({"global_step": 4}, win(0, 0.3, 700))
    assert pol.wait_for_decision(5.0)
    assert pol.plan(step(5)) is None  # the window-0 answer (keep) replaced the start regime
    assert "#1 at the start: replace large" in backend.prompts[1][-1]["content"]
    pol.close()
    recs = {r["decision"]: r for r in pol.decisions()}
    assert recs[1]["window"] == START_WINDOW and recs[1]["applied_step"] == 0 and recs[1]["staleness"] == 1
    assert recs[1]["correct"] is None and recs[2]["window"] == 0
    assert pol.pass_at_1 is None  # decision 2 had no window after it; decision 1 is never judged


def test_no_start_decision_without_lookahead_or_when_switched_off():
    for pol in (make(ScriptedBackend([answer()])), make(ScriptedBackend([answer()]), start_decision=False)):
        pol.setup(ctx(lookahead=0) if pol.agent_cfg.start_decision else ctx())
        assert pol.start(lambda: pytest.fail("state scanned by a policy that asks nothing")) is False
        assert pol.wait_for_decision(0.05) is False
        pol.close()


def test_the_asked_question_comes_back_as_its_own_example():
    """Issue 16: the decider keeps each question's exact text (HistoryEntry.asked), and with the
    `default` prompt the next prompt repeats it as this run's own example where it stood, so
    the next question extends the last one (the node's server keeps that prefix)."""
    backend = ScriptedBackend([answer(True, "large", "up", "down")] * 3)
    pol = make(backend, history=4, prompt="default", start_decision=False)
    pol.setup(ctx())
    windows = [win(0, 0.30, 800), win(1, 0.36, 700), win(2, 0.42, 600)]
    for i, w in enumerate(windows):
        pol.observe({"global_step": w["last_step"]}, w)  # judges the decision before, then asks
        wait_outbox(pol)
        pol.plan(step(w["last_step"] + 1))
    hist = pol.history()
    assert [h.decision for h in hist] == [1, 2, 3]
    for h, sent in zip(hist, backend.prompts):
        assert h.asked and sent[-1]["content"].endswith(h.asked)  # the exact text asked
    first, second, third = backend.prompts
    assert second[:len(first)] == first and second[len(first)]["role"] == "assistant"
    assert third[:len(second)] == second
    pol.close()
