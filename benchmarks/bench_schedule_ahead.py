"""The whole epoch scheduled ahead (issue 17 must-have 7, RapidGNN's schedule), by trace replay:
rows fetched per buffer memory × planning depth, against `none` (every remote row pulled every
time) and Belady over all remote nodes, on traces of `rudder tracegen` (no training, no cluster).

Depth is how many sampled-ahead minibatches the lookahead round plans over: 0 (history only:
MassiveGNN's `fixed` rule; lookahead with depth 0 is `static`), 8 (today's default), 32, and
`epoch` (prefetch.schedule_ahead: every minibatch of the epoch known at its start, the round
plans over the rest of it). `admit=any` also pulls rows ahead of their use.

  python benchmarks/bench_schedule_ahead.py --graph synth-medium --parts 2 4 \\
      --fractions 0.05 0.1 0.25 0.5 1.0 --trace-dir data/traces/schedule-ahead
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench_same_memory import at_capacity  # benchmarks/ is on sys.path when run as a script

from rudder.sim.oracle import belady
from rudder.sim.simulate import simulate
from rudder.sim.tracegen import TraceGenSpec, cached_trace
from rudder.trace import Trace

POLICIES = ("fixed", "lookahead:8", "lookahead:32", "lookahead:epoch", "lookahead:epoch:0.1:any")


def trace_for(graph: str, parts: int, epochs: int, batch_size: int, trace_dir: Path | None) -> Trace:
    spec = TraceGenSpec(graph=graph, parts=parts, part=0, epochs=epochs, fraction=1.0, init="degree", batch_size=batch_size)
    return cached_trace(spec, trace_dir / f"{graph}-p{parts}-b{batch_size}" if trace_dir else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default="synth-medium")
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5, 1.0])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--trace-dir", type=Path, default=None)
    a = ap.parse_args()
    print("| P | minibatches / epoch | fraction of halo | capacity rows | policy | fetched rows / none's | "
          "× fewer fetches | hits / Belady (all remote) | replay s |")
    print("|" + "---|" * 9)
    for p in a.parts:
        full = trace_for(a.graph, p, a.epochs, a.batch_size, a.trace_dir)
        per_epoch = full.num_minibatches // max(1, len(set(full.epoch.tolist())))
        for f in a.fractions:
            C = int(f * full.num_halo)
            t = at_capacity(full, C)  # the fill at fraction f: the first C of the degree-ordered fill
            t0 = time.perf_counter()
            opt = belady(t, universe="all")
            none = opt.total_remote
            rows = [("Belady (all remote nodes)", opt.misses, opt.total_hits, time.perf_counter() - t0)]
            for pol in a.policies:
                r = simulate(t, pol)
                rows.append((pol, r.total("fetched_rows"), r.total("hits"), r.seconds))
            for name, fetched, hits, s in rows:
                print(f"| {p} | {per_epoch} | {f} | {C:,} | {name} | {fetched / none:.3f} | "
                      f"{none / max(fetched, 1):.2f} | {hits / max(opt.total_hits, 1):.3f} | {s:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
