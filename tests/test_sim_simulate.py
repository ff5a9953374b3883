"""Trace I/O, the simulator (buffer policies through the shared step, classic caches, Belady),
its run directories, and `rudder sim`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.policy import Replace
from rudder.prefetch.step import begin_step, finish_step
from rudder.records import MINIBATCH_FIELDS, WINDOW_FIELDS, WindowRecord, read_jsonl
from rudder.sim.simulate import expand_grid, load_source, parse_policy, simulate, write_sim_run
from rudder.sim.trace import Trace, TraceWriter, find_traces
from rudder.sim.tracegen import random_trace


@pytest.fixture(scope="module")
def trace():
    return random_trace(halo=400, minibatches=40, batch=120, nonhalo=0.15, capacity=0.25,
                        skew=0.8, epochs=2, seed=7)


# ---- trace format ---------------------------------------------------------------------------
def test_trace_roundtrip_and_accessors(tmp_path, trace):
    p = trace.save(tmp_path / "trace-r3.npz")
    t = Trace.load(p)
    for k in ("halo", "offsets", "ids", "epoch", "init", "input_rows"):
        assert np.array_equal(getattr(t, k), getattr(trace, k)), k
    assert (t.capacity, t.feat_bytes, t.part_id, t.num_parts) == (
        trace.capacity, trace.feat_bytes, trace.part_id, trace.num_parts)
    assert t.num_accesses == trace.ids.size == int(t.sizes().sum())
    assert np.array_equal(t.minibatch(5), trace.ids[trace.offsets[5] : trace.offsets[6]])
    assert find_traces(tmp_path) == {3: p}
    assert t.steps().tolist() == list(range(20)) * 2


def test_trace_writer_api(tmp_path):
    halo = torch.tensor([5, 1, 9, 3])
    w = TraceWriter(tmp_path / "trace-r0.npz", halo=halo, init=torch.tensor([9, 1]), capacity=2,
                    feat_bytes=64, part_id=1, num_parts=4)
    w.add(0, torch.tensor([1, 7, 9]))
    w.add(0, torch.tensor([], dtype=torch.int64))
    w.add(1, np.array([3]))
    w.close()
    t = Trace.load(tmp_path / "trace-r0.npz")
    assert t.halo.tolist() == [1, 3, 5, 9] and t.init.tolist() == [9, 1]
    assert t.offsets.tolist() == [0, 3, 3, 4] and t.epoch.tolist() == [0, 0, 1]
    assert (t.capacity, t.feat_bytes, t.part_id, t.num_parts) == (2, 64, 1, 4)
    ok, pos = t.halo_positions()
    assert ok.tolist() == [True, False, True, True] and pos.tolist() == [0, -1, 3, 1]
    assert t.input_rows.tolist() == [-1, -1, -1]
    with pytest.raises(RuntimeError):
        w.add(2, [1])


def test_trace_writer_flushes_as_its_length_doubles(tmp_path):
    """A killed run keeps at least half of its minibatches on disk, and the rewrites stay linear
    in the trace (a fixed period rewrote the whole trace every period)."""
    path = tmp_path / "trace-r0.npz"
    w = TraceWriter(path, halo=torch.arange(10), init=torch.tensor([1]), capacity=1, flush_from=2)
    on_disk = []
    for g in range(9):
        w.add(0, torch.tensor([g]))
        on_disk.append(Trace.load(path).num_minibatches if path.exists() else 0)
    assert on_disk == [0, 2, 2, 4, 4, 4, 4, 8, 8]
    w.close()
    assert Trace.load(path).ids.tolist() == list(range(9))


def test_the_trace_flush_benchmark_counts_the_rewrites_both_ways():
    """benchmarks/bench_trace_flush.py (BENCHMARKS §15) on a tiny trace: 50 minibatches from 4."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_trace_flush.py"), "--minibatches", "50",
                          "--ids", "100", "--first", "4"], capture_output=True, text=True, check=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(root)}).stdout
    fixed, doubling = (next(ln for ln in out.splitlines() if ln.startswith(w)) for w in ("fixed", "doubling"))
    assert " 13 rewrites" in fixed and "  5 rewrites" in doubling  # 12 periods + close; 4, 8, 16, 32 + close
    assert "the same file either way: True" in out


def test_replays_of_traces_with_the_same_name_are_kept_apart(tmp_path):
    """`rudder sim a/t.npz` and `rudder sim b/t.npz` both name their run sim-t-lru: the second
    gets its own id instead of replacing the first; replaying a/t.npz again replaces its own."""
    from rudder.cli import main

    runs = tmp_path / "runs"
    for folder, seed in (("a", 0), ("b", 1)):
        (tmp_path / folder).mkdir()
        random_trace(minibatches=5, seed=seed).save(tmp_path / folder / "t.npz")
    for folder in ("a", "b", "a"):
        assert main(["sim", str(tmp_path / folder / "t.npz"), "-p", "lru", "--runs-dir", str(runs)]) == 0
    made = {d.name: json.loads((d / "run.json").read_text())["sim"]["source"] for d in runs.iterdir()}
    assert made.pop("sim-t-lru") == str(tmp_path / "a" / "t.npz")
    [(other, source)] = made.items()
    assert other.startswith("sim-t-lru-") and source == str(tmp_path / "b" / "t.npz")


def test_trace_load_rejects_other_files(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.zeros(2))
    with pytest.raises(ValueError, match="not a trace"):
        Trace.load(tmp_path / "x.npz")
    with pytest.raises(FileNotFoundError):
        Trace.load(tmp_path / "missing.npz")


# ---- policy names ---------------------------------------------------------------------------
def test_policy_specs():
    assert expand_grid("fixed:10,25") == ["fixed:10", "fixed:25"]
    assert expand_grid("static,fixed:3,6,lru") == ["static", "fixed:3", "fixed:6", "lru"]
    assert expand_grid("lookahead:1,3:0.01,0.05") == [
        "lookahead:1:0.01", "lookahead:1:0.05", "lookahead:3:0.01", "lookahead:3:0.05"]
    s = parse_policy("fixed:25:0.01")
    assert (s.prefetch.policy, s.prefetch.period, s.prefetch.alpha) == ("fixed", 25, 0.01)
    s = parse_policy("lookahead:3:0.2")
    assert (s.prefetch.lookahead, s.prefetch.budget, s.prefetch.admit) == (3, 0.2, "misses")
    assert parse_policy("lookahead:3:0.2:any").prefetch.admit == "any"
    with pytest.raises(ValueError, match="admit"):
        parse_policy("lookahead:3:0.2:sometimes")
    assert parse_policy("classifier:rf").prefetch.policy == "classifier:rf"
    assert parse_policy("sieve").prefetch is None
    with pytest.raises(ValueError, match="valid: none, static"):
        parse_policy("arc")
    with pytest.raises(ValueError, match="bad policy"):
        parse_policy("fixed:x")
    with pytest.raises(ValueError, match="takes no arguments"):
        parse_policy("lru:3")


# ---- the replay -------------------------------------------------------------------------------
def test_static_equals_a_direct_count(trace):
    r = simulate(trace, "static", verify=True)
    direct = np.isin(trace.ids, trace.init)
    assert r.total("hits") == int(direct.sum())
    per_mb = np.add.reduceat(direct, trace.offsets[:-1]) if trace.num_accesses else []
    assert r.counts["hits"].tolist() == list(per_mb)
    assert r.total("replaced_rows") == 0 and r.total("fetched_rows") == trace.num_accesses - int(direct.sum())


def test_none_fetches_everything(trace):
    r = simulate(trace, "none")
    assert r.total("hits") == 0 and r.total("fetched_rows") == trace.num_accesses
    assert r.summary()["fetched_frac"] == 1.0


def test_buffer_policies_replay_the_shared_step(trace):
    """fixed/lookahead in the simulator == HaloBuffer + begin/finish_step driven by hand."""
    for spec, plan_at in (("fixed:5", lambda g: Replace("massivegnn") if g and g % 5 == 0 else None),
                          ("lookahead:2:0.1", lambda g: Replace("lookahead", max(1, round(0.1 * trace.capacity))))):
        r = simulate(trace, spec, verify=True)
        period = 5 if spec.startswith("fixed") else 25  # the period also sets the stale threshold
        buf = HaloBuffer(torch.from_numpy(trace.halo), trace.capacity, 0, period=period, store_features=False)
        buf.fill(torch.from_numpy(np.sort(trace.init)))
        ids = torch.from_numpy(trace.ids)
        off = trace.offsets
        hits, repl = [], []
        for g in range(trace.num_minibatches):  # the view slides on into the next epoch
            depth = 2 if spec.startswith("lookahead") else 0
            end = min(g + 1 + depth, trace.num_minibatches)
            fut = [ids[off[j] : off[j + 1]] for j in range(g + 1, end)]
            sp = begin_step(buf, ids[off[g] : off[g + 1]], plan_at(g), fut)
            finish_step(buf, sp)
            hits.append(sp.hits)
            repl.append(int(sp.extra_ids.numel()))
        assert r.counts["hits"].tolist() == hits, spec
        assert r.counts["replaced_rows"].tolist() == repl, spec
        assert r.total("fetched_rows") == trace.num_accesses - sum(hits) + sum(repl)


def test_classic_and_belady_have_no_extra_rows(trace):
    for p in ("lru", "lfu", "s3fifo", "sieve", "belady"):
        r = simulate(trace, p, verify=True)
        assert r.total("replaced_rows") == 0
        assert r.total("fetched_rows") == r.total("misses") == trace.num_accesses - r.total("hits")
        assert r.total("admitted_rows") > 0, p


def test_capacity_and_start_options(trace):
    full = simulate(trace, "lru", capacity=trace.num_halo, start="empty")
    ok, pos = trace.halo_positions()
    first_touch = np.unique(pos[ok]).size  # a cache holding every halo node misses once each
    assert full.total("hits") == int(ok.sum()) - first_touch
    assert simulate(trace, "static", start="empty").total("hits") == 0
    with pytest.raises(ValueError, match="capacity"):
        simulate(trace, "static", capacity=trace.num_halo + 1)


def test_records_windows_and_run_dir(tmp_path, trace):
    r = simulate(trace, "fixed:5")
    recs = r.records()
    assert len(recs) == trace.num_minibatches
    assert set(MINIBATCH_FIELDS) <= set(recs[0])
    assert all(x["fetched_rows"] == x["misses"] + x["replaced_rows"] for x in recs)
    # the columns, and the extras (stale_half: what the agent's evict=half would free)
    extras = {f.name for f in fields(WindowRecord)} - set(WINDOW_FIELDS)  # stale_half, lookahead_minibatches
    assert r.windows and set(r.windows[0]) <= set(WINDOW_FIELDS) | extras
    assert r.windows[0]["buffer_fill"] == trace.capacity
    d = write_sim_run(tmp_path, [r], {"name": "src", "path": "x"})
    meta = json.loads((d / "run.json").read_text())
    assert meta["simulated"] is True and meta["status"] == "complete"
    assert meta["config"]["prefetch"]["policy"] == "fixed" and meta["config"]["prefetch"]["period"] == 5
    assert meta["sim"]["summary"]["0"]["hits"] == r.total("hits")
    assert len(read_jsonl(d / "minibatches-r0.jsonl")) == trace.num_minibatches
    assert len(read_jsonl(d / "epochs-r0.jsonl")) == 2
    # rewriting replaces, never appends
    write_sim_run(tmp_path, [r], {"name": "src", "path": "x"})
    assert len(read_jsonl(d / "minibatches-r0.jsonl")) == trace.num_minibatches


def test_results_store_ingests_a_simulated_run(tmp_path, trace):
    from rudder.results import store as store_mod

    d = write_sim_run(tmp_path / "runs", [simulate(trace, "belady")], {"name": "src", "path": "x"})
    with store_mod.ResultsStore(tmp_path / "r.duckdb") as st:
        st.ingest_run(d)
        row = st.con.execute("SELECT simulated, policy FROM runs").fetchone()
        n = st.con.execute("SELECT count(*), sum(hits) FROM minibatches").fetchone()
    assert row == (True, "belady")
    assert n[0] == trace.num_minibatches


# ---- rudder sim -------------------------------------------------------------------------------
def test_sim_cli(tmp_path, trace, capsys):
    from rudder.cli import main

    src = tmp_path / "run"
    trace.save(src / "trace-r0.npz")
    (src / "run.json").write_text(json.dumps({"run_id": "r1", "config": {"prefetch": {"period": 7}}}))
    rc = main(["sim", str(src), "-p", "static", "-p", "fixed,lookahead", "-p", "fixed:3,6", "-p", "lru",
               "--runs-dir", str(tmp_path / "runs")])
    assert rc == 0
    out = capsys.readouterr().out
    for p in ("static", "fixed", "lookahead", "fixed:3", "fixed:6", "lru"):
        assert f"\n{p} " in out or out.startswith(p) or f"\n{p:<22}" in out
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert "sim-r1-fixed" in runs and "sim-r1-fixed_3" in runs and "sim-r1-lru" in runs
    meta = json.loads((tmp_path / "runs" / "sim-r1-fixed" / "run.json").read_text())
    assert meta["config"]["prefetch"]["period"] == 7  # knobs start from the source run's config
    traces, source = load_source(src)
    assert list(traces) == [0] and source["run_id"] == "r1"
    assert main(["sim", str(src), "-p", "nope", "--no-write"]) == 2
    capsys.readouterr()
    assert main(["sim", str(src), "-p", "static", "--capacity", "-1", "--no-write"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "capacity -1 must be in [0, " in err  # the error alone, no table's header


def test_sim_cli_shows_what_caches_evict(tmp_path, trace, capsys):
    from rudder.cli import build_parser, main

    src = tmp_path / "run"
    trace.save(src / "trace-r0.npz")
    (src / "run.json").write_text(json.dumps({"run_id": "r1", "config": {}}))
    assert main(["sim", str(src), "-p", "lru", "--no-write"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    cells = dict(zip(header.replace("fetched% of none", "fetched%").split(), row.split()))
    assert int(cells["admitted"]) == simulate(trace, "lru").summary()["evictions"] > 0
    sim_help = build_parser()._subparsers._group_actions[0].choices["sim"].format_help()
    assert "rudder collect" in sim_help and "results collect" not in sim_help


@pytest.mark.parametrize("max_nodes", [None, 400])
def test_replay_with_the_remote_universe_keeps_two_hop_ids(max_nodes):
    """universe=remote in the replay: the buffer (its own bounded RemoteIndex over the trace's
    remote ids) holds ids beyond the halo and hits them; with a small index (400 of ~1,200
    remote ids) it evicts ids and stays consistent (verify each step)."""
    from rudder.config import PrefetchConfig
    from rudder.sim.simulate import PolicySpec

    base = random_trace(halo=300, minibatches=60, batch=120, nonhalo=0.4, capacity=0.25, skew=0.6, epochs=2, seed=4)
    hot = np.setdiff1d(np.arange(20_000, 20_030), base.ids)  # 2-hop ids in every minibatch
    mbs = [np.concatenate([base.minibatch(i), hot]) for i in range(base.num_minibatches)]
    tr = Trace(halo=base.halo, offsets=np.cumsum([0] + [m.size for m in mbs]), ids=np.concatenate(mbs),
               epoch=base.epoch, init=base.init, capacity=base.capacity)
    pc = dict(policy="lookahead", universe="remote", universe_max_nodes=max_nodes)
    remote = simulate(tr, PolicySpec("lookahead", "lookahead", PrefetchConfig(**pc)), verify=True)
    halo = simulate(tr, "lookahead", verify=True)
    s = remote.summary()
    assert s["universe"] == "remote" and halo.summary()["universe"] == "halo"
    assert s["capacity_frac_halo"] == pytest.approx(tr.capacity / 300)
    assert s["capacity_frac_remote"] < s["capacity_frac_halo"]
    assert s["universe_max_nodes"] == (max_nodes or 600)
    assert s["universe_held"] <= s["universe_max_nodes"]
    assert s["remote_rows"] == halo.summary()["remote_rows"]
    # the hot 2-hop ids are kept and hit: more hits than a halo-only buffer of the same rows
    assert s["hits"] > halo.summary()["hits"] + 20 * hot.size


def test_a_remote_universe_replay_may_hold_more_rows_than_the_halo():
    """capacity beyond the halo: refused for a halo-universe policy (naming why), replayed for a
    buffer over every remote id (as a live run with prefetch.capacity_rows above the halo), where
    the empty slots take misses and so the replay fetches no more rows than at the halo's size."""
    from rudder.config import PrefetchConfig
    from rudder.sim.simulate import PolicySpec

    tr = random_trace(halo=200, minibatches=40, batch=100, nonhalo=0.5, capacity=0.25, epochs=2, seed=2)
    with pytest.raises(ValueError, match="beyond it only a buffer policy with prefetch.universe: remote"):
        simulate(tr, "lookahead", capacity=300)
    spec = lambda: PolicySpec("lookahead:epoch", "lookahead", PrefetchConfig(  # noqa: E731
        policy="lookahead", universe="remote", universe_max_nodes=1000, schedule_ahead=True))
    big = simulate(tr, spec(), capacity=600, verify=True).summary()
    at_halo = simulate(tr, spec(), capacity=200, verify=True).summary()
    assert big["fetched_rows"] < at_halo["fetched_rows"]
