"""Hindsight labels for the decision-quality suite: a replayed run with both actions, labelled by
`rudder agent label`, checked against the counterfactual (both branches replayed from the same
buffer state). Small random traces, the real buffer code, no model."""
from __future__ import annotations

import json

import pytest

from rudder.agent.eval import label_windows_from_run
from rudder.agent.hindsight import (check_labels, collect_run, counterfactual_gains,
                                    hindsight_label)
from rudder.records import read_jsonl
from rudder.sim.tracegen import random_trace


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("hind")
    t = random_trace(halo=600, minibatches=120, batch=120, capacity=0.2, skew=0.8, epochs=2, seed=3)
    path = t.save(d / "trace-r0.npz")
    return collect_run(path, d / "runs", window=5, lookahead=4, seed=1)


def test_collected_run_holds_both_actions_as_the_agent_applies_them(run):
    decs = read_jsonl(run / "decisions-r0.jsonl")
    assert {d["replace"] for d in decs} == {True, False}
    assert all(d["staleness"] == 1 for d in decs if d["applied_step"] is not None)
    meta = json.loads((run / "run.json").read_text())
    assert meta["simulated"] and meta["config"]["prefetch"]["window"] == 5
    # a replace decision holds a lookahead round on every minibatch of its window, keep none
    mbs = {m["global_step"]: m for m in read_jsonl(run / "minibatches-r0.jsonl")}
    applied = [d for d in decs if d["applied_step"] is not None]
    assert {d["replace"] for d in applied} == {True, False}
    for d in applied:
        admitted = [mbs[s]["admitted_rows"] for s in range(d["applied_step"], d["applied_step"] + 5) if s in mbs]
        assert admitted and all((n > 0) == d["replace"] for n in admitted), d["window"]
        assert d["budget"] == "medium" or not d["replace"]


def test_counterfactual_reproduces_the_run_and_each_branch(run):
    """Replaying the recorded actions reproduces every recorded hit count (it raises otherwise);
    with a one-window horizon the branch the run took IS the run: its hits equal the recorded
    hits of the next window."""
    gains = counterfactual_gains(run, 0, horizon=1)
    mbs = sorted(read_jsonl(run / "minibatches-r0.jsonl"), key=lambda m: m["global_step"])
    decs = {d["window"]: d for d in read_jsonl(run / "decisions-r0.jsonl")}
    assert len(gains) >= 20
    for wid, cf in gains.items():
        nxt = mbs[(wid + 1) * 5:(wid + 2) * 5]
        hits = sum(m["hits"] for m in nxt)
        extra = sum(m["replaced_rows"] for m in nxt)
        taken = "replace" if decs[wid]["replace"] else "keep"
        assert cf[f"hits_{taken}"] == hits and cf[f"extra_{taken}"] == extra, wid
        assert cf["gain"] == (cf["hits_replace"] - cf["hits_keep"]) - (cf["extra_replace"] - cf["extra_keep"])
        assert cf["remote"] == sum(m["remote_rows"] for m in nxt)
    assert any(cf["gain"] > 0 for cf in gains.values())


def test_hindsight_label_thresholds():
    assert hindsight_label({"share": 0.02}) is True
    assert hindsight_label({"share": 0.0}) is False and hindsight_label({"share": -0.01}) is False
    assert hindsight_label({"share": 0.002}) is None and hindsight_label(None) is None


def test_label_and_check_from_the_run_directory(run):
    recs = label_windows_from_run(run)
    assert recs and {r["label_replace"] for r in recs} <= {True, False}
    # contexts of a replay are rebuilt from its trace, not left at zero
    ctx = recs[0]["context"]
    assert ctx["capacity"] == 120 and ctx["halo_nodes"] == 600 and ctx["window"] == 5
    assert ctx["lookahead"] == 4
    # history entries carry what the agent's own history holds: the judged window and deltas,
    # so the default prompt can build hindsight examples from them
    late = max(recs, key=lambda r: len(r["history"]))
    h = late["history"][-1]
    assert h["judged"]["window"] == h["window"] and "hit_delta" in h and "outcome_hit_rate" in h
    from rudder.agent.context import hindsight_example
    from rudder.agent.messages import HistoryEntry

    assert any(hindsight_example(HistoryEntry.model_validate(x)) for r in recs for x in r["history"])
    checked = check_labels(recs, run)
    assert len(checked) == len(recs)
    for r in checked:
        h = r["hindsight"]
        if h is None:
            continue
        assert h["label"] == hindsight_label({"share": h["gain_share"]}) or abs(h["gain_share"]) < 1e-4
        assert r["agrees"] == (None if h["label"] is None else h["label"] == r["label_replace"])
