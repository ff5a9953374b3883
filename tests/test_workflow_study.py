"""Study and execution configs: validation names the bad key; expansion; every shipped config
parses and builds."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rudder.config import ConfigError, RunConfig
from rudder.workflow.execution import (
    COLLECTOR,
    build_parsl_config,
    parse_execution,
    split_execution_file,
    with_endpoint,
)
from rudder.workflow.study import expand, load_study, parse_study

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

BASE_STUDY = {
    "name": "t",
    "datasets": ["synth-tiny"],
    "machines": [1, 2],
    "policies": ["none", "fixed"],
}


def write(tmp_path: Path, data, name="study.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def study_error(tmp_path, data) -> str:
    with pytest.raises(ConfigError) as e:
        load_study(write(tmp_path, data))
    return str(e.value)


# -- study validation ---------------------------------------------------------------------------

def test_unknown_top_level_key_is_named(tmp_path):
    msg = study_error(tmp_path, {**BASE_STUDY, "machine": [4]})
    assert "machine:" in msg and "Extra inputs" in msg and "study.yaml" in msg


def test_unknown_run_key_is_named_with_its_path(tmp_path):
    msg = study_error(tmp_path, {**BASE_STUDY, "run": {"train": {"epochz": 1}}})
    assert "run.train.epochz" in msg


def test_bad_run_value_is_named(tmp_path):
    msg = study_error(tmp_path, {**BASE_STUDY, "run": {"train": {"epochs": 0}}})
    assert "run.train.epochs" in msg and "greater than 0" in msg


def test_unknown_policy_lists_valid_ones(tmp_path):
    msg = study_error(tmp_path, {**BASE_STUDY, "policies": ["none", "belady"]})
    assert "policies" in msg and "belady" in msg and "lookahead" in msg


def test_axis_set_under_run_is_rejected(tmp_path):
    msg = study_error(tmp_path, {**BASE_STUDY, "run": {"cluster": {"machines": 3}}})
    assert "run.cluster.machines" in msg and "machiness" not in msg


def test_bad_machines_and_name(tmp_path):
    assert "machines" in study_error(tmp_path, {**BASE_STUDY, "machines": [0, 2]})
    assert "name" in study_error(tmp_path, {**BASE_STUDY, "name": "a b/c"})
    assert "datasets" in study_error(tmp_path, {**BASE_STUDY, "datasets": []})


def test_sweep_and_exclude_keys_checked(tmp_path):
    assert "sweep.prefetch.fractionn" in study_error(
        tmp_path, {**BASE_STUDY, "sweep": {"prefetch.fractionn": [0.1]}})
    assert "exclude.0.machine" in study_error(
        tmp_path, {**BASE_STUDY, "exclude": [{"machine": 2}]})
    assert "every run" in study_error(
        tmp_path, {**BASE_STUDY, "exclude": [{"dataset": "synth-tiny"}]})
    # an entry that matches no point is a typo, not a no-op: named with the axis' values
    msg = study_error(tmp_path, {**BASE_STUDY, "exclude": [{"machines": 1}, {"policy": "lookahed"}]})
    assert 'exclude.1: {"policy": "lookahed"} matches no run of the grid' in msg
    assert f'policy: {json.dumps(BASE_STUDY["policies"])}' in msg
    msg = study_error(tmp_path, {**BASE_STUDY, "exclude": [{"machines": "2", "repeat": 3}]})
    assert 'exclude.0: {"machines": "2", "repeat": 3} matches no run' in msg and "repeat: [0]" in msg


def test_malformed_yaml(tmp_path):
    msg = study_error(tmp_path, "name: [unclosed\n")
    assert "malformed YAML" in msg


# -- expansion ----------------------------------------------------------------------------------

def test_expand_grid_ids_and_layering(tmp_path):
    data = {**BASE_STUDY, "trainers": [1], "repeats": 2,
            "run": {"train": {"epochs": 2, "seed": 10}},
            "sweep": {"prefetch.prefetch_fraction": [0.25, 0.5]},
            "exclude": [{"machines": 2, "policy": "none"}]}
    base = {"train": {"epochs": 5, "batch_size": 64}, "cluster": {"start_timeout_s": 99}}
    study = expand(parse_study(data), base, runs_dir="R")
    # 1 dataset x 2 machines x 2 policies x 2 fractions x 2 repeats, minus 2x2 excluded
    assert len(study.runs) == 12
    ids = [r.run_id for r in study.runs]
    assert len(set(ids)) == len(ids)
    r = study.runs[0]
    assert r.config.train.epochs == 2  # study run: beats execution base
    assert r.config.train.batch_size == 64  # execution base kept
    assert r.config.cluster.start_timeout_s == 99
    assert r.config.runs_dir == str(Path("R") / "t")
    seeds = sorted({x.config.train.seed for x in study.runs})
    assert seeds == [10, 11]  # repeat r -> seed + r
    assert r.run_id.startswith("synth-tiny-m1-t1-none-prefetch_fraction0.25-r0-")
    assert r.run_id.endswith(r.config_hash[:10])
    assert not any(x.point["machines"] == 2 and x.point["policy"] == "none" for x in study.runs)
    # partitions are shared by runs with the same dataset and machine count
    assert len({x.part_key for x in study.runs}) == 2
    # stable: the same study expands to the same ids
    assert [x.run_id for x in expand(parse_study(data), base, runs_dir="R").runs] == ids


def test_hash_changes_with_the_config_not_the_runs_dir():
    a = expand(parse_study(BASE_STUDY), runs_dir="A").runs
    b = expand(parse_study(BASE_STUDY), runs_dir="B").runs
    c = expand(parse_study({**BASE_STUDY, "run": {"train": {"epochs": 7}}}), runs_dir="A").runs
    assert [x.run_id for x in a] == [x.run_id for x in b]
    assert not {x.run_id for x in a} & {x.run_id for x in c}


def test_default_study_is_small_and_complete():
    ex, base = split_execution_file(CONFIGS / "local.yaml")
    study = load_study(CONFIGS / "studies" / "local_default.yaml", base)
    policies = {r.point["policy"] for r in study.runs}
    from rudder.prefetch.policies import REGISTRY

    # every policy that runs without extra inputs (classifier:<name> needs a trained model,
    # collect only gathers the classifiers' training data)
    assert policies == {"none", "static", "fixed", "lookahead", "agent"}
    assert policies <= set(REGISTRY)
    # a graph and a shaped link where communication matters; the agent on one model server
    # per node (loaded once for the study)
    assert {r.point["machines"] for r in study.runs} == {2, 4}
    assert {r.dataset for r in study.runs} == {"synth-medium"}
    assert {r.config.cluster.bandwidth for r in study.runs} == {"25mbit"}
    assert len(study.runs) == 10
    assert all(r.config.train.epochs <= 3 for r in study.runs)
    agent = [r.config.agent for r in study.runs if r.point["policy"] == "agent"]
    assert all(a.backend == "http" and not a.url for a in agent)
    big = load_study(CONFIGS / "studies" / "local_synth_small.yaml", base)
    assert {r.point["policy"] for r in big.runs} == policies


def test_default_study_gives_the_agent_at_least_5_questions_per_trainer():
    """Each agent trainer asks at every closed window (and once at the start when it samples
    ahead): enough minibatches that the model can be asked 5+ times; whether it answers that
    often is the server's time per answer (tests/test_agent_service.py, BENCHMARKS §5/§6)."""
    from rudder.data.synthetic import PRESETS

    ex, base = split_execution_file(CONFIGS / "local.yaml")
    study = load_study(CONFIGS / "studies" / "local_default.yaml", base)
    for run in (r for r in study.runs if r.point["policy"] == "agent"):
        c = run.config
        spec = PRESETS[c.dataset.name]
        train_per_trainer = spec.nodes * spec.train_frac / (c.cluster.machines * c.cluster.trainers_per_machine)
        steps = -(-int(train_per_trainer) // c.train.batch_size) * c.train.epochs
        questions = steps // c.prefetch.window + (c.agent.start_decision and c.prefetch.lookahead > 0)
        assert questions >= 5, (run.run_id, steps, questions)


# -- execution configs ----------------------------------------------------------------------------

def test_execution_errors_name_the_key(tmp_path):
    good = {"executors": {"x": {"type": "HighThroughputExecutor",
                                "provider": {"type": "LocalProvider"}}}}
    parse_execution(good)
    bad = yaml.safe_load(yaml.safe_dump(good))
    bad["executors"]["x"]["max_worker"] = 2
    with pytest.raises(ConfigError, match=r"execution\.executors\.x\..*max_worker"):
        parse_execution(bad, "f.yaml")
    bad = yaml.safe_load(yaml.safe_dump(good))
    bad["executors"]["x"]["provider"] = {"type": "PBSProProvider"}
    with pytest.raises(ConfigError, match=r"execution\.executors\.x.*provider"):
        parse_execution(bad)
    with pytest.raises(ConfigError, match="apps.train: no executor labelled 'y'"):
        parse_execution({**good, "apps": {"train": "y"}})
    with pytest.raises(ConfigError, match=r"execution\.retries"):
        parse_execution({**good, "retries": -1})
    with pytest.raises(ConfigError, match="walltime"):
        parse_execution({"executors": {"s": {"type": "HighThroughputExecutor", "provider": {
            "type": "SlurmProvider", "walltime": "2h"}}}})
    p = write(tmp_path, {"train": {"epochs": 1}}, "noexec.yaml")
    with pytest.raises(ConfigError, match="no `execution:` section"):
        split_execution_file(p)


SITE = {"RUDDER_ACCOUNT": "m1234", "RUDDER_MODEL": "/models/gemma.gguf", "SCRATCH": "/scratch"}


@pytest.mark.parametrize("name", ["local.yaml", "perlmutter/cpu.yaml", "perlmutter/gpu.yaml"])
def test_shipped_execution_files_parse_and_build(name, monkeypatch, tmp_path):
    import parsl.addresses

    ex, base = split_execution_file(CONFIGS / name, env=SITE)
    base.pop("runs_dir", None)  # the study's runs root (scaling_study.py --runs-dir default)
    RunConfig.model_validate(base)  # the run defaults are a valid RunConfig (rudder run --config)
    # hsn0 exists on Perlmutter only; the rest of the build is real
    monkeypatch.setattr(parsl.addresses, "address_by_interface", lambda ifname: "127.0.0.1")
    cfg = build_parsl_config(ex, run_dir=tmp_path)
    labels = [e.label for e in cfg.executors]
    assert COLLECTOR in labels
    for app in ("stage", "partition", "train"):
        assert ex.route(app) in labels
    assert ex.route("collect") == COLLECTOR
    if "perlmutter" in name:
        ex_obj = next(e for e in cfg.executors if e.label == ex.route("train"))
        prov = ex_obj.provider
        assert type(ex_obj).__name__ == "MPIExecutor" and ex.is_mpi(ex.route("train"))
        assert "--constraint=" + ("gpu" if "gpu" in name else "cpu") in prov.scheduler_options
        assert prov.account == "m1234" and prov.qos == "regular" and prov.walltime
        assert "replace me" not in (CONFIGS / name).read_text()  # site values are variables
        assert ex.launch.type == "slurm" and ex.launch.ifname == "hsn0"
        assert base["cluster"]["netns"] is False
        assert base["agent"]["model"]["name"] == "gemma3-4b" and base["agent"]["model"]["path"]
        assert "llama3.2-3b" in (CONFIGS / name).read_text()


def test_with_endpoint_routes_everything_to_globus():
    ex, _ = split_execution_file(CONFIGS / "perlmutter" / "gpu.yaml", env=SITE)
    gx = with_endpoint(ex, "4b116d3c-1703-4f8f-9f6f-39921e5864df")
    assert set(gx.executors) == {"globus"} and gx.is_remote()
    assert all(gx.route(a) == "globus" for a in ("stage", "partition", "train", "collect"))
    assert gx.is_mpi("globus")  # gpu.yaml's runs take whole nodes: the endpoint is MPI
    assert gx.launch.type == "slurm"
    with pytest.raises(ConfigError, match="not a UUID"):
        with_endpoint(ex, "nope")


