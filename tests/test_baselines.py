"""benchmarks/bench_baselines.py's core: the grid, the choice of the best fixed setting in
hindsight and the ratio table, on a tiny synthetic trace (no timing asserted)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_baselines as bb  # noqa: E402

from rudder.config import load_run_config  # noqa: E402
from rudder.trace import Trace  # noqa: E402


def tiny_trace(seed: int = 0, steps: int = 40) -> Trace:
    """A drifting stream over 200 halo nodes: each minibatch draws from a window that moves."""
    rng = np.random.default_rng(seed)
    halo = np.arange(1000, 1200)
    mbs = [halo[(rng.choice(60, 30, replace=False) + 4 * s) % 200] for s in range(steps)]  # distinct ids
    return Trace.from_minibatches(halo, mbs, init=halo[:50], capacity=50, feat_bytes=256)


def test_grid_has_lookahead_only_where_the_loader_samples_ahead():
    assert bb.grid(0) == ["none", "static", "fixed:5", "fixed:10", "fixed:25", "fixed:50", "fixed:100"]
    # history only with the scenario's alpha: each period also with the agent's evict=half held fixed
    assert bb.grid(0, 0.05)[7:] == [f"fixed:{k}:0.05:half" for k in bb.FIXED_PERIODS]
    assert not any(s.endswith(":half") for s in bb.grid(8, 0.05))
    g = bb.grid(8)
    assert {s.split(":")[1] for s in g if s.startswith("lookahead")} == {"1", "8"}
    assert len([s for s in g if s.startswith("lookahead")]) == 2 * len(bb.BUDGETS) * len(bb.ADMITS)


def test_hindsight_best_least_rows_then_time_and_ratios():
    rows = {"a": {"fetched_rows": 300, "hit_rate": 0.1}, "b": {"fetched_rows": 200, "hit_rate": 0.2},
            "c": {"fetched_rows": 200, "hit_rate": 0.3}, "rule": {"fetched_rows": 150, "hit_rate": 0.4}}
    assert bb.hindsight_best(rows, ["a", "b", "c"]) == "b"  # a tie goes to the first named
    assert bb.hindsight_best(rows, ["c", "b"]) == "c"
    r = bb.ratios(rows, "b")
    assert r["a"]["rows"] == pytest.approx(1.5) and r["rule"]["rows"] == pytest.approx(0.75)
    assert "time" not in r["a"]
    timed = {"x": {"fetched_rows": 100, "time_s": 12.0, "hit_rate": 0}, "y": {"fetched_rows": 300, "time_s": 10.0, "hit_rate": 0}}
    assert bb.hindsight_best(timed, ["x", "y"]) == "y"  # time first where a time model applies
    assert bb.ratios(timed, "y")["x"] == {"rows": pytest.approx(1 / 3), "time": pytest.approx(1.2)}
    with pytest.raises(KeyError, match="nope"):
        bb.hindsight_best(rows, ["a", "nope"])
    with pytest.raises(ValueError):
        bb.hindsight_best(rows, [])
    lines = bb.table("s", rows, "b")
    assert any("| b (fixed-best) | 200 | 1.000 |" in ln for ln in lines)


@pytest.mark.parametrize("scenario", ["stationary", "bandwidth_schedule"])
def test_run_scenario_on_a_tiny_trace(scenario, tmp_path):
    cfg = load_run_config(ROOT / "configs" / "scenarios" / f"{scenario}.yaml")
    a = argparse.Namespace(classifier=False, compute_s=0.01, agent_windows=2, trace_dir=tmp_path)
    out = bb.run_scenario(scenario, cfg, tiny_trace(), a, agents={})
    rows, best = out["rows"], out["best"]
    fixed = bb.grid(cfg.prefetch.lookahead, cfg.prefetch.alpha)
    assert best in fixed
    assert bb.cost(rows[best]) == min(bb.cost(rows[g]) for g in fixed)
    assert rows["none"]["fetched_rows"] == tiny_trace().num_accesses  # every access fetched
    # Belady fetches no more than any demand-admitting setting at the same capacity
    demand = [g for g in fixed if not g.endswith(":any")]
    assert rows["belady (halo)"]["fetched_rows"] <= min(rows[g]["fetched_rows"] for g in demand)
    assert rows["belady (all remote)"]["hits"] >= rows["belady (halo)"]["hits"]
    assert any(k.startswith("rule:") for k in rows)
    assert ("time_s" in rows[best]) == (scenario == "bandwidth_schedule")
    r = bb.ratios(rows, best)
    assert r[best]["rows"] == 1.0 and all(v["rows"] > 0 for v in r.values())


def test_counterfactual_labels_balance_and_held_out_split(tmp_path):
    """must-have 5: windows labelled by the counterfactual judge (cf_replace_share), balanced per
    scenario, split held-out by scenario."""
    from rudder.agent.eval import balanced, label_balance, label_windows_from_run, split_held_out
    from rudder.agent.hindsight import collect_run

    t = tmp_path / "t" / "trace-r0.npz"
    t.parent.mkdir()
    tiny_trace(steps=30).save(t)
    run = collect_run(t, tmp_path / "runs", window=5, lookahead=0, budget="large", seed=0)
    recs = label_windows_from_run(run, by="counterfactual", scenario="drift")
    assert recs, "no judged window"
    for r in recs:  # the label is the sign of what replacing saved, whatever the run did
        assert r["label_replace"] == (r["cf_replace_share"] > 0.005)
        assert r["scenario"] == "drift" and r["label_by"] == "counterfactual"
    with pytest.raises(ValueError, match="labelling"):
        label_windows_from_run(run, by="vibes")
    fake = [{"label_replace": b, "scenario": s} for s, bs in (("a", [1, 1, 1, 0]), ("b", [0, 0]), ("c", [1, 0, 0]))
            for b in map(bool, bs)]
    lb = label_balance(fake)
    assert lb["all"] == {"n": 9, "replace": 4, "keep": 5, "replace_share": pytest.approx(4 / 9)}
    bal = balanced(fake)
    assert label_balance(bal)["a"]["n"] == 2 and "b" not in label_balance(bal) and label_balance(bal)["c"]["replace"] == 1
    train, test = split_held_out(bal, ["c"])
    assert {r["scenario"] for r in test} == {"c"} and {r["scenario"] for r in train} == {"a"}
    with pytest.raises(ValueError, match="held-out"):
        split_held_out(bal, ["zzz"])


def test_collect_run_takes_the_scenarios_prefetch_settings(tmp_path):
    """collect_run replays with the scenario's own prefetch settings (history_cold's period 10:
    which slots a round counts stale), which the trace does not carry."""
    import json

    from rudder.agent.hindsight import collect_run

    t = tmp_path / "t" / "trace-r0.npz"
    t.parent.mkdir()
    tiny_trace(steps=30).save(t)
    runs = {p: collect_run(t, tmp_path / f"runs{p}", window=5, lookahead=0, budget="large", seed=0,
                           prefetch={"period": p}) for p in (3, 25)}
    for p, run in runs.items():
        assert json.loads((run / "run.json").read_text())["config"]["prefetch"]["period"] == p

    def replaced(run):
        return sum(json.loads(x)["replaced_rows"] for x in (run / "epochs-r0.jsonl").read_text().splitlines())
    assert replaced(runs[3]) != replaced(runs[25])  # a shorter period finds stale slots sooner


def test_counterfactual_greedy_ceiling_on_a_tiny_trace(tmp_path):
    """bench_cf_oracle: each answer is the one the judge finds best given the earlier ones."""
    import bench_cf_oracle as oracle

    t = tmp_path / "t" / "trace-r0.npz"
    t.parent.mkdir()
    tiny_trace(steps=30).save(t)
    pf = {"window": 5, "lookahead": 0, "period": 3}
    for evicts in (None, ["stale", "half"]):
        out = oracle.greedy(t, tmp_path / "runs", ["small", "large"], pf, evicts=evicts)
        assert out["judged_by_agent_path"]  # the judge found each answer's share as the greedy did
        assert len(out["answers"]) == len(out["shares"]) > 0
        for (rep, budget, evict), judged in zip(out["answers"], out["shares"]):
            best = max(judged.values())
            assert rep == (best > 0) and (not rep or judged[f"{budget}/{evict}"] == best)
            assert {k.split("/")[1] for k in judged} == set(evicts or ["stale"])
        recs, rows = oracle.scripted_run(t, tmp_path / "runs", out["answers"], "small", pf)
        assert rows == out["fetched_rows"] and [r["replace"] for r in recs[:len(out["answers"])]] == [a[0] for a in out["answers"]]
        if evicts:  # more options: never worse at any judged window (each answer's best share)
            assert [max(j.values()) for j in out["shares"]][:1] >= [max(j.values()) for j in base["shares"]][:1]
        base = out


def test_collect_run_with_a_maker_replays_its_answers(tmp_path):
    """collect_run's maker/run_id (what bench_cf_oracle's scripted runs use): the run answers as
    the maker does, under the given name, judged over the given horizon; window None keeps the
    prefetch settings' own."""
    import json

    import bench_cf_oracle as oracle

    from rudder.agent.hindsight import collect_run

    t = tmp_path / "t" / "trace-r0.npz"
    t.parent.mkdir()
    tiny_trace(steps=30).save(t)
    answers = [(True, "large"), (False, "small"), (True, "small")]
    run = collect_run(t, tmp_path / "runs", window=None, prefetch={"window": 3, "lookahead": 0, "period": 3},
                      maker=lambda rank: oracle.ScriptedMaker(answers, "small"), run_id="scripted", horizon=1)
    assert run.name == "scripted"
    assert json.loads((run / "run.json").read_text())["config"]["prefetch"]["window"] == 3
    recs = [json.loads(x) for x in (run / "decisions-r0.jsonl").read_text().splitlines()]
    assert [(r["replace"], r["budget"]) for r in recs[:3]] == [(True, "large"), (False, "small"), (True, "small")]
    assert not any(r["replace"] for r in recs[3:])  # keep once the list runs out
    assert any(r.get("cf_replace_share") is not None for r in recs)
