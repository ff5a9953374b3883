"""The replay's time model (rudder.sim.timemodel): a minibatch's pull costs rows x bytes / rate(t)
+ latency on the bandwidth schedule's clock, hidden behind compute up to the compute time."""
from __future__ import annotations

import pytest

from rudder.sim.simulate import simulate
from rudder.sim.timemodel import TimeModel, time_label, timed_branches
from rudder.sim.tracegen import random_trace


def test_fetch_time_follows_the_schedule_and_hides_behind_compute():
    # 1000 rows x 125 B = 1 Mbit: 0.1 s at 10 Mbit/s, 1 s at 1 Mbit/s
    m = TimeModel(compute_s=0.5, row_bytes=125, schedule=[[0, "10mbit"], [2, "1mbit"]], latency_s=0.01)
    assert m.step(0.0, 1000) == pytest.approx((0.11, 0.5))  # slack: the step is the compute
    assert m.step(2.0, 1000) == pytest.approx((1.01, 1.01))  # saturated: the pull is the step
    tm = m.times([1000] * 6)
    # 0, 0.5, 1.0, 1.5 at 10 Mbit/s (0.5 s each), then 2.0 and 3.01 at 1 Mbit/s
    assert tm["t_start"].tolist() == pytest.approx([0, 0.5, 1.0, 1.5, 2.0, 3.01])
    assert tm["t_stall"].tolist() == pytest.approx([0, 0, 0, 0, 0.51, 0.51])
    assert TimeModel(0.5, 125, t0_s=2.0, schedule=[[2, "1mbit"]]).step(0.0, 1000)[0] == pytest.approx(1.0)
    assert TimeModel(0.5, 125).step(0.0, 10**9) == (0.0, 0.5)  # unshaped: rows cost nothing
    with pytest.raises(ValueError, match="entry 1 .*times must increase"):
        TimeModel(0.5, 125, schedule=[[3, "1mbit"], [1, "2mbit"]])


def test_a_timed_replay_keeps_its_rows_and_adds_the_modelled_times():
    trace = random_trace(halo=400, minibatches=40, batch=120, capacity=0.25, skew=0.8, epochs=2, seed=7)
    m = TimeModel(compute_s=0.01, row_bytes=trace.feat_bytes, schedule=[[0, "10mbit"], [0.2, "1mbit"]])
    for policy in ("none", "lookahead:4:0.2:any", "lru"):
        plain, timed = simulate(trace, policy), simulate(trace, policy, time_model=m)
        assert timed.total("fetched_rows") == plain.total("fetched_rows")
        assert all(r["t_fetch"] == 0 for r in plain.records()) and "time_s" not in plain.summary()
        recs = timed.records()
        s = timed.summary()
        assert s["time_s"] == pytest.approx(sum(r["t_compute"] + r["t_stall"] for r in recs))
        late = [r for r in recs if r["t_stall"] > 0]
        assert late and all(r["t_fetch"] == pytest.approx(0.01 + r["t_stall"]) for r in late)
        assert timed.windows[-1]["t_fetch"] > 0  # the windows (what a policy sees) carry it


def test_branches_and_labels():
    assert time_label({"keep": {"time_s": 10.0}, "replace": {"time_s": 9.0}, "any": {"time_s": 9.2}}) == "replace"
    assert time_label({"keep": {"time_s": 10.0}, "replace": {"time_s": 10.01}, "any": {"time_s": 11}}) is None
    from rudder.prefetch.policies import make_policy
    from rudder.config import PrefetchConfig
    from rudder.sim.replay import BufferReplayer, PositionTrace, replay

    trace = random_trace(halo=400, minibatches=40, batch=120, capacity=0.25, skew=0.8, epochs=1, seed=3)
    pt = PositionTrace(trace)
    m = TimeModel(compute_s=0.002, row_bytes=trace.feat_bytes, schedule=[[0, "1mbit"]])
    pc = PrefetchConfig(policy="lookahead", lookahead=4, budget=0.5)
    rp = BufferReplayer(pt, make_policy(pc), trace.capacity, alpha=0.05, period=5, depth=4, window=5)
    rp.policy.setup(type("Ctx", (), {"capacity": trace.capacity})())
    rp.fill(trace.init_positions())
    rp.clock = m.clock()
    replay(pt, rp, stop=10)
    t = rp.clock.t
    br = timed_branches(rp, pt, m, t, window=5, horizon=2, rows=50)
    assert rp.g == 10 and rp.clock.t == t  # the run itself is untouched by its forks
    # saturated all along: time is rows, so the fewest rows win, and admit-any pulls more
    assert br["any"]["rows"] >= br["replace"]["rows"]
    assert min(br, key=lambda b: br[b]["time_s"]) == min(br, key=lambda b: br[b]["rows"])
