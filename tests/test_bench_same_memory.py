"""benchmarks/bench_same_memory.py: the levers it replays and the bookkeeping memory it reports."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_same_memory as bsm  # noqa: E402

from rudder.sim.simulate import simulate  # noqa: E402
from rudder.sim.tracegen import random_trace  # noqa: E402


def test_levers_set_depth_and_universe():
    p = bsm.lever_policy("epoch", "remote")
    assert p.prefetch.schedule_ahead and p.prefetch.universe == "remote" and p.base == "lookahead"
    q = bsm.lever_policy("8", "halo")
    assert not q.prefetch.schedule_ahead and q.prefetch.lookahead == 8 and q.prefetch.universe == "halo"
    assert p.spec != q.spec


def test_capacity_cut_keeps_the_fill_order_and_the_remote_universe_costs_more_state():
    full = random_trace(halo=2000, minibatches=30, batch=300, nonhalo=0.3, capacity=1.0, epochs=2)
    t = bsm.at_capacity(full, 500)
    assert t.capacity == 500 and np.array_equal(t.init, full.init[:500])
    halo_mb, remote_mb = bsm.state_mb(t, "halo"), bsm.state_mb(t, "remote")
    assert 0 < halo_mb < remote_mb  # the remote universe: 2 x the halo's positions, plus its index
    # the remote universe keeps non-halo rows too: on a trace with 30% of them it fetches fewer
    rows = {u: simulate(t, bsm.lever_policy("epoch", u)).total("fetched_rows") for u in ("halo", "remote")}
    assert rows["remote"] < rows["halo"]
