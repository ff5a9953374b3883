"""Simulator throughput: remote accesses replayed per second, per policy.

Default trace: synthetic, at benchmark-graph scale (halo 200k nodes, ~40k remote ids per
minibatch, 80 minibatches in 2 epochs, 25% capacity, Zipf-skewed popularity); or a real one
(`--trace runs/<id>/trace-r0.npz`), or one generated from a synthetic graph (`--graph
synth-medium --parts 2`, slow: builds and partitions the graph first).

Reports wall-clock and process-CPU throughput (on a shared machine CPU time is the steadier
number; torch runs single-threaded here, as in the trainer's loader thread). The trace is
loaded and translated to halo positions before timing (once per trace, shared by every policy).

  python benchmarks/bench_sim.py [--policies static,fixed,lookahead,lru,belady] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from rudder.sim.simulate import simulate
from rudder.sim.trace import Trace
from rudder.sim.tracegen import TraceGenSpec, generate_trace, random_trace

DEFAULT = "none,static,fixed,lookahead,lru,lfu,s3fifo,sieve,belady"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default=DEFAULT)
    ap.add_argument("--trace", default=None, help="a trace-r<R>.npz to replay")
    ap.add_argument("--graph", default=None, help="generate from this synthetic preset instead")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--halo", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=40_000, help="remote ids per minibatch")
    ap.add_argument("--minibatches", type=int, default=80)
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--repeat", type=int, default=2, help="best of N replays")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    if args.trace:
        trace = Trace.load(args.trace)
        src = args.trace
    elif args.graph:
        trace, _ = generate_trace(TraceGenSpec(graph=args.graph, parts=args.parts, fraction=args.fraction))
        src = f"{args.graph} P={args.parts}"
    else:
        trace = random_trace(halo=args.halo, minibatches=args.minibatches, batch=args.batch,
                             nonhalo=0.15, capacity=args.fraction, skew=0.8, epochs=2, seed=0)
        src = f"random halo={args.halo} batch={args.batch}"
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    trace.halo_positions()  # one binary search over all accesses, shared by every policy
    t_translate = time.perf_counter() - t0
    N = trace.num_accesses
    print(f"trace: {src}: {trace.num_minibatches} minibatches, {N} remote accesses, halo "
          f"{trace.num_halo}, capacity {trace.capacity} (built {t_load:.1f} s, positions {t_translate:.2f} s)")
    print(f"{'policy':<12} {'hit%':>6} {'fetched%':>9} {'wall s':>8} {'cpu s':>8} {'M acc/s wall':>13} {'M acc/s cpu':>12}")
    rows = []
    for p in args.policies.split(","):
        best_w = best_c = float("inf")
        for _ in range(args.repeat):
            c0 = time.process_time()
            r = simulate(trace, p)
            best_c = min(best_c, time.process_time() - c0)
            best_w = min(best_w, r.seconds)
        s = r.summary()
        row = {"policy": p, "hit_rate": s["hit_rate"], "fetched_frac": s["fetched_frac"],
               "wall_s": best_w, "cpu_s": best_c, "maccesses_per_s_wall": N / best_w / 1e6,
               "maccesses_per_s_cpu": N / best_c / 1e6, "accesses": N}
        rows.append(row)
        print(f"{p:<12} {100 * row['hit_rate']:>6.1f} {100 * row['fetched_frac']:>9.1f} {best_w:>8.3f} "
              f"{best_c:>8.3f} {row['maccesses_per_s_wall']:>13.2f} {row['maccesses_per_s_cpu']:>12.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": src, "accesses": N, "translate_s": t_translate, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
