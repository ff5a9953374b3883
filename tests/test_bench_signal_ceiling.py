"""benchmarks/bench_signal_ceiling.py (issue 18, BENCHMARKS 7z): the learners read the window's
signals as the prompts compute them and nothing of its label or its future; trained on one set,
they answer another; the summary over seeds."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_signal_ceiling as ceiling  # noqa: E402

from rudder.agent.classifiers import windows_xy  # noqa: E402
from rudder.agent.eval import load_windows  # noqa: E402
from rudder.agent.signals import SIGNAL_FEATURES, past_counterfactual  # noqa: E402

SHIPPED = ROOT / "benchmarks" / "results" / "cf_suite_past" / "heldout-synth-medium.jsonl"


def _separable(n: int, shift: float = 0.0) -> list[dict]:
    """Labelled windows whose past counterfactual tells the label: a replace window's large/half
    round saved 8% of its rows, a keep window's none."""
    base = load_windows(SHIPPED)[0]
    out = []
    for i in range(n):
        r = copy.deepcopy(base)
        replace = i % 2 == 0
        keep = r["window"]["past_keep_fetched"]
        for k in [k for k in r["window"] if k.startswith("past_fetched_")]:
            r["window"][k] = keep
        r["window"]["past_fetched_large_half"] = int(keep * (1 - (0.08 + shift if replace else 0.0)))
        r["window"]["hit_rate"] = 0.2 + 0.01 * (i % 5)  # noise the learners must see past
        r["label_replace"] = replace
        out.append(r)
    return out


def test_features_are_the_prompts_signals_and_read_no_label_or_future():
    rec = load_windows(SHIPPED)[0]
    x = windows_xy([rec])[0][0]
    assert x.shape == (len(SIGNAL_FEATURES),) and np.isfinite(x).all()
    pc = past_counterfactual(rec["window"])
    assert x[SIGNAL_FEATURES.index("sig_past_best")] == min(pc.values())
    assert x[SIGNAL_FEATURES.index("sig_hit_rate")] == rec["window"]["hit_rate"]
    flipped = {**copy.deepcopy(rec), "label_replace": not rec["label_replace"], "best": None,
               "judged": {k: -v for k, v in rec["judged"].items()}}
    assert np.array_equal(windows_xy([flipped])[0][0], x)  # the label and the judged future are not read


def test_learners_trained_on_one_set_answer_another():
    train, test = _separable(20), _separable(10, shift=0.02)
    rows = {r["decider"]: r for r in ceiling.held_out({"train": train}, test, seeds=(0, 1))}
    assert rows["logistic regression"]["accuracy"] == 1.0
    assert rows["random forest"]["accuracy min-max"] == "1.000-1.000"
    assert {r["trained on"] for r in rows.values()} >= {"train", "-", "pool"}
    # trained on flipped labels the same learner is wrong everywhere: the labels are what it learns
    flipped = [{**r, "label_replace": not r["label_replace"]} for r in train]
    wrong = {r["decider"]: r for r in ceiling.held_out({"flipped": flipped}, test)}
    assert wrong["logistic regression"]["accuracy"] == 0.0


def test_summary_over_seeds():
    rows = [{"decider": "d", "accuracy": a, "pass_at_1_cf": p} for a, p in ((0.8, "8/10"), (0.9, "9/10"))]
    s = ceiling.over_seeds(rows)
    assert s["accuracy"] == 0.85 and s["accuracy min-max"] == "0.800-0.900"
    assert s["pass_at_1_cf"] == "8/10 9/10"
    assert ceiling.over_seeds(rows[:1])["accuracy min-max"] == "-"


def test_leave_one_out_on_a_separable_set():
    rows = {r["decider"]: r for r in ceiling.leave_one_out("s", _separable(12))}
    assert rows["logistic regression"]["accuracy"] == 1.0 and rows["logistic regression"]["n"] == 12
