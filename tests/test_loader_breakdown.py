"""benchmarks/loader_breakdown.py: the loader's stages per rank and the bounds, from records."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import loader_breakdown as lb  # noqa: E402


def test_rate_words():
    assert lb.rate_bps("100mbit") == 1e8
    assert lb.rate_bps("1gbit") == 1e9
    assert lb.rate_bps("25Mbit") == 25e6
    assert lb.rate_bps("800kbit") == 8e5
    with pytest.raises(ValueError):
        lb.rate_bps("100MB")


def _write(run: Path, rank: int, mbs: list[dict], t_epoch: float) -> None:
    (run / f"minibatches-r{rank}.jsonl").write_text("".join(json.dumps(m) + "\n" for m in mbs))
    (run / f"epochs-r{rank}.jsonl").write_text(json.dumps({"epoch": 0, "t_epoch": t_epoch}) + "\n")


def _mb(step, t_sample, t_compute, fetched_bytes, t_fetch=0.1):
    return {"epoch": 0, "step": step, "t_sample": t_sample, "t_sample_wait": t_sample, "t_plan": 0.0,
            "t_fetch": t_fetch, "t_assemble": 0.01, "t_buffer": 0.005, "t_load": 0.2,
            "t_compute": t_compute, "t_stall": 0.0, "fetched_bytes": fetched_bytes}


def test_breakdown_bounds_and_wire(tmp_path):
    # rank 0: 1.25 MB per step = 0.1 s at 100 Mbit/s; rank 1: 2.5 MB = 0.2 s
    _write(tmp_path, 0, [_mb(0, 0.05, 0.30, 1_250_000), _mb(1, 0.05, 0.30, 1_250_000)], 1.0)
    _write(tmp_path, 1, [_mb(0, 0.02, 0.10, 2_500_000), _mb(1, 0.15, 0.10, 2_500_000)], 1.2)
    res = lb.breakdown(tmp_path, lb.rate_bps("100mbit"))
    assert res["epoch_s"] == pytest.approx(1.2)  # the slowest rank's
    # compute per step = the least over ranks: 0.10; pipeline = max over ranks of Σ max(sample, 0.10)
    assert res["compute_s"] == pytest.approx(0.20)
    assert res["pipeline_s"] == pytest.approx(0.10 + 0.15)  # rank 1: max(.02,.1) + max(.15,.1)
    r0, r1 = res["ranks"][0], res["ranks"][1]
    assert r0["wire"] == pytest.approx(100.0) and r1["wire"] == pytest.approx(200.0)  # ms
    assert r1["wire_floor_s"] == pytest.approx(0.4)
    assert r0["pipe_wire_s"] == pytest.approx(0.2)  # max(.05, .10, .10) twice
    assert res["pipe_wire_s"] == pytest.approx(0.4)  # rank 1: the wire dominates both steps
    assert r1["pull_MBps"] == pytest.approx(25.0)  # 5 MB in 0.2 s of t_fetch
    assert r0["t_sample"] == pytest.approx(50.0)
