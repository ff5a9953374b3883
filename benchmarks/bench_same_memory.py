"""Issue 17's hit, row and byte targets at one buffer memory, by trace replay: what each lever
of the buffer buys when the bytes it may hold stay those of today's default (fraction 0.25 of
the halo in float32).

Levers (each alone and together):
  - depth: the lookahead round plans over 8 sampled-ahead minibatches or the rest of the epoch
    (`prefetch.schedule_ahead`);
  - universe: the buffer may keep 1-hop halo nodes only, or every remote node the trainer pulls
    (`prefetch.universe: remote`);
  - dtype: rows move and are held as float16 (`dataset.feature_dtype`), so the same bytes hold
    twice the rows, and every pulled row is half the bytes.

Per cell: rows fetched / `none`'s (none pulls every remote row every time), bytes fetched /
`none`'s float32 bytes, and hits / Belady over all remote nodes at the same rows (the
unrestricted optimum the buffer could reach at that memory and dtype), and the buffer's
bookkeeping beside its feature rows: the per-node state (slot, miss count, flags) over its universe
and, for the remote universe, the id index (a direct map over the graph's ids, as in a trainer;
`prefetch.universe_max_nodes` left at its default, 2 x the halo), at construction. Traces by `rudder
tracegen` (METIS, fanout 10,25, batch 1000, 3 epochs, partition 0's trainer, degree fill); no
training, no cluster. The dtype changes no access: float16 only doubles the rows that fit.

  python benchmarks/bench_same_memory.py --graphs synth-medium synth-bench --parts 2 4 \\
      --trace-dir data/traces/same-memory
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from rudder.config import PrefetchConfig, universe_max_nodes
from rudder.prefetch.buffer import HaloBuffer
from rudder.sim.oracle import belady
from rudder.sim.simulate import PolicySpec, parse_policy, simulate
from rudder.sim.tracegen import TraceGenSpec, cached_trace
from rudder.trace import Trace

DTYPE_BYTES = {"float32": 4, "float16": 2}


def at_capacity(full: Trace, capacity: int) -> Trace:
    """The trace with a buffer of `capacity` rows, filled with the first rows of the
    degree-ordered fill (highest degree first), as a run at that memory starts."""
    return Trace(halo=full.halo, offsets=full.offsets, ids=full.ids, epoch=full.epoch,
                 init=full.init[:capacity], capacity=capacity)


def state_mb(trace: Trace, universe: str) -> float:
    """MB of the buffer's per-node state and index (every tensor it and its index hold, feature
    rows excluded: store_features off), built as a trainer builds it for this universe."""
    halo = torch.from_numpy(trace.halo)
    max_nodes = universe_max_nodes(PrefetchConfig(universe=universe), halo.numel(), trace.capacity)
    buf = HaloBuffer(halo, trace.capacity, 0, store_features=False, universe=universe,
                     max_nodes=max_nodes if universe == "remote" else None,
                     id_bound=int(max(trace.ids.max(), trace.halo.max())) + 1)
    parts = [buf] + ([buf.index] if buf.index is not None else [])
    return sum(t.numel() * t.element_size() for o in parts for t in vars(o).values()
               if isinstance(t, torch.Tensor)) / 1e6


def lever_policy(depth: str, universe: str) -> PolicySpec:
    p = parse_policy(f"lookahead:{depth}")
    return PolicySpec(p.spec + (":remote" if universe == "remote" else ""), p.base,
                      p.prefetch.model_copy(update=dict(universe=universe)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="+", default=["synth-medium"])
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--fraction", type=float, default=0.25,
                    help="the memory: this fraction of the halo in float32 rows (default 0.25)")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPE_BYTES), choices=list(DTYPE_BYTES))
    ap.add_argument("--depths", nargs="+", default=["8", "epoch"])
    ap.add_argument("--universes", nargs="+", default=["halo", "remote"], choices=["halo", "remote"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--trace-dir", type=Path, default=None, help="keep/reuse the traces here")
    a = ap.parse_args()

    print("| graph | P | dtype | capacity rows | feature rows MB | depth | universe | state + index MB | "
          "rows / none | bytes / none's float32 | hits / Belady (all remote, same rows) | replay s |")
    print("|" + "---|" * 12, flush=True)
    for graph in a.graphs:
        for p in a.parts:
            spec = TraceGenSpec(graph=graph, parts=p, part=0, epochs=a.epochs, fraction=1.0,
                                init="degree", batch_size=a.batch_size)
            full = cached_trace(spec, a.trace_dir / f"{graph}-p{p}-b{a.batch_size}" if a.trace_dir else None)
            for dtype in a.dtypes:
                scale = DTYPE_BYTES["float32"] / DTYPE_BYTES[dtype]  # rows per float32 row's bytes
                t = at_capacity(full, int(a.fraction * scale * full.num_halo))
                opt = belady(t, universe="all")
                none = opt.total_remote
                bytes_share = DTYPE_BYTES[dtype] / DTYPE_BYTES["float32"]
                rows_mb = t.capacity * full.feat_bytes * bytes_share / 1e6  # trace: float32 row bytes
                print(f"| {graph} | {p} | {dtype} | {t.capacity:,} | {rows_mb:.1f} | Belady | all remote | – | "
                      f"{opt.misses / none:.3f} | {opt.misses / none * bytes_share:.3f} | 1 | – |", flush=True)
                for universe in a.universes:
                    mb = state_mb(t, universe)
                    for depth in a.depths:
                        t0 = time.perf_counter()
                        r = simulate(t, lever_policy(depth, universe))
                        rows = r.total("fetched_rows") / none
                        print(f"| {graph} | {p} | {dtype} | {t.capacity:,} | {rows_mb:.1f} | {depth} | {universe} | "
                              f"{mb:.1f} | {rows:.3f} | "
                              f"{rows * bytes_share:.3f} | {r.total('hits') / max(opt.total_hits, 1):.3f} | "
                              f"{time.perf_counter() - t0:.1f} |", flush=True)


if __name__ == "__main__":
    main()
