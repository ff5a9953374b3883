"""benchmarks/bench_pulls_in_flight.py on a real 2-machine DistDGL cluster: both ways of pulling
return the same rows, and the table names every size with a positive rate for each way."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(300)
def test_two_in_flight_pulls_the_same_rows(tmp_path):
    import dgl
    import torch

    torch.manual_seed(0)
    g = dgl.rand_graph(4000, 30000)
    g.ndata["feat"] = torch.randn(4000, 16)
    dgl.distributed.partition_graph(g, "pif", 2, str(tmp_path / "parts"), part_method="random")
    out = tmp_path / "table.md"
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_pulls_in_flight.py"), "--part-config",
         str(tmp_path / "parts" / "pif.json"), "--bandwidth", "none", "--rows", "50", "300",
         "--pulls", "4", "--rounds", "1", "--runs-dir", str(tmp_path / "runs"), "--out", str(out)],
        capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| none")]
    assert [int(r[1]) for r in rows] == [50, 300]
    for r in rows:
        one, two = (float(x.replace(",", "")) for x in (r[2], r[3]))
        assert one > 0 and two > 0
        assert r[5].strip() == "True"  # two in flight gave exactly the rows one at a time gave
