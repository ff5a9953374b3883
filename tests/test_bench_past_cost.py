"""benchmarks/bench_past_cost.py (issue 18): the past counterfactual's cost a window close by
replay, and a digest of its fields that two checkouts compare: the digest is the same on every
replay of the same trace and settings, moves when what is measured moves (the past windows, the
run's own rounds), and covers every branch's measured rows."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_past_cost as cost  # noqa: E402

from rudder.sim.tracegen import random_trace  # noqa: E402


@pytest.fixture(scope="module")
def trace():
    return random_trace(halo=500, minibatches=60, batch=90, capacity=0.25, skew=0.8, epochs=2, seed=7,
                        init="random")


def test_the_digest_is_deterministic_and_moves_with_what_is_measured(trace):
    t1, d1 = cost.measure(trace, 4, "none")
    t2, d2 = cost.measure(trace, 4, "none")
    assert d1 == d2 and len(t1) == len(t2) == 60 // 5 and all(x > 0 for x in t1)
    assert cost.measure(trace, 1, "none")[1] != d1  # another span: other fields
    assert cost.measure(trace, 4, "periodic")[1] != d1  # the run's own rounds change its buffer


def test_the_windows_carry_the_branches(trace):
    """Every window carries keep and each of the scenario's rounds; a run that never replaces is
    its own keep branch, and some round's branch differs from it (the digest covers measured
    numbers, not constants)."""
    wins = cost.replay_windows(trace, 1, "none")
    labels = [f"past_fetched_{b}_{e}" for e in ("stale", "half") for b in ("small", "medium", "large")]
    assert all(w["past_keep_fetched"] == w["fetched_rows"] and all(k in w for k in labels) for w in wins)
    assert any(w[k] != w["past_keep_fetched"] for w in wins for k in labels)


def test_the_command_line_prints_a_row_per_setting(tmp_path, trace):
    path = tmp_path / "t.npz"
    trace.save(path)
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_past_cost.py"), str(path),
                        "--past-windows", "2", "--rounds", "none", "periodic", "--repeats", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    import json

    rows = json.loads(out.read_text())
    assert [(r["past_windows"], r["rounds"]) for r in rows] == [(2, "none"), (2, "periodic")]
    assert all(r["windows"] == 12 and r["t_past_cf_ms_median"] > 0 for r in rows)
    assert rows[0]["fields_sha256"] != rows[1]["fields_sha256"]
