"""Classifiers trained on labelled windows (`rudder classifiers train --windows`, issue 18,
BENCHMARKS 7z): they learn the counterfactual label from the signals the judge-history prompts
show (SIGNAL_FEATURES), and as policy `classifier:<name>` read those signals of each window of a
history-only run, the past counterfactual included."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rudder.agent import classifiers as C
from rudder.agent.signals import SIGNAL_FEATURES, past_counterfactual, signal_features
from rudder.config import PrefetchConfig
from rudder.sim.simulate import parse_policy, simulate
from rudder.sim.tracegen import random_trace

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "benchmarks" / "results" / "cf_suite_past" / "heldout-synth-medium.jsonl"


def _train(out: Path, *extra: str) -> int:
    from rudder.agent import classifiers_cli

    parser = argparse.ArgumentParser(prog="rudder")
    classifiers_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["classifiers", "train", "--windows", str(SHIPPED), "--out", str(out),
                              "--folds", "2", *extra])
    return args.func(args)


def test_signal_features_name_what_the_prompts_show():
    w = json.loads(SHIPPED.read_text().splitlines()[0])
    f = signal_features(w["window"], w["recent"], w["context"]["capacity"])
    assert list(f) == SIGNAL_FEATURES
    pc = past_counterfactual(w["window"])
    assert f["sig_past_best"] == min(pc.values()) and f["sig_past_large_half"] == pc["large/half"]
    assert f["sig_stale_share"] == w["window"]["stale_slots"] / w["context"]["capacity"]
    bare = signal_features({"hit_rate": 0.3}, [], 100)  # a window that tells little: the rest 0
    assert bare["sig_hit_rate"] == 0.3 and sum(v != 0 for v in bare.values()) == 1


def test_train_on_windows_records_the_label_and_the_features(tmp_path):
    out = tmp_path / "models"
    assert _train(out, "--models", "rf,logreg") == 0
    meta = json.loads((out / "random_forest.json").read_text())
    assert meta["feature_names"] == SIGNAL_FEATURES and meta["samples"] == 42
    assert meta["label_rule"] == "counterfactual (label_replace)" and meta["datasets"] == ["synth-medium"]
    assert meta["cv_accuracy"] is not None and meta["positives"] == 21
    with pytest.raises(SystemExit, match="apply to --runs"):  # labelled windows carry their label
        _train(out, "--margin", "0.02")


def _replay(out: Path, monkeypatch) -> tuple[list[dict], list[dict], object, object]:
    """A history-only replay steered by the model in `out`: the features each decision read, the
    run's windows (settled), the result and the trace."""
    from rudder.prefetch.past import settle

    seen: list[dict] = []
    real = C.SavedClassifier.decide
    monkeypatch.setattr(C.SavedClassifier, "decide", lambda self, f: (seen.append(dict(f)), real(self, f))[1])
    trace = random_trace(halo=400, minibatches=40, batch=80, capacity=0.25, skew=0.8, epochs=2, seed=7,
                         init="random")
    pc = PrefetchConfig(policy="classifier:rf", lookahead=0, window=5, period=10, init="random")
    res = simulate(trace, parse_policy("classifier:rf", pc), extra={"models_dir": str(out)})
    return seen, [settle(w) for w in res.windows], res, trace


def _read_their_windows(seen: list[dict], wins: list[dict], trace) -> None:
    assert len(seen) == len(wins) == trace.num_minibatches // 5 > 4
    for i, (f, w) in enumerate(zip(seen, wins)):  # each window's own signals, the 3 before it for trends
        assert {k: f[k] for k in SIGNAL_FEATURES} == signal_features(w, wins[max(0, i - 3):i], trace.capacity)
    assert all("past_keep_fetched" in w for w in wins)  # the model asked for the past counterfactual
    assert any(f["sig_past_best"] < 0 for f in seen)  # and some past round saved rows


def test_a_windows_trained_model_steers_a_history_only_replay_from_its_windows(tmp_path, monkeypatch):
    out = tmp_path / "models"
    assert _train(out, "--models", "rf") == 0
    seen, wins, res, trace = _replay(out, monkeypatch)
    _read_their_windows(seen, wins, trace)
    assert len(res.decisions) == len(wins)
    assert {d["policy"] for d in res.decisions} == {"classifier:rf"}
    # its signals are a history-only window's: a run that samples ahead is refused, naming why,
    # by the policy and before any cluster starts
    with pytest.raises(ValueError, match="needs prefetch.lookahead: 0, got 3"):
        C.ClassifierPolicy(PrefetchConfig(lookahead=3), "rf", models_dir=str(out))
    from rudder.config import RunConfig
    from rudder.runner import preflight

    monkeypatch.setenv(C.MODELS_DIR_ENV, str(out))

    def problems(lookahead: int) -> list[str]:
        cfg = RunConfig.model_validate({"prefetch": {"policy": "classifier:random_forest", "lookahead": lookahead}})
        return [p for p in preflight(cfg, probe=False) if p.startswith("prefetch.policy")]

    assert problems(0) == []
    assert problems(3) == [f"prefetch.policy: classifier:random_forest ({out / 'random_forest.joblib'}) learnt "
                           "from history-only labelled windows (--windows): it needs prefetch.lookahead: 0, got 3"]


def test_it_waits_for_a_past_counterfactual_measured_off_the_loader(tmp_path, monkeypatch):
    """Live (prefetch.past_thread) a window's past counterfactual arrives as a future the
    record's reader settles; this decider answers on the loader thread, so it waits for it
    rather than read every past signal as 0."""
    from rudder.prefetch.past import PastCounterfactual

    out = tmp_path / "models"
    assert _train(out, "--models", "rf") == 0
    of = PastCounterfactual.of  # measured off the replay's thread, as a live trainer measures it
    monkeypatch.setattr(PastCounterfactual, "of", classmethod(lambda cls, policy, background=False: of(policy, True)))
    seen, wins, _, trace = _replay(out, monkeypatch)
    _read_their_windows(seen, wins, trace)
