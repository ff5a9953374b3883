"""Belady halo only vs Belady over all remote nodes, at the same buffer memory (capacity rows),
on traces of `rudder tracegen` (no training); the default lookahead policy's hits set beside
both (how much of the unrestricted optimum today's halo-only buffer reaches).

  python benchmarks/bench_oracle_universe.py --graphs synth-small synth-medium --parts 2 4 \\
      --fractions 0.25 0.5 --trace-dir data/traces/oracle-universe
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


from rudder.sim.oracle import belady
from rudder.sim.simulate import simulate
from rudder.sim.tracegen import TraceGenSpec, cached_trace
from rudder.trace import Trace


def trace_for(graph: str, parts: int, epochs: int, trace_dir: Path | None) -> Trace:
    spec = TraceGenSpec(graph=graph, parts=parts, part=0, epochs=epochs, fraction=1.0, init="degree")
    return cached_trace(spec, trace_dir / f"{graph}-p{parts}" if trace_dir else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="+", default=["synth-small", "synth-medium"])
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--policy", default="lookahead", help="replayed beside the two optima")
    ap.add_argument("--trace-dir", type=Path, default=None)
    a = ap.parse_args()
    print("| graph | P | fraction | halo nodes | remote nodes | accesses | capacity rows | "
          "Belady, halo only: hit % | Belady, all remote nodes: hit % | all / halo hits | "
          f"{a.policy} hit % | {a.policy} / halo-only Belady | {a.policy} / all-remote Belady | s |")
    print("|" + "---|" * 13)
    for g in a.graphs:
        for p in a.parts:
            full = trace_for(g, p, a.epochs, a.trace_dir)
            remote = full.remote_nodes().size
            for f in a.fractions:
                t0 = time.perf_counter()
                C = int(f * full.num_halo)
                # the fill at fraction f: the first C of the degree-ordered fill (highest first)
                t = Trace(halo=full.halo, offsets=full.offsets, ids=full.ids, epoch=full.epoch,
                          init=full.init[:C], capacity=C)
                h, al = belady(t), belady(t, universe="all")
                pol = simulate(t, a.policy)
                ph = pol.total("hits")
                print(f"| {g} | {p} | {f} | {t.num_halo:,} | {remote:,} | {t.num_accesses:,} | {C:,} | "
                      f"{100 * h.hit_rate:.1f} | {100 * al.hit_rate:.1f} | "
                      f"{al.total_hits / max(h.total_hits, 1):.3f} | {100 * ph / t.num_accesses:.1f} | "
                      f"{ph / max(h.total_hits, 1):.3f} | {ph / max(al.total_hits, 1):.3f} | "
                      f"{time.perf_counter() - t0:.1f} |", flush=True)


if __name__ == "__main__":
    main()
