"""Configs fail before anything starts, naming the key; the CLI turns bad input into one line."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rudder.config import ConfigError, RunConfig, load_run_config
from rudder.run_cli import parse_overrides


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_and_overrides(tmp_path):
    cfg = load_run_config(write(tmp_path, "train: {epochs: 5}\n"), {"prefetch.policy": "fixed"})
    assert cfg.train.epochs == 5 and cfg.prefetch.policy == "fixed"
    assert cfg.train.fanouts == [10, 25] and cfg.prefetch.alpha == 0.05


@pytest.mark.parametrize("text,needle", [
    ("train: {epoch: 5}\n", "train.epoch"),  # typo: unknown key named
    ("prefetch: {policy: bogus}\n", "unknown policy 'bogus'"),
    ("prefetch: {prefetch_fraction: 2}\n", "prefetch.prefetch_fraction"),
    ("cluster: {machines: 0}\n", "cluster.machines"),
    ("prefetch: {policy: classifier}\n", "classifier:<name>"),
    ("train: [1, 2\n", "malformed YAML"),
    ("train: {features_free: true, check_features: true}\n", "check_features (--check)"),
    ("- a\n- b\n", "top level must be a mapping"),
])
def test_bad_config_names_the_problem(tmp_path, text, needle):
    with pytest.raises((ConfigError, ValueError)) as err:
        load_run_config(write(tmp_path, text))
    assert needle in str(err.value)


@pytest.mark.parametrize("content,needle", [
    (b"train: [1, 2\n", "malformed YAML in {path}, line 2, column 1: expected ',' or ']'"),
    (b"a:\n\tb: 1\n", "malformed YAML in {path}, line 2, column 1: found character '\\t'"),
    (b"\xe6\x00\xff", "{path} is not a text file (not UTF-8 at byte 0)"),
    (None, "{path} is not a file"),
])
def test_an_unreadable_config_is_one_line_naming_the_file(tmp_path, content, needle):
    path = tmp_path / "c.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_run_config(path)
    assert needle.format(path=path) in str(err.value) and "\n" not in str(err.value)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_run_config("nope.yaml")


def test_overrides_parse():
    assert parse_overrides(["a.b=3", "c=[1, 2]", "d=none"]) == {"a.b": 3, "c": [1, 2], "d": "none"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(["oops"])


def test_cli_bad_config_is_one_clear_line(tmp_path):
    p = write(tmp_path, "prefetch: {policy: lru}\n")
    r = subprocess.run([sys.executable, "-m", "rudder.cli", "run", "--config", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "unknown policy 'lru'" in r.stderr and "Traceback" not in r.stderr


def test_check_with_features_free_is_one_clear_line_and_starts_nothing(tmp_path):
    runs = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "rudder.cli", "run", "--set", "train.features_free=true",
                        "--set", f"runs_dir={runs}", "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--check" in r.stderr and "train.features_free" in r.stderr
    assert not runs.exists()


def test_doctor_reports_each_capability():
    """Each line's state is the one this machine must have: the pinned packages and the shipped
    model always work; root, namespaces and Slurm as the machine says; the study model once
    `make models` has assembled it. No stray output (e.g. Slurm's own complaints)."""
    import shutil

    from rudder.agent.models import MODELS, models_dir

    r = subprocess.run([sys.executable, "-m", "rudder.cli", "doctor"], capture_output=True, text=True, timeout=300)
    state = {}
    for line in r.stdout.splitlines():
        assert line.startswith(("ok   ", "FAIL ")), f"stray doctor line: {line!r}"
        state[line[5:].split("  ")[0].strip()] = line.startswith("ok")
    root = os.geteuid() == 0
    expect = {
        "torch": True, "dgl": True, "dgl.distributed": True, "llama_cpp + shipped model": True,
        "parsl": True, "duckdb": True, "globus_compute_sdk": True, "root": root,
        "study model qwen2.5-coder-0.5b": (models_dir() / MODELS["qwen2.5-coder-0.5b"].file).is_file(),
        "network namespaces": root and bool(shutil.which("ip")) and bool(shutil.which("unshare")),
        "slurm binaries": all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "srun", "squeue")),
    }
    assert {k: v for k, v in state.items() if k in expect} == expect, r.stdout
    assert "fatal" not in r.stdout + r.stderr
    assert r.returncode == 0, r.stdout


def test_resolved_config_round_trips():
    cfg = RunConfig()
    assert RunConfig.model_validate(cfg.model_dump(mode="json")) == cfg
