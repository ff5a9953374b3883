"""Where a run's epoch goes beyond its pipeline bound: the loader's stages per rank, read from
the run's own records (minibatches-r<R>.jsonl, epochs-r<R>.jsonl); nothing is re-run.

  python benchmarks/loader_breakdown.py runs/bench_sb/<run> [<run> ...] --bandwidth 100mbit

Per rank, ms per minibatch (mean over the run's minibatches): sampling (the work, and the
loader's wait for it), plan, the pull (t_fetch), the rest of assembling (buffer lookup and
bookkeeping, writing hit rows, labels: t_assemble, of which t_buffer and the labels' read,
t_labels, where the run recorded it), the loader's total
(t_load), compute, the training thread's wait for the loader (t_stall), and the wire time of
the rows the rank fetched at the link's rate (fetched_bytes * 8 / rate). Per run: the epoch
(slowest rank) against rudder.bounds' compute-only and pipeline bounds, and a third, looser
one that also charges the wire: per rank Σ per step of max(t_sample, compute, wire), the
slowest rank's. Each rank's `wire floor` is Σ wire alone: no schedule of this run's fetches
beats it on a link of that rate.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from rudder.bounds import run_bounds
from rudder.records import read_jsonl

STAGES = ("t_sample", "t_sample_wait", "t_plan", "t_fetch", "t_assemble", "t_buffer", "t_labels",
          "t_load", "t_compute", "t_stall")


def rate_bps(bandwidth: str) -> float:
    """tc's rate words: 100mbit -> 1e8 bits/s (tc's k/m/g are powers of 1000)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", bandwidth.strip().lower())
    if not m:
        raise ValueError(f"not a tc rate: {bandwidth!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def ranks_of(run_dir: Path) -> list[int]:
    return sorted(int(p.stem.split("-r")[1]) for p in run_dir.glob("minibatches-r*.jsonl"))


def breakdown(run_dir: Path, bps: float) -> dict:
    ranks = ranks_of(run_dir)
    mbs = {r: read_jsonl(run_dir / f"minibatches-r{r}.jsonl") for r in ranks}
    eps = {r: read_jsonl(run_dir / f"epochs-r{r}.jsonl") for r in ranks}
    b = run_bounds(mbs, eps)
    compute = {}  # (epoch, step) -> least t_compute over ranks (rudder.bounds' definition)
    for recs in mbs.values():
        for m in recs:
            k = (m["epoch"], m["step"])
            compute[k] = min(compute.get(k, m["t_compute"]), m["t_compute"])
    per_rank = {}
    wire_bound = 0.0
    n_epochs = max(1, b.epochs)
    for r, recs in mbs.items():
        row = {k: 1e3 * float(np.mean([m.get(k) or 0.0 for m in recs])) for k in STAGES}
        wire = [8.0 * m["fetched_bytes"] / bps for m in recs]
        row["labels_recorded"] = any(m.get("t_labels") is not None for m in recs)
        row["wire"] = 1e3 * float(np.mean(wire))
        row["MB"] = float(np.mean([m["fetched_bytes"] for m in recs])) / 1e6
        row["pull_MBps"] = (sum(m["fetched_bytes"] for m in recs) / 1e6
                            / max(1e-9, sum(m["t_fetch"] for m in recs)))
        row["t_epoch"] = float(np.mean([e["t_epoch"] for e in eps[r]]))
        row["wire_floor_s"] = sum(wire) / n_epochs
        row["pipe_wire_s"] = sum(max(m["t_sample"], compute[m["epoch"], m["step"]], w)
                                 for m, w in zip(recs, wire)) / n_epochs
        wire_bound = max(wire_bound, row["pipe_wire_s"])
        per_rank[r] = row
    return {"run": run_dir.name, "epoch_s": b.epoch_s, "pipeline_s": b.pipeline_s,
            "compute_s": b.compute_s, "pipe_wire_s": wire_bound, "ranks": per_rank}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--bandwidth", default="100mbit", help="the runs' link rate (tc words)")
    args = ap.parse_args()
    bps = rate_bps(args.bandwidth)
    print("| run | rank | epoch s (this rank) | sample | waited | plan | pull | wire at rate | MB/minibatch "
          "| pull MB/s | assemble (buffer, labels) | loader total | compute | stall | wire floor s "
          "| Σmax(sample, compute, wire) s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in args.runs:
        res = breakdown(d, bps)
        for r, x in res["ranks"].items():
            labels = f"{x['t_labels']:.1f}" if x["labels_recorded"] else "–"
            print(f"| {res['run']} | {r} | {x['t_epoch']:.2f} | {x['t_sample']:.0f} | {x['t_sample_wait']:.0f} "
                  f"| {x['t_plan']:.1f} | {x['t_fetch']:.0f} | {x['wire']:.0f} | {x['MB']:.2f} | {x['pull_MBps']:.1f} "
                  f"| {x['t_assemble']:.0f} ({x['t_buffer']:.0f}, {labels}) | {x['t_load']:.0f} | {x['t_compute']:.0f} "
                  f"| {x['t_stall']:.0f} | {x['wire_floor_s']:.2f} | {x['pipe_wire_s']:.2f} |")
        print(f"| {res['run']} | run | {res['epoch_s']:.2f} | bounds: pipeline {res['pipeline_s']:.2f} s, "
              f"compute-only {res['compute_s']:.2f} s, with the wire {res['pipe_wire_s']:.2f} s; "
              f"epoch / pipeline {res['epoch_s'] / res['pipeline_s']:.2f}, "
              f"epoch / (pipeline with the wire) {res['epoch_s'] / res['pipe_wire_s']:.2f} |" + " |" * 13)


if __name__ == "__main__":
    main()
