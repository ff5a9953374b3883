"""Issue 18, must-have 5: the decision suite from the mixed-label scenarios with the past
counterfactual (benchmarks/bench_cf_suite_past.py). Its windows are labelled by the
counterfactual judge's forks (replace when the best option saves > 0.5% of the horizon's remote
rows, keep when none saves anything, too close left out), carry the past counterfactual the live
trainer computes, are balanced per scenario and split by graph; none comes from the
judge-history-3 example pool's trace. Fast: small random traces, no model."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_cf_suite_past as suite  # noqa: E402

from rudder.agent.context import ContextBuilder  # noqa: E402
from rudder.agent.eval import balanced, load_windows, split_held_out  # noqa: E402
from rudder.agent.history_examples import POOL_DIGEST, POOL_FILE  # noqa: E402
from rudder.agent.judge import REPLACE_MARGIN  # noqa: E402
from rudder.config import PrefetchConfig  # noqa: E402
from rudder.sim.tracegen import random_trace  # noqa: E402

SHIPPED = ROOT / "benchmarks" / "results" / "cf_suite_past" / "heldout-synth-medium.jsonl"
PC = PrefetchConfig(lookahead=0, window=5, period=6, alpha=0.1, init="random")


def _label(judged: dict) -> bool | None:
    best = max(judged.values())
    return True if best > REPLACE_MARGIN else False if best <= 0 else None


@pytest.fixture(scope="module")
def windows():
    out = []
    for g, seed in (("graph-a", 5), ("graph-b", 6)):
        t = random_trace(halo=400, minibatches=40, batch=80, capacity=0.25, skew=0.8, epochs=2, seed=seed,
                         init="random")
        ctx = suite.trace_context(t, PC, {"dataset": g})
        out += suite.suite_windows(t, PC, ctx, f"scn-{g}", g, coins=["large_half"], seeds=(0, 1))
    return out


def test_labels_come_from_the_judges_forks_and_too_close_is_left_out(windows):
    assert windows and {r["label_replace"] for r in windows} == {True, False}
    for r in windows:
        assert set(r["judged"]) == {f"{b}_{e}" for b in ("small", "medium", "large") for e in ("stale", "half")}
        assert _label(r["judged"]) is r["label_replace"]  # never None: too close is not in the suite
        assert r["best"] == (max(r["judged"], key=r["judged"].get) if r["label_replace"] else None)


def test_windows_carry_the_past_counterfactual_and_the_prompts_read_it(windows):
    for r in windows:
        w = r["window"]
        assert "past_keep_fetched" in w and all(f"past_fetched_{k}" in w for k in r["judged"])
        assert r["recent"] == [] if w["window"] == 0 else len(r["recent"]) >= 1
    r = next(r for r in windows if r["window"]["window"] > 0)
    text = ContextBuilder(r["context"], "judge-history-2b").build(r["window"], [], r["recent"]).messages[-1]["content"]
    assert "a round at this window's start" in text


def test_the_build_is_deterministic_and_keeps_repeats_once(windows):
    t = random_trace(halo=400, minibatches=40, batch=80, capacity=0.25, skew=0.8, epochs=2, seed=5, init="random")
    again = suite.suite_windows(t, PC, suite.trace_context(t, PC, {"dataset": "graph-a"}), "scn-graph-a", "graph-a",
                                coins=["large_half"], seeds=(0, 1))
    assert again == [r for r in windows if r["graph"] == "graph-a"]
    keys = [json.dumps([r["scenario"], r["window"], r["recent"]], sort_keys=True) for r in windows]
    assert len(keys) == len(set(keys))


def test_balance_and_split_by_graph(windows):
    bal = balanced(windows, key="scenario", seed=0)
    for g in ("graph-a", "graph-b"):
        labs = [r["label_replace"] for r in bal if r["graph"] == g]
        assert labs and labs.count(True) == labs.count(False)
    tune, test = split_held_out(bal, ["graph-b"], key="graph")
    assert {r["graph"] for r in test} == {"graph-b"} and "graph-b" not in {r["graph"] for r in tune}
    assert not {r["trace_digest"] for r in tune} & {r["trace_digest"] for r in test}


def test_baselines_score_the_windows(windows):
    rows = {r["decider"]: r for r in suite.score_baselines(windows, windows)}
    assert rows["keep"]["accuracy"] == sum(not r["label_replace"] for r in windows) / len(windows)
    follow = rows["follow the past counterfactual"]
    assert follow["accuracy"] == sum(suite.follow_past(r)[0] == r["label_replace"] for r in windows) / len(windows)
    assert follow["fallbacks"] == 0


def test_the_shipped_held_out_file_is_balanced_judged_and_not_the_pools():
    recs = load_windows(SHIPPED)
    assert {r["graph"] for r in recs} == {"synth-medium"} and {r["scenario"] for r in recs} == {"history_cold"}
    labs = [r["label_replace"] for r in recs]
    assert labs.count(True) == labs.count(False) > 0
    pool = [json.loads(x) for x in POOL_FILE.read_text().splitlines() if x.strip()]
    for r in recs:
        assert _label(r["judged"]) is r["label_replace"] and "past_keep_fetched" in r["window"]
        assert r["trace_digest"] != POOL_DIGEST[:12] and r["trace_digest"] not in {e["trace_digest"][:12] for e in pool}
    assert not suite.pool_overlap(recs)


def _pool_windows() -> list[dict]:
    """The example pool's own labelled windows as suite windows (the pool run's facts)."""
    from rudder.agent.history_examples import PAST_CONTEXT

    pool = [json.loads(x) for x in POOL_FILE.read_text().splitlines() if x.strip()]
    return [{"context": PAST_CONTEXT, "window": e["window"], "recent": e["recent"],
             "label_replace": e["label"] == "replace"} for e in pool if e["label"] in ("replace", "keep")]


def test_the_nearest_example_baseline_is_a_lookup_in_the_pool():
    # each pool window is its own nearest (distance 0): the lookup answers its own label
    recs = _pool_windows()
    assert len(recs) > 20 and {r["label_replace"] for r in recs} == {True, False}
    assert all(suite.nearest_example(r)[0] is r["label_replace"] for r in recs)
    # and it is what judge-history-3 shows last
    r = recs[0]
    prompt = ContextBuilder(r["context"], "judge-history-3").build(r["window"], [], r["recent"])
    assert suite.last_example_replace(prompt) is suite.nearest_example(r)[0]


def test_a_models_answers_are_counted_against_its_last_example():
    from rudder.agent.history_examples import JUDGE_HISTORY_CANNED, PAST_CANNED, PAST_CONTEXT

    w = PAST_CANNED[0]
    prompt = ContextBuilder(PAST_CONTEXT, "judge-history-2b").build(w["window"], [], w["recent"])
    last = suite.last_example_replace(prompt)
    assert last is PAST_CANNED[-1]["answer"]["replace"]  # 2b's examples are fixed: its last is the last canned
    assert suite.last_example_replace(ContextBuilder(PAST_CONTEXT, "judge-history").build(
        w["window"], [], w["recent"])) is JUDGE_HISTORY_CANNED[-1]["answer"]["replace"]
    rows = [{"ok": True, "replace": last, "cf": None, "latency_s": 1.0, "fallback": None, "last": last},
            {"ok": False, "replace": not last, "cf": None, "latency_s": 1.0, "fallback": None, "last": last},
            {"ok": False, "replace": False, "cf": None, "latency_s": None, "fallback": "timeout", "last": last}]
    s = suite.summarise("m", "judge-history-2b", rows)
    assert s["as_last_example"] == "1/2" and "| 1/2 |" in suite.table([s])


def test_the_canned_order_experiment_puts_another_example_last():
    from rudder.agent.history_examples import PAST_CANNED, PAST_CONTEXT

    before = list(PAST_CANNED)
    w = PAST_CANNED[0]
    try:
        suite.reorder_canned([1, 0, 3, 2])
        prompt = ContextBuilder(PAST_CONTEXT, "judge-history-2b").build(w["window"], [], w["recent"])
        assert suite.last_example_replace(prompt) is before[2]["answer"]["replace"] is False
        for bad in ([0, 0, 1], [4]):
            with pytest.raises(SystemExit, match="not distinct indices"):
                suite.reorder_canned(bad)
        suite.reorder_canned([])  # no example: nothing to copy
        prompt = ContextBuilder(PAST_CONTEXT, "judge-history-2b").build(w["window"], [], w["recent"])
        assert suite.last_example_replace(prompt) is None and len(prompt.messages) == 2
    finally:
        PAST_CANNED[:] = before
