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


def test_replay_rows_replays_one_trace_under_every_word(tmp_path):
    """--replay: one trace (here `rudder tracegen`'s of the ring scenario, as a live run would
    record it) replayed under each word's config; a word's replay is `rudder sim`'s."""
    from rudder.sim.simulate import simulate
    from rudder.sim.tracegen import generate_trace, spec_from_config, write_tracegen

    from bench_scenario_live import replay_rows

    args = build_parser().parse_args(["--scenario", RING, "--epochs", "2", "--set", "train.max_steps_per_epoch=12"])
    base = base_overrides(args)
    cfgs = {w: load_run_config(RING, {**base, **overrides_for(w)})
            for w in ("none", "static", "fixed:5", "lookahead", "rule+probe+half")}
    assert cfgs["rule+probe+half"].rule.probe and cfgs["rule+probe+half"].rule.evict == "half"
    spec = spec_from_config(cfgs["lookahead"])
    trace, facts = generate_trace(spec)
    path = write_tracegen(tmp_path, trace, spec, facts)
    assert path == tmp_path / "trace-r0.npz" and trace.num_minibatches == 24
    rows = replay_rows(tmp_path, cfgs, ranks=1)
    assert set(rows) == set(cfgs)
    none, look = rows["none"], rows["lookahead"]
    assert none["fetched_rows_per_epoch"] == trace.num_accesses / 2 and none["hits_of_belady"] == 0
    assert rows["static"]["fetched_rows_per_epoch"] < none["fetched_rows_per_epoch"]
    assert 0 < look["hits_of_belady"] <= 1
    direct = simulate(trace, "lookahead", source={"config": cfgs["lookahead"].model_dump(mode="json")})
    assert look["fetched_rows_per_epoch"] == direct.summary()["fetched_rows"] / 2


def test_a_script_word_runs_the_agent_on_recorded_answers():
    from bench_scenario_live import run_id

    from rudder.config import check_name

    assert overrides_for("script:/tmp/x/sim-run") == {"prefetch.policy": "agent", "agent.backend": "script",
                                                       "agent.script": "/tmp/x/sim-run"}
    rid = run_id("configs/scenarios/history_cold_bench.yaml", "script:/tmp/x/sim-run", 1)
    assert check_name(rid, "run id") == rid == "live-history_cold_bench-script_sim-run-1"
    # with a prompt of its own (e.g. one whose windows carry no past counterfactual)
    assert overrides_for("script:/tmp/x/sim-run:judge-history")["agent.prompt"] == "judge-history"
    assert run_id("s.yaml", "script:/tmp/x/sim-run:judge-history", 0) == "live-s-script_sim-run_judge-history-0"
    # a key of its own (two words that differ by it, side by side)
    word = "script:/tmp/x/sim-run@prefetch.past_thread=false"
    assert overrides_for(word) == {**overrides_for("script:/tmp/x/sim-run"), "prefetch.past_thread": False}
    rid = run_id("s.yaml", word, 1)
    assert check_name(rid, "run id") == rid == "live-s-script_sim-run_prefetch.past_thread-false-1"
    with pytest.raises(SystemExit, match="bad policy word 'fixed:5'.*KEY=VALUE"):
        overrides_for("fixed:5@prefetch.period")


def test_a_classifier_word_names_a_trained_model():
    from bench_scenario_live import run_id

    from rudder.config import check_name

    assert overrides_for("classifier:random_forest") == {"prefetch.policy": "classifier:random_forest"}
    rid = run_id("configs/scenarios/history_cold_bench.yaml", "classifier:random_forest", 0)
    assert check_name(rid, "run id") == rid
    with pytest.raises(SystemExit, match="unknown policy word 'classifier'"):
        overrides_for("classifier")
