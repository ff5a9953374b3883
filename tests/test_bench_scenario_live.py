"""benchmarks/bench_scenario_live.py's options: --set overrides every run's config (the policy
word's keys win), a bad --set stops before any run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_scenario_live import base_overrides, build_parser, overrides_for  # noqa: E402

from rudder.config import load_run_config  # noqa: E402

RING = str(ROOT / "configs" / "scenarios" / "ring_cluster.yaml")


def test_set_overrides_the_scenario_in_every_run():
    args = build_parser().parse_args([
        "--scenario", RING, "--bandwidth", "100mbit", "--epochs", "2",
        "--set", "dataset.name=synth-ring-bench", "--set", "train.max_steps_per_epoch=40",
        "--set", "train.fanouts=10,5", "--set", "prefetch.policy=none"])
    base = base_overrides(args)
    cfg = load_run_config(RING, {**base, **overrides_for("lookahead")})
    assert cfg.dataset.name == "synth-ring-bench" and cfg.dataset.partition_method == "random"
    assert cfg.train.max_steps_per_epoch == 40 and cfg.train.epochs == 2
    assert cfg.train.fanouts == [10, 5] and cfg.cluster.bandwidth == "100mbit"
    assert cfg.train.order == "cluster" and cfg.train.eval_every == 0
    assert cfg.prefetch.policy == "lookahead"  # the word's key wins over --set


def test_without_set_the_scenario_is_unchanged():
    base = base_overrides(build_parser().parse_args(["--scenario", RING]))
    cfg = load_run_config(RING, base)
    assert cfg.dataset.name == "synth-ring" and "cluster.bandwidth" not in base


@pytest.mark.parametrize("bad", ["dataset.name", "train.fanouts=[1,"])
def test_bad_set_stops_with_one_line(bad):
    with pytest.raises(SystemExit, match="--set"):
        base_overrides(build_parser().parse_args(["--set", bad]))
