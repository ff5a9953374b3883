"""Policies against Belady's optimum from 2 to 64 partitions, by trace replay (no training):
%-hits and rows fetched per policy as fractions of the oracle's, at two buffer sizes.

  python benchmarks/bench_sim_scale.py --graph synth-medium --parts 2 4 8 16 32 64
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from rudder.sim.simulate import simulate
from rudder.sim.tracegen import TraceGenSpec, generate_trace

POLICIES = ["static", "fixed:25", "lookahead:3:0.05", "lookahead:8:0.05", "lru", "lfu", "s3fifo", "sieve"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default="synth-medium")
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--policies", nargs="+", default=POLICIES)
    ap.add_argument("--out", default="benchmarks/results/sim_scale.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = [
        f"graph {args.graph}, METIS, fanout 10,25, batch 1000, {args.epochs} epochs, partition 0's trainer; "
        "each cell: hits / Belady's hits, rows fetched / Belady's rows (Belady: demand-fetch optimum, "
        "same capacity and initial fill)",
        "",
        "| P | fraction | halo | accesses | Belady hit % | " + " | ".join(args.policies) + " |",
        "|---|---|---|---|---|" + "---|" * len(args.policies),
    ]
    speeds: dict[str, list[float]] = {}
    for P in args.parts:
        t0 = time.time()
        trace, facts = generate_trace(TraceGenSpec(graph=args.graph, parts=P, epochs=args.epochs, fraction=max(args.fractions)))
        print(f"P={P}: trace of {trace.num_minibatches} minibatches, {trace.num_accesses} accesses, "
              f"halo {trace.num_halo} ({time.time() - t0:.0f} s)", flush=True)
        for frac in args.fractions:
            C = int(frac * trace.num_halo)
            opt = simulate(trace, "belady", capacity=C).summary()
            cells = []
            for pol in args.policies:
                r = simulate(trace, pol, capacity=C)
                s = r.summary()
                speeds.setdefault(pol, []).append(r.accesses_per_s)
                cells.append(f"{s['hits'] / max(opt['hits'], 1):.2f} / {s['fetched_rows'] / max(opt['fetched_rows'], 1):.2f}")
            lines.append(f"| {P} | {frac} | {trace.num_halo} | {trace.num_accesses} | {100 * opt['hit_rate']:.1f} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    lines += ["", "Replay throughput (median over runs, M accesses/s, one thread): " +
              ", ".join(f"{p} {sorted(v)[len(v) // 2] / 1e6:.1f}" for p, v in speeds.items())]
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
