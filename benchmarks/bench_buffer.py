"""HaloBuffer micro-benchmark: lookup throughput (ids/s) and per-minibatch bookkeeping and
replacement cost, at benchmark-graph scale (halo and minibatch sizes of synth-bench on 2
machines). `python benchmarks/bench_buffer.py [--halo N] [--remote N] [--device cuda]`

--device cuda keeps the buffered rows on the GPU (as training does) and also times the index's
lookup written as torch ops on the GPU (ids copied in, searched there, the hit mask and the miss ids
copied back for the CPU-side pull) beside the CPU index's lookup: where the index should live."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from rudder.device import DeviceError, resolve, synchronize
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
    ap.add_argument("--device", default="cpu", help="where the buffered rows live: cpu | cuda | auto "
                    "(the index stays on the CPU; with cuda, a GPU lookup is timed beside it)")
    args = ap.parse_args()
    try:
        dev = resolve(args.device)
    except DeviceError as exc:
        sys.exit(f"bench_buffer: {exc}")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    N = args.halo * 4
    halo = torch.randperm(N, generator=g)[: args.halo]
    cap = int(args.fraction * args.halo)
    buf = HaloBuffer(halo, cap, args.dim, device=dev)
    init = choose_initial(halo, cap, "random")
    buf.fill(init, torch.randn(init.numel(), args.dim))
    synchronize(dev)
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
    t_lookup_cpu = statistics.median(t)
    t_lookup_dev = device_lookup(buf, mbs, dev) if dev.type == "cuda" else None
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
            out = torch.zeros(n + step.extra_ids.numel(), args.dim, device=dev)
            synchronize(dev)
            t0 = time.perf_counter()
            buf.gather_into(out, torch.nonzero(step.hit_mask).flatten().to(dev), step.hit_slots)
            where = torch.cat([torch.nonzero(~step.hit_mask).flatten(), torch.arange(n, out.shape[0])])
            finish_step(buf, step, out, where.to(dev))
            synchronize(dev)
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
    print(f"halo {args.halo}, capacity {cap}, ~{mbs[0].numel()} remote ids/minibatch, dim {args.dim}, 1 thread, "
          f"rows on {dev}")
    print(f"lookup: {ids_per_s / 1e6:.1f} M ids/s ({t_lookup_cpu * 1e3:.2f} ms per minibatch, median; index on the CPU)")
    if t_lookup_dev is not None:
        print(f"lookup with the index on {dev}: {t_lookup_dev * 1e3:.2f} ms per minibatch (median; ids in, "
              f"hit mask and miss ids out)")
    for k, v in res.items():
        print(f"{k}: {v * 1e3:.2f} ms per minibatch (median; includes writing hit rows into the output)")


def device_lookup(buf: HaloBuffer, mbs: list[torch.Tensor], dev: torch.device) -> float:
    """The lookup as the index would run on `dev`: sorted halo ids and the slot map there, each
    minibatch's ids copied in, searched, and the hit mask and miss ids copied back (the pull of the
    misses runs on the CPU). Checked against the CPU index; median seconds per minibatch."""
    sorted_ids, slot = buf.halo.to(dev), buf.slot_of.to(dev)  # halo ids sorted; slot by halo position
    ts = []
    for i, ids in enumerate(mbs):
        synchronize(dev)
        t0 = time.perf_counter()
        d = ids.to(dev)
        pos = torch.searchsorted(sorted_ids, d).clamp_(max=sorted_ids.numel() - 1)
        slots = torch.where(sorted_ids[pos] == d, slot[pos], -1)
        hit = slots >= 0
        hit_cpu, miss_cpu = hit.cpu(), d[~hit].cpu()
        ts.append(time.perf_counter() - t0)
        if i == 0:  # the same split as the CPU index
            want, _ = buf.lookup(ids)
            assert torch.equal(hit_cpu, want) and torch.equal(miss_cpu, ids[~want])
    return statistics.median(ts[3:])


if __name__ == "__main__":
    main()
