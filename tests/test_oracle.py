"""Belady's oracle: hand-computed answers, a brute-force optimum on tiny traces, and the bounds
it must hold against every other policy; plus `rudder oracle`."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rudder.sim.oracle import NAMES, all_remote, belady, next_uses
from rudder.records import JsonlWriter
from rudder.sim.simulate import simulate
from rudder.sim.trace import Trace
from rudder.sim.tracegen import random_trace


def T(mbs, halo=None, init=(), capacity=None):
    halo = sorted({x for m in mbs for x in m} | set(init)) if halo is None else halo
    return Trace.from_minibatches(halo, mbs, init=init, capacity=capacity)


# ---- hand-computed ------------------------------------------------------------------------
def test_capacity_one_alternating():
    # keep 1 (used at t2) over 2 (t3); at t3 keep 1 (t4) over 2 (never again)
    r = belady(T([[1], [2], [1], [2], [1]], capacity=1), start="empty")
    assert r.hits.tolist() == [0, 0, 1, 0, 1]
    assert (r.total_hits, r.misses, r.total_remote) == (2, 3, 5)
    assert r.hit_rate == pytest.approx(2 / 5)


def test_batched_capacity_two_with_non_halo_ids():
    # 9 is remote but not a halo node: counted in the denominator, never cacheable
    mbs = [[1, 2, 9], [3, 1], [2, 3], [1, 4], [2, 3]]
    t = T(mbs, halo=[1, 2, 3, 4, 5], capacity=2)
    r = belady(t, start="empty")
    # t0 keep {1,2}; t1 hit 1, keep {2,3} (next uses 2,2 vs 1 at 3); t2 hits 2,3;
    # t3 misses 1,4 (never used again: dropped); t4 hits 2,3
    assert r.hits.tolist() == [0, 1, 2, 0, 2]
    assert r.total_remote == 11 and r.misses == 6
    assert r.admitted.tolist() == [2, 1, 0, 0, 0]


def test_starts_from_the_initial_fill():
    mbs = [[1, 2, 9], [3, 1], [2, 3], [1, 4], [2, 3]]
    t = T(mbs, halo=[1, 2, 3, 4, 5], init=[3, 4], capacity=2)
    # t0: keep 3 (next t1) and 1 (t1) of {3,4,1,2}; t1: hits 3,1; t2: hit 3, keep {1, 2|3};
    # t3: hit 1; t4: one of 2,3
    assert belady(t, start="init").hits.tolist() == [0, 2, 1, 1, 1]
    assert belady(t, start="init").initial_fill == 2
    assert belady(t, start="empty").initial_fill == 0


def test_smaller_capacity_than_the_fill_keeps_the_soonest_used():
    # the run filled 4 slots; replayed at capacity 2, the oracle keeps the two of the fill used
    # first (2 and 3), not the first two listed
    t = T([[2, 3], [2, 3], [0]], halo=[0, 1, 2, 3, 4], init=[0, 1, 2, 3], capacity=4)
    r = belady(t, capacity=2, start="init")
    assert r.initial_fill == 2
    assert r.hits.tolist() == [2, 2, 0]


def test_capacity_zero_and_full():
    t = T([[1, 2], [1, 2], [3]], capacity=0)
    assert belady(t).total_hits == 0
    assert belady(t, capacity=3, start="empty").total_hits == 2


def test_next_uses():
    t = T([[1, 2], [2, 7], [1]], halo=[1, 2, 3])
    nxt, first, inf = next_uses(t)
    assert inf == 3
    assert nxt.tolist() == [2, 1, 3, 3, 3]  # 1->t2, 2->t1, 2 (last), 7 (not halo), 1 (last)
    assert first.tolist() == [0, 0, 3]


# ---- brute force ---------------------------------------------------------------------------
def brute_force(trace: Trace, C: int, start: str, universe: str = "halo") -> int:
    """Max total hits over every choice of what to keep after each minibatch (subsets of
    resident ∪ this minibatch's cacheable ids, at most C), by dynamic programming over states.
    Cacheable: the halo, or (universe "all") every id the trace holds."""
    halo = set(trace.halo.tolist())
    if universe == "all":
        halo |= set(trace.ids.tolist())
    init = frozenset(trace.init.tolist()[:C]) if start == "init" else frozenset()
    best = {init: 0}
    for i in range(trace.num_minibatches):
        req = set(trace.minibatch(i).tolist()) & halo
        nxt: dict[frozenset, int] = {}
        for state, h in best.items():
            h2 = h + len(req & state)
            pool = sorted(state | req)
            for k in range(min(C, len(pool)) + 1):
                for keep in itertools.combinations(pool, k):
                    s = frozenset(keep)
                    if nxt.get(s, -1) < h2:
                        nxt[s] = h2
        best = nxt
    return max(best.values())


tiny_traces = st.builds(
    lambda mbs, C, init: (mbs, C, init),
    st.lists(st.lists(st.integers(0, 5), max_size=4, unique=True), min_size=1, max_size=6),
    st.integers(0, 3),
    st.lists(st.integers(0, 4), max_size=3, unique=True),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_traces, st.sampled_from(["init", "empty"]))
def test_belady_equals_brute_force_optimum(case, start):
    mbs, C, init = case
    t = Trace.from_minibatches([0, 1, 2, 3, 4], mbs, init=init[:C], capacity=C)  # 5 is not halo
    assert belady(t, C, start).total_hits == brute_force(t, C, start)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_traces, st.sampled_from(["init", "empty"]))
def test_belady_over_all_remote_nodes_equals_brute_force_optimum(case, start):
    """Ids 5..7 are remote but not halo: only the unrestricted optimum may keep them."""
    mbs, C, init = case
    mbs = [[x + 2 * (x % 2) if x >= 3 else x for x in m] for m in mbs]  # 3->5, 5->7; 4 stays
    mbs = [sorted(set(m)) for m in mbs]
    t = Trace.from_minibatches([0, 1, 2, 3, 4], mbs, init=init[:C], capacity=C)
    alln = belady(t, C, start, universe="all")
    assert alln.total_hits == brute_force(t, C, start, "all")
    assert alln.total_hits >= belady(t, C, start).total_hits  # a larger universe, same memory
    assert alln.total_remote == t.num_accesses


# ---- halo only vs all remote nodes -------------------------------------------------------------
def reused_two_hop():
    """9 is remote but 2 hops away (not halo) and asked for every minibatch; halo nodes 1, 2
    come and go. One row of buffer memory: the halo-only optimum can keep only 1 (one hit);
    over all remote nodes it keeps 9 (three hits)."""
    return T([[1, 9], [2, 9], [1, 9], [9]], halo=[1, 2], capacity=1)


def test_all_remote_nodes_beat_the_halo_by_construction():
    t = reused_two_hop()
    halo, alln = belady(t, start="empty"), belady(t, start="empty", universe="all")
    assert halo.hits.tolist() == [0, 0, 1, 0]
    assert alln.hits.tolist() == [0, 1, 1, 1]
    assert halo.total_remote == alln.total_remote == 7  # the same accesses, the same memory
    assert halo.capacity == alln.capacity == 1
    assert (halo.misses, alln.misses) == (6, 4)
    assert halo.summary()["name"] == NAMES["halo"] == "Belady, halo only"
    assert alln.summary()["name"] == NAMES["all"] == "Belady, all remote nodes"
    assert (halo.summary()["universe_nodes"], alln.summary()["universe_nodes"]) == (2, 3)
    assert all_remote(t).halo.tolist() == [1, 2, 9] and t.halo.tolist() == [1, 2]  # unchanged


def test_all_remote_equals_halo_when_every_remote_node_is_halo():
    t = random_trace(halo=80, minibatches=15, batch=20, nonhalo=0.0, capacity=0.3, seed=5)
    assert belady(t, universe="all").hits.tolist() == belady(t).hits.tolist()


def test_unknown_universe_is_named():
    with pytest.raises(ValueError, match="'everything'"):
        belady(reused_two_hop(), universe="everything")


# ---- bounds against every policy ----------------------------------------------------------
DEMAND = ["static", "lru", "lfu", "s3fifo", "sieve", "lookahead:2:0.3:misses"]  # fetch only misses
PREFETCHING = ["fixed:3", "lookahead:2:0.3:any"]  # pull extra rows for the buffer


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from([0.05, 0.2, 0.5]), st.sampled_from([0.0, 1.0]))
def test_belady_bounds_every_policy(seed, frac, skew):
    t = random_trace(halo=60, minibatches=30, batch=25, nonhalo=0.2, capacity=frac, skew=skew,
                     epochs=2, seed=seed)
    opt = simulate(t, "belady")
    for p in DEMAND + PREFETCHING + ["none"]:
        r = simulate(t, p, verify=True)
        # nothing fetches fewer rows than demand Belady (prefetching included)
        assert r.total("fetched_rows") >= opt.total("fetched_rows"), p
        if p in DEMAND:  # and no demand policy gets more hits
            assert r.total("hits") <= opt.total("hits"), p


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from([0.1, 0.3, 0.6]), st.sampled_from([0.0, 1.0]))
def test_lookahead_over_the_whole_trace_is_belady(seed, frac, skew):
    """Demand admission with the rest of the trace as its window and no budget IS Belady's rule
    (batched, with bypass): same hits, same rows. A shorter window can only approach it."""
    t = random_trace(halo=50, minibatches=20, batch=20, nonhalo=0.2, capacity=frac, skew=skew,
                     epochs=1, seed=seed)
    opt = simulate(t, "belady")
    full = simulate(t, f"lookahead:{t.num_minibatches}:1.0:misses", verify=True)
    assert full.total("hits") == opt.total("hits")
    assert full.total("fetched_rows") == opt.total("fetched_rows")
    short = simulate(t, "lookahead:1:1.0:misses", verify=True)
    assert short.total("hits") <= opt.total("hits")


# ---- rudder oracle --------------------------------------------------------------------------
def test_oracle_cli(tmp_path, capsys):
    from rudder.cli import main

    t = random_trace(halo=100, minibatches=20, batch=30, seed=3)
    t.save(tmp_path / "trace-r0.npz")
    sim = simulate(t, "static")
    w = JsonlWriter(tmp_path / "minibatches-r0.jsonl")
    for rec in sim.records():
        w.write(rec)
    w.close()
    assert main(["oracle", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "oracle-r0.json").read_text())
    opt = belady(t)
    assert out["belady"]["hits"] == opt.total_hits
    assert out["run"]["hits"] == sim.total("hits")
    assert out["hits_fraction_of_optimal"] == pytest.approx(sim.total("hits") / opt.total_hits)
    assert 0 < out["hits_fraction_of_optimal"] <= 1
    assert out["fetched_ratio_to_optimal"] >= 1
    alln = belady(t, universe="all")
    assert out["belady_all_remote"]["hits"] == alln.total_hits >= opt.total_hits
    assert out["belady_all_remote"]["name"] == "Belady, all remote nodes"
    assert out["belady"]["name"] == "Belady, halo only"
    assert out["hits_fraction_of_all_remote"] == pytest.approx(sim.total("hits") / alln.total_hits)
    assert out["halo_nodes"] == 100 and out["remote_nodes"] == np.union1d(t.halo, t.ids).size
    text = capsys.readouterr().out
    # one line per optimum, each named, the yardstick (all remote nodes) first, with its
    # hits, fetched rows and the run's share of them
    lines = [ln.split() for ln in text.splitlines() if ln.startswith("  Belady, ")]
    assert [ln[:4] for ln in lines] == [["Belady,", "all", "remote", "nodes"],
                                        ["Belady,", "halo", "only"] + lines[1][3:4]]
    a_cells, h_cells = lines[0][4:], lines[1][3:]
    assert a_cells[1:] == [f"{alln.total_hits:,}", f"{alln.misses:,}",
                           f"{sim.total('hits') / alln.total_hits:.3f}",
                           f"{sim.total('fetched_rows') / alln.misses:.3f}"]
    assert h_cells[1:3] == [f"{opt.total_hits:,}", f"{opt.misses:,}"]
    assert "the yardstick" in text and "capacity 25 rows (0.25 of the 100 halo nodes" in text


def test_oracle_cli_reports_the_two_optima_apart(tmp_path):
    from rudder.sim.oracle_cli import compare_run, format_table

    t = reused_two_hop()
    t.save(tmp_path / "trace-r0.npz")
    [res] = compare_run(tmp_path, start="empty", write=False)
    assert (res["belady"]["hits"], res["belady_all_remote"]["hits"]) == (1, 3)
    assert (res["belady"]["fetched_rows"], res["belady_all_remote"]["fetched_rows"]) == (6, 4)
    assert res["run"] is None and res["hits_fraction_of_all_remote"] is None
    assert (res["halo_nodes"], res["remote_nodes"]) == (2, 3)
    assert res["capacity_fraction_of_halo"] == 0.5 and res["capacity_fraction_of_remote_nodes"] == 1 / 3
    rows = {ln[2:28].strip(): ln[28:].split() for ln in format_table([res]).splitlines()
            if ln.startswith("  Belady, ")}
    assert rows["Belady, all remote nodes"][1:3] == ["3", "4"]  # hits, fetched rows
    assert rows["Belady, halo only"][1:3] == ["1", "6"]


def test_oracle_cli_errors(tmp_path):
    from rudder.cli import main

    assert main(["oracle", str(tmp_path)]) == 2  # no traces: one clear line, exit 2
    assert main(["oracle", str(tmp_path / "nope")]) == 2


def test_oracle_matches_records_prefix(tmp_path):
    """A run that stopped early is compared on the minibatches it has."""
    from rudder.sim.oracle_cli import compare_run

    t = random_trace(halo=100, minibatches=20, batch=30, seed=4)
    t.save(tmp_path / "trace-r1.npz")
    w = JsonlWriter(tmp_path / "minibatches-r1.jsonl")
    for rec in simulate(t, "static").records()[:12]:
        w.write(rec)
    w.close()
    [res] = compare_run(tmp_path, write=False)
    assert res["minibatches"] == 12 and res["note"]
    assert res["belady"]["hits"] == belady(t.head(12)).total_hits
    assert np.isclose(res["run"]["remote_rows"], t.sizes()[:12].sum())
