"""train.device: resolved, described for run.json, and a run that asks for cuda on a host
without a CUDA device fails fast with the reason: before the cluster starts and in the trainer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rudder.config import ConfigError, RunConfig, TrainConfig, parse_config
from rudder.device import DeviceError, describe, preflight, resolve, summary

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device")
ROOT = Path(__file__).resolve().parents[1]


def test_cpu_and_auto():
    assert resolve("cpu") == torch.device("cpu")
    assert resolve("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    with pytest.raises(DeviceError, match="'gpu'"):
        resolve("gpu")


def test_config_key_is_checked():
    assert TrainConfig().device == "auto"
    with pytest.raises(ConfigError, match="train.device"):
        parse_config(RunConfig, {"train": {"device": "gpu"}})


@NO_CUDA
def test_cuda_without_a_device_names_the_reason():
    with pytest.raises(DeviceError, match="train.device=cuda, but") as exc:
        resolve("cuda")
    if torch.version.cuda is None:  # this CPU wheel: the reason names the fix
        assert "CPU-only build" in str(exc.value) and "make setup CUDA=1" in str(exc.value)
    assert preflight("cuda", launcher="local") == str(exc.value)
    assert preflight("cuda", launcher="slurm") is None  # the trainers check on their own node
    assert preflight("cpu", launcher="local") is None
    assert summary().startswith("cpu only")


def test_describe_records_what_run_json_needs():
    torch_threads = torch.get_num_threads()
    d = describe(resolve("auto"))
    assert {"device", "type", "name", "memory_bytes", "torch", "cuda", "threads"} <= d.keys()
    assert d["torch"] == torch.__version__ and d["threads"] == torch_threads
    assert d["name"] and d["memory_bytes"] > 0
    json.dumps(d)  # JSON-ready


def test_doctor_reports_the_device():
    from rudder.doctor import CHECKS, _check

    _, ok, detail = _check("device", dict(CHECKS)["device"])  # the one line, not every check
    assert ok and (detail.startswith("cpu only") if not torch.cuda.is_available() else "CUDA" in detail)


@NO_CUDA
def test_run_asking_for_cuda_fails_before_the_cluster_starts(tmp_path):
    from rudder.runner import execute_run

    cfg = RunConfig.model_validate({"dataset": {"name": "synth-tiny", "root": str(tmp_path / "data")},
                                    "train": {"device": "cuda"}, "cluster": {"machines": 2},
                                    "runs_dir": str(tmp_path / "runs")})
    res = execute_run(cfg)
    assert not res.ok and res.reason.startswith("device: train.device=cuda, but")
    run = json.loads((res.run_dir / "run.json").read_text())
    assert run["status"] == "failed" and run["reason"] == res.reason
    assert not (tmp_path / "data").exists()  # nothing staged, partitioned or started
    assert sorted(p.name for p in res.run_dir.iterdir()) == ["run.json"]


@NO_CUDA
def test_trainer_asking_for_cuda_exits_before_joining(tmp_path):
    """The trainer's own check (a Slurm node, or a run.json edited by hand): it exits with code 4
    and the reason before dgl.distributed.initialize (no DGL environment is set here)."""
    (tmp_path / "part.json").write_text(json.dumps({"graph_name": "g"}))
    cfg = RunConfig.model_validate({"train": {"device": "cuda"}}).model_dump(mode="json")
    (tmp_path / "run.json").write_text(json.dumps({"config": cfg, "part_config": str(tmp_path / "part.json")}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DGL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-m", "rudder.train", "--run-dir", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 4, p.stderr[-2000:]
    assert "train.device=cuda, but" in p.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_emulated_machines_spread_over_the_gpus_by_rank(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert resolve("cuda") == torch.device("cuda", 3 % torch.cuda.device_count())
    assert resolve("auto") == resolve("cuda")


def test_perlmutter_gpu_config_asks_for_cuda():
    from rudder.config import load_yaml

    assert load_yaml(ROOT / "configs" / "perlmutter" / "gpu.yaml")["train"]["device"] == "cuda"
