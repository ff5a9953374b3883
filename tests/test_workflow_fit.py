"""Site values and fit, checked when a study is loaded, before anything is submitted: `${NAME}`
variables of an execution file come from the environment or --var and a missing one is named;
a Slurm block's walltime must hold a run started at its drain period; the runs allowed at once
times the largest run must fit a block; stage and partition never run on GPU blocks."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rudder.config import ConfigError
from rudder.workflow.execution import expand_vars, parse_execution, split_execution_file
from rudder.workflow.fit import fit_study, walltime_s
from rudder.workflow.study import expand, parse_study

REPO = Path(__file__).resolve().parents[1]
SITE = {"RUDDER_ACCOUNT": "m1234", "RUDDER_MODEL": "/models/gemma.gguf", "SCRATCH": "/scratch"}


def test_expand_vars_defaults_nesting_and_missing():
    env = {"A": "a", "B": "", "C": "c"}
    missing: list[str] = []
    assert expand_vars("x${A}y", env, missing) == "xay"
    assert expand_vars("${B:-dflt}", env, missing) == "dflt"  # empty counts as unset
    assert expand_vars("${X:-${C}_g}", env, missing) == "c_g"
    assert expand_vars("$PATH:${A}", env, missing) == "$PATH:a"  # shell variables stay
    assert expand_vars("${NOPE}/d", env, missing) == "${NOPE}/d" and missing == ["NOPE"]


def study(machines=(1, 2, 4), **run):
    return expand(parse_study({"name": "s", "datasets": ["synth-tiny"], "machines": list(machines),
                               "policies": ["none"], "run": run}), runs_dir="/runs")


def slurm_ex(walltime="01:00:00", max_workers=2, nodes=8, qos="regular", drain=None,
             stage_on="gpu"):
    gpu = {"type": "MPIExecutor", "max_workers": max_workers,
           "provider": {"type": "SlurmProvider", "account": "a", "qos": qos, "constraint": "gpu",
                        "gpus_per_node": 4, "nodes_per_block": nodes, "walltime": walltime,
                        "launcher": {"type": "SimpleLauncher"}}}
    if drain:
        gpu["drain_period"] = drain
    cpu = {"type": "HighThroughputExecutor",
           "provider": {"type": "SlurmProvider", "account": "a", "qos": "regular",
                        "constraint": "cpu", "walltime": "01:00:00"}}
    return parse_execution({"executors": {"gpu": gpu, "cpu": cpu},
                            "apps": {"stage": stage_on, "partition": "cpu", "train": "gpu"}})


def test_drain_period_is_walltime_minus_the_longest_run():
    s = study(cluster={"run_timeout_s": 1200})
    ex = fit_study(slurm_ex(walltime="01:00:00", stage_on="cpu"), s)
    assert ex.executors["gpu"].drain_period == 3600 - (1200 + 300)
    assert ex.executors["cpu"].drain_period is None  # no runs there
    assert walltime_s("1-00:30:00") == 86400 + 1800


def test_walltime_too_short_names_the_numbers():
    s = study(cluster={"run_timeout_s": 7200})
    with pytest.raises(ConfigError) as err:
        fit_study(slurm_ex(walltime="02:00:00", stage_on="cpu"), s)
    msg = str(err.value)
    assert "walltime 02:00:00 (7200 s) is too short" in msg
    assert "cluster.run_timeout_s 7200" in msg and "run_timeout_margin_s 300" in msg
    assert "at least 02:06:00" in msg
    with pytest.raises(ConfigError, match="drain period \\(3600 s\\) needs up to 7500 s"):
        fit_study(slurm_ex(walltime="03:00:00", drain=3600, stage_on="cpu"), s)


def test_runs_at_once_times_the_largest_run_must_fit_a_block():
    with pytest.raises(ConfigError) as err:
        fit_study(slurm_ex(walltime="02:00:00", max_workers=4, stage_on="cpu"), study())
    assert ("the largest run takes 4 node(s) and max_workers 4 lets that many run at once: "
            "4 x 4 = 16 nodes > provider.nodes_per_block 8; set max_workers <= 2 or "
            "nodes_per_block >= 16") in str(err.value)
    with pytest.raises(ConfigError, match="takes 4 node\\(s\\) > provider.nodes_per_block 2"):
        fit_study(slurm_ex(walltime="02:00:00", max_workers=1, nodes=2, stage_on="cpu"),
                  study())
    fit_study(slurm_ex(walltime="02:00:00", max_workers=2, stage_on="cpu"), study())  # fits
    # where the study's NodeGate admits runs (no endpoint), only the largest run must fit a block
    fit_study(slurm_ex(walltime="02:00:00", max_workers=4, stage_on="cpu"), study(), gated=True)
    with pytest.raises(ConfigError, match="takes 4 node\\(s\\) > provider.nodes_per_block 2"):
        fit_study(slurm_ex(walltime="02:00:00", max_workers=1, nodes=2, stage_on="cpu"), study(),
                  gated=True)


def test_cpu_work_never_on_gpu_blocks_and_debug_qos_limit():
    with pytest.raises(ConfigError) as err:
        fit_study(slurm_ex(walltime="01:00:00", qos="debug", stage_on="gpu"), study())
    msg = str(err.value)
    assert "apps.stage -> gpu: GPU nodes would idle" in msg
    assert "qos debug allows at most 30 min, walltime is 01:00:00" in msg


def test_perlmutter_configs_load_with_site_variables_and_fit_their_studies():
    for kind in ("gpu", "cpu"):
        path = REPO / "configs" / "perlmutter" / f"{kind}.yaml"
        with pytest.raises(ConfigError) as err:
            split_execution_file(path, env={})
        assert "RUDDER_ACCOUNT" in str(err.value) and "RUDDER_MODEL" in str(err.value)
        assert "SCRATCH  (used by dataset.root, runs_dir)" in str(err.value)
        ex, base = split_execution_file(path, env=SITE)
        assert base["runs_dir"] == "/scratch/rudder/runs"
        assert base["dataset"]["root"] == "/scratch/rudder/data"
        assert base["agent"]["model"]["path"] == "/models/gemma.gguf"
        train = ex.executors[ex.route("train")]
        assert train.provider.account == "m1234" and train.provider.qos == "regular"
        assert sys.prefix in train.provider.worker_init and str(REPO) in train.provider.worker_init
        for app in ("stage", "partition"):
            assert ex.executors[ex.route(app)].provider.constraint == "cpu"
        runs = base.pop("runs_dir")
        st = expand(parse_study(yaml.safe_load(
            (REPO / "configs" / "studies" / f"perlmutter_{kind}.yaml").read_text())), base,
            runs_dir=runs)
        fitted = fit_study(ex, st)  # the shipped study fits the shipped execution
        assert fitted.executors[ex.route("train")].drain_period == 3 * 3600 - (7200 + 300)
    # a value given on the command line need not be in the environment
    ex, _ = split_execution_file(REPO / "configs" / "perlmutter" / "gpu.yaml",
                                 variables={"RUDDER_ACCOUNT": "m9", "RUDDER_MODEL": "/m"},
                                 provided={"runs_dir", "dataset.root"}, env={})
    assert ex.executors["gpu"].provider.account == "m9"


def test_cli_names_missing_variables_before_anything_starts(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "workflows/scaling_study.py", "--study",
           "configs/studies/perlmutter_gpu.yaml", "--execution", "configs/perlmutter/gpu.yaml"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "needs 3 variable(s) not set" in proc.stderr and "RUDDER_ACCOUNT" in proc.stderr
    proc = subprocess.run(cmd + ["--var", "RUDDER_ACCOUNT=m1234", "--var", "RUDDER_MODEL=/m",
                                 "--runs-dir", str(tmp_path / "runs"), "--set",
                                 f"dataset.root={tmp_path}/data", "--dry-run"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    # the DAG is printed; then the inputs a NERSC user stages first (the OGB dataset under the data
    # root, the model file) are named, and the dry run exits 2 (rudder.runner.preflight)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "scaling_study: error: " in ln]
    assert errors and all("dataset.name: unknown dataset 'ogbn-products'" in ln
                          or "agent.model: model file for 'gemma3-4b' not found: /m" in ln
                          for ln in errors), proc.stderr
    # each problem once, with the runs it stops (every run lacks the dataset)
    (data,) = [ln for ln in errors if "unknown dataset" in ln]
    assert re.search(r"error: \d+ runs \(ogbn-products-m\S+, ogbn-products-m\S+, \.\.\.\): ", data), data
    assert "stage_dataset ogbn-products" in proc.stdout and "[cpu]" in proc.stdout
    assert "drain 3300 s" in proc.stdout
    assert not (tmp_path / "runs").exists()
