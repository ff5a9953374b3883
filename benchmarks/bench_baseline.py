"""The DistDGL baseline (policy none) on the benchmark graph: epoch time split into sample /
pull / compute, remote share of input rows, bytes pulled per epoch; shaped and unshaped links.

  python benchmarks/bench_baseline.py --dataset synth-bench --machines 2 4 --bandwidth none 1gbit
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from rudder.records import read_jsonl
from bench_policies import bench_config  # benchmarks/ is on sys.path when run as a script
from rudder.runner import execute_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synth-bench")
    ap.add_argument("--machines", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--bandwidth", nargs="+", default=["none", "1gbit"])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--runs-dir", default="runs/bench")
    ap.add_argument("--out", default="benchmarks/results/baseline.md")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    lines = [
        f"dataset {args.dataset}, policy none, batch {args.batch_size}, {args.max_steps} minibatches "
        "per trainer, 1 trainer/machine; times are per minibatch, means over trainers",
        "",
        "| machines | link | minibatch s | sample s | pull s | compute s | remote share of inputs | MB pulled / minibatch | epoch s (extrapolated) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for machines in args.machines:
        for bw in args.bandwidth:
            cfg = bench_config(args, machines, bw, policy="none")
            res = execute_run(cfg)
            if not res.ok:
                lines.append(f"| {machines} | {bw} | FAILED: {res.reason} |||||||")
                continue
            mbs = [m for r in range(machines) for m in read_jsonl(res.run_dir / f"minibatches-r{r}.jsonl")]
            mean = lambda k: float(np.mean([m[k] for m in mbs]))  # noqa: E731
            t_mb = mean("t_sample") + mean("t_fetch") + mean("t_compute")
            share = sum(m["remote_rows"] for m in mbs) / sum(m["input_rows"] for m in mbs)
            ctx = json.loads((res.run_dir / "context-r0.json").read_text())
            full = int(ctx["extra"]["full_steps_per_epoch"])
            lines.append(f"| {machines} | {bw} | {t_mb:.3f} | {mean('t_sample'):.3f} | {mean('t_fetch'):.3f} | "
                         f"{mean('t_compute'):.3f} | {100 * share:.1f}% | {mean('fetched_bytes') / 1e6:.1f} | "
                         f"{t_mb * full:.0f} ({full} minibatches) |")
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
