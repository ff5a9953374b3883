"""The hand-written adaptive rule (`rule`, rudder.agent.rule): it decides differently in
different situations (synthetic windows), steers through the same skeleton as the agent and the
classifiers, and runs end to end in `rudder sim`, where the counterfactual judge replays it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rudder.agent.rule import RuleDecider, RulePolicy, link_slack
from rudder.config import PrefetchConfig, sample_ahead
from rudder.prefetch.policies import make_policy
from rudder.prefetch.policy import RunContext, StepInfo
from rudder.records import DECISION_FIELDS, read_jsonl
from rudder.trace import Trace


def ctx(lookahead=0, capacity=1000, window=10):
    return RunContext(rank=0, num_trainers=1, part_id=0, num_parts=2, num_nodes=10_000, partition_nodes=5_000,
                      halo_nodes=4_000, capacity=capacity, batch_size=100, fanouts=[10, 25], steps_per_epoch=200,
                      epochs=1, feat_dim=8, feat_bytes=32, window=window, lookahead=lookahead)


def window(i, hit, stale=100, n=10, t_fetch=0.0, t_minibatch=0.0):
    """A closed window whose minibatch records sum to hit rate `hit` (1000 remote rows each)."""
    mbs = [{"global_step": i * n + k, "remote_rows": 1000, "hits": round(1000 * hit),
            "fetched_rows": 1000 - round(1000 * hit), "replaced_rows": 0, "t_fetch": t_fetch} for k in range(n)]
    w = {"window": i, "first_step": i * n, "last_step": i * n + n - 1, "minibatches": n, "hit_rate": hit,
         "stale_slots": stale, "buffer_fill": 1000, "t_fetch": t_fetch, "t_minibatch": t_minibatch}
    return mbs, w


def steer(pol, windows, n=10):
    """Feeds each window's minibatches and plans the next window's; returns ({step: Replace}, records)."""
    plans = {}
    for i, (mbs, w) in enumerate(windows):
        for k, m in enumerate(mbs):
            pol.observe(m, w if k == len(mbs) - 1 else None)
        for g in range((i + 1) * n, (i + 2) * n):
            plans[g] = pol.plan(StepInfo(epoch=0, step=g, global_step=g, remaining_steps=200 - g))
    pol.close()
    return plans, pol.decisions()


def test_history_only_replaces_when_hits_fall_and_catches_up_while_rounds_help():
    pol = RulePolicy(PrefetchConfig(policy="rule", lookahead=0, budget=0.1, window=10))
    pol.setup(ctx(lookahead=0))
    # steady (noise under 2 pt): keep; a 3-pt fall with stale slots: replace; the round lifts the
    # hit rate 2 pt: replace again; the next lifts it 0.5 pt only: keep, the new reference;
    # a fall without stale slots: keep (a round would swap nothing); then a fall with them
    hits = [0.60, 0.61, 0.595, 0.58, 0.60, 0.605, 0.58, 0.57]
    stale = [100, 100, 100, 100, 100, 100, 0, 50]
    plans, recs = steer(pol, [window(i, h, s) for i, (h, s) in enumerate(zip(hits, stale))])
    said = [r["replace"] for r in recs]
    assert said == [False, False, False, True, True, False, False, True]
    assert "3.0 pt below its best 61.0%" in recs[3]["reason"] and recs[3]["reason"].endswith(": replace")
    assert "lifted the hit rate +2.0 pt" in recs[4]["reason"]
    assert "0 stale" in recs[6]["reason"] and recs[6]["reason"].endswith(": keep")
    # one MassiveGNN round per replace decision, at the minibatch after its window
    rounds = {g: r for g, r in plans.items() if r is not None}
    assert sorted(rounds) == [40, 50, 80]
    assert all(r.mechanism == "massivegnn" and r.max_rows == 100 and r.source == "rule" for r in rounds.values())
    assert all(set(r) == set(DECISION_FIELDS) for r in recs)  # no admission of its own without lookahead
    assert [r["correct"] is not None for r in recs] == [True] * 7 + [False]  # judged one window later


def test_lookahead_replaces_from_the_start_and_admits_by_link_slack():
    pol = RulePolicy(PrefetchConfig(policy="rule", lookahead=3, budget=0.2, admit="misses", window=10))
    pol.setup(ctx(lookahead=3))
    assert pol.start(lambda: pytest.fail("the rule needs no scan of the minibatches ahead"))
    first = pol.plan(StepInfo(epoch=0, step=0, global_step=0, remaining_steps=200))
    assert first.mechanism == "lookahead" and first.admit == "misses" and first.max_rows == 200
    # fetch hidden behind compute: pull rows ahead; saturated link: admit only the misses;
    # no timing at all: the configured admission
    timings = [(0.01, 0.05), (0.04, 0.05), (0.0, 0.0)]
    plans, recs = steer(pol, [window(i, 0.5, t_fetch=f, t_minibatch=m) for i, (f, m) in enumerate(timings)])
    assert [plans[g].admit for g in (10, 19, 20, 29, 30, 39)] == ["any", "any", "misses", "misses", "misses", "misses"]
    assert all(r is not None and r.mechanism == "lookahead" for r in plans.values())
    assert [r["window"] for r in recs] == [-1, 0, 1, 2]  # the start decision, then one per window
    assert [r.get("admit") for r in recs] == ["misses", "any", "misses", "misses"]
    assert "fetch < compute" in recs[1]["reason"] and "fetch >= compute" in recs[2]["reason"]
    assert recs[0]["applied_step"] == 0 and recs[0]["correct"] is None  # no window before it


def test_link_slack_and_bad_knobs():
    assert link_slack({"t_fetch": 0.01, "t_minibatch": 0.05}) is True
    assert link_slack({"t_fetch": 0.03, "t_minibatch": 0.05}) is False
    assert link_slack({"t_fetch": 0.01}) is None
    with pytest.raises(ValueError, match="drop"):
        RuleDecider(drop=0.0)


def test_registered_with_its_knobs():
    from rudder.prefetch.policies import policy_class
    from rudder.sim.simulate import parse_policy

    pol = make_policy(PrefetchConfig(policy="rule"), agent=None, models_dir="x", dataset="d")
    assert isinstance(pol, RulePolicy) and pol.records_decisions and policy_class("rule") is RulePolicy
    spec = parse_policy("rule:0:0.5:any:5")
    assert (spec.prefetch.lookahead, spec.prefetch.budget, spec.prefetch.admit, spec.prefetch.window) == (0, 0.5, "any", 5)
    assert sample_ahead(PrefetchConfig(policy="rule", lookahead=4)) == 4
    with pytest.raises(ValueError, match="rule"):
        parse_policy("rule:1:0.1:any:5:extra")


def _drift_trace(path):
    """A 40-row buffer holding A; 30 minibatches of A, then 60 of a disjoint B (the stream moves)."""
    rng = np.random.default_rng(0)
    a, b = np.arange(0, 60), np.arange(100, 160)
    mbs = [rng.choice(a, 30, replace=False) for _ in range(30)] + [rng.choice(b, 30, replace=False) for _ in range(60)]
    t = Trace.from_minibatches(np.arange(200), mbs, init=np.arange(40), capacity=40,
                               epochs=np.zeros(len(mbs), dtype=np.int32), feat_bytes=8)
    return t.save(path / "trace-r0.npz")


def test_rudder_sim_replays_the_rule_and_judges_it(tmp_path, capsys):
    """End to end: `rudder sim` replays the rule (history only and with lookahead) as it does
    the classifier, writes the run, and the counterfactual judge re-plays its decisions."""
    from rudder.agent.hindsight import judge_run
    from rudder.cli import main
    from rudder.sim.simulate import load_source, simulate

    src = tmp_path / "run"
    _drift_trace(src)
    (src / "run.json").write_text(json.dumps({"run_id": "drift", "config": {}}))
    runs = tmp_path / "runs"
    assert main(["sim", str(src), "-p", "rule:0:1.0,static,fixed,rule,lookahead", "--runs-dir", str(runs),
                 "--json"]) == 0
    rows = {r["policy"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    hist = rows["rule:0:1.0"]
    run_of = {d.name.rsplit("-", 1)[1]: d for d in runs.iterdir()}  # sim-<source>-<policy slug>
    # it keeps while A holds and replaces once B arrives: fewer rows than never or every 25 replacing
    recs = read_jsonl(run_of["rule_0_1.0"] / "decisions-r0.jsonl")
    said = "".join("R" if r["replace"] else "." for r in recs)
    assert said.startswith("...R") and said.count("R") < len(said) // 2, said
    assert hist["fetched_rows"] < rows["static"]["fetched_rows"]
    assert hist["fetched_rows"] < rows["fixed"]["fetched_rows"]
    # with lookahead, untimed: a round every minibatch from the start, as the lookahead policy
    assert rows["rule"]["fetched_rows"] == rows["lookahead"]["fetched_rows"]
    assert rows["rule"]["decisions"] == 10
    # the counterfactual judge reproduces both runs (it raises where a replay diverges)
    for name in ("rule_0_1.0", "rule"):
        judged = judge_run(run_of[name], write=False)[0]
        assert any(d["correct_cf"] is not None for d in judged), name
    # the same through the library
    traces, _ = load_source(src)
    assert simulate(traces[0], "rule:0:1.0").summary()["fetched_rows"] == hist["fetched_rows"]


def test_probe_tries_one_round_from_a_cold_buffer_and_goes_on_while_rounds_pay():
    """A cold buffer's hit rate only rises, so the plain rule never replaces; with probe=true the
    first window with stale slots gets a round, and rounds go on while each lifts the hit rate."""
    hits = [0.20, 0.22, 0.25, 0.30, 0.305, 0.32]
    stale = [0, 500, 400, 300, 200, 100]

    def said(**kw):
        pol = RulePolicy(PrefetchConfig(policy="rule", lookahead=0, budget=0.2, window=10), **kw)
        pol.setup(ctx(lookahead=0))
        _, recs = steer(pol, [window(i, h, s) for i, (h, s) in enumerate(zip(hits, stale))])
        return [r["replace"] for r in recs], recs

    plain, _ = said()
    assert plain == [False] * 6  # the hit rate never falls
    probed, recs = said(probe=True)
    # window 0: nothing stale; 1: the first round; +3 pt and +5 pt: go on; +0.5 pt: stop, the new reference
    assert probed == [False, True, True, True, False, False]
    assert recs[1]["reason"].endswith("a first round to try: replace")
    assert "lifted the hit rate +3.0 pt" in recs[2]["reason"]
    # make_policy passes the extra through
    assert make_policy(PrefetchConfig(policy="rule"), probe=True).decider._probe is True


def test_a_runs_rule_section_reaches_the_live_policy(tmp_path):
    """`rule:` in a run config (drop, probe, evict) is what train.py's policy gets; other
    policies get no rule knobs; a bad word names the key."""
    from rudder.config import ConfigError, load_run_config
    from rudder.prefetch.policies import policy_extras

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("prefetch: {policy: rule, lookahead: 0}\nrule: {drop: 0.05, probe: true, evict: half}\n")
    cfg = load_run_config(cfg_file)
    pol = make_policy(cfg.prefetch, **policy_extras(cfg))
    assert isinstance(pol, RulePolicy)
    assert (pol.decider.drop, pol.decider.evict, pol.decider._probe) == (0.05, "half", True)
    (tmp_path / "plain.yaml").write_text("prefetch: {policy: rule, lookahead: 0}\n")
    plain = load_run_config(tmp_path / "plain.yaml")
    plain = make_policy(plain.prefetch, **policy_extras(plain))
    assert (plain.decider.drop, plain.decider.evict, plain.decider._probe) == (0.02, None, False)
    assert "drop" not in policy_extras(load_run_config(cfg_file, {"prefetch.policy": "fixed"}))
    cfg_file.write_text("prefetch: {policy: rule}\nrule: {evict: sometimes}\n")
    with pytest.raises(ConfigError, match="evict"):
        load_run_config(cfg_file)


def test_payback_go_on_goes_on_while_a_rounds_lift_pays_its_rows():
    """go_on=payback: after a round, go on when the lift x the window's remote rows x 2 windows
    covers the rows the round replaced; `lift` (default) asks drop/2 = 1 pt whatever the round's
    size. A small round lifting +0.5 pt pays (0.005 x 10,000 x 2 = 100 >= 20 rows): payback goes on,
    lift stops; a large one lifting as much (500 rows) does not pay: both stop."""
    def run(replaced, **kw):
        pol = RulePolicy(PrefetchConfig(policy="rule", lookahead=0, budget=0.2, window=10), probe=True, **kw)
        pol.setup(ctx(lookahead=0))
        wins = [window(i, h, 300) for i, h in enumerate([0.20, 0.205, 0.21])]
        for mbs, w in wins[1:]:  # the round decided at the window before replaced its rows here
            mbs[0]["replaced_rows"] = replaced
            mbs[0]["fetched_rows"] += replaced
        _, recs = steer(pol, wins)
        return [r["replace"] for r in recs], recs

    assert run(20)[0] == [True, False, False]  # lift: +0.5 pt < 1 pt, stop
    said, recs = run(20, go_on="payback")
    assert said == [True, True, True]
    assert "saving ~100 rows in 2 windows for 20" in recs[1]["reason"]
    assert run(500, go_on="payback")[0] == [True, False, False]
    with pytest.raises(ValueError, match="go_on"):
        RulePolicy(PrefetchConfig(policy="rule"), go_on="sometimes")


def test_rudder_sim_takes_the_rule_section_of_its_config(tmp_path, capsys):
    """`rudder sim -p rule... --config C` replays the rule with C's `rule:` knobs: a threshold
    no fall reaches (drop 0.9) never replaces on the drift trace, where the default one does."""
    from rudder.cli import main

    src = tmp_path / "run"
    _drift_trace(src)
    (src / "run.json").write_text(json.dumps({"run_id": "drift", "config": {}}))
    fetched = {}
    for name, rule in (("default", {}), ("deaf", {"drop": 0.9})):
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(json.dumps({"prefetch": {"lookahead": 0}, **({"rule": rule} if rule else {})}))
        assert main(["sim", str(src), "-p", "rule:0:1.0,static", "--config", str(cfg), "--no-write", "--json"]) == 0
        rows = {r["policy"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
        fetched[name] = rows["rule:0:1.0"]["fetched_rows"]
        fetched["static"] = rows["static"]["fetched_rows"]
    assert fetched["default"] < fetched["static"] == fetched["deaf"]
