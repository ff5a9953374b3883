"""HaloBuffer micro-benchmark: lookup throughput (ids/s) and per-minibatch bookkeeping and
replacement cost, at benchmark-graph scale (halo and minibatch sizes of synth-bench on 2
machines). `python benchmarks/bench_buffer.py [--halo N] [--remote N]`"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from rudder.prefetch.buffer import HaloBuffer, choose_initial
from rudder.prefetch.policy import Replace
from rudder.prefetch.step import begin_step, finish_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--halo", type=int, default=300_000, help="halo nodes of the partition")
    ap.add_argument("--remote", type=int, default=60_000, help="remote input ids per minibatch")
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--ops", action="store_true", help="also count the torch ops of one step (each one "
                    "kernel launch or more if the index lived on a GPU)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    N = args.halo * 4
    halo = torch.randperm(N, generator=g)[: args.halo]
    cap = int(args.fraction * args.halo)
    buf = HaloBuffer(halo, cap, args.dim)
    init = choose_initial(halo, cap, "random")
    buf.fill(init, torch.randn(init.numel(), args.dim))
    # remote ids: 80% halo (skewed), 20% further away
    w = torch.distributions.Pareto(1.0, 1.2).sample((args.halo,))
    def minibatch():
        h = halo[torch.multinomial(w, int(args.remote * 0.8), replacement=True)]
        o = torch.randint(N, N * 2, (args.remote // 5,))
        return torch.unique(torch.cat([h, o]))
    mbs = [minibatch() for _ in range(args.steps + 8)]

    t = []
    for ids in mbs:
        t0 = time.perf_counter(); buf.lookup(ids); t.append(time.perf_counter() - t0)
    ids_per_s = sum(m.numel() for m in mbs) / sum(t)
    res = {}
    for name, plan in [("bookkeeping only", None), ("fixed round", Replace("massivegnn")),
                       ("lookahead round (k=8, 10%, admit misses)", Replace("lookahead", int(0.1 * cap))),
                       ("lookahead round (k=8, 10%, admit any)", Replace("lookahead", int(0.1 * cap), admit="any"))]:
        ts = []
        for i in range(args.steps):
            t0 = time.perf_counter()
            step = begin_step(buf, mbs[i], plan, mbs[i + 1 : i + 9])
            t = time.perf_counter() - t0
            n = mbs[i].numel()  # the pull, as BufferedFeatures.fetch makes it (not timed)
            out = torch.zeros(n + step.extra_ids.numel(), args.dim)
            t0 = time.perf_counter()
            buf.gather_into(out, torch.nonzero(step.hit_mask).flatten(), step.hit_slots)
            where = torch.cat([torch.nonzero(~step.hit_mask).flatten(), torch.arange(n, out.shape[0])])
            finish_step(buf, step, out, where)
            ts.append(t + time.perf_counter() - t0)
        res[name] = statistics.median(ts)
        if args.ops:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step = begin_step(buf, mbs[0], plan, mbs[1:9])
                buf.gather(step.hit_slots)
                finish_step(buf, step, torch.zeros(step.pull_ids.numel(), args.dim))
            top = [e for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::")]
            print(f"{name}: {len(top)} top-level torch ops per minibatch")
    print(f"halo {args.halo}, capacity {cap}, ~{mbs[0].numel()} remote ids/minibatch, dim {args.dim}, 1 thread")
    print(f"lookup: {ids_per_s / 1e6:.1f} M ids/s")
    for k, v in res.items():
        print(f"{k}: {v * 1e3:.2f} ms per minibatch (median; includes writing hit rows into the output)")


if __name__ == "__main__":
    main()
