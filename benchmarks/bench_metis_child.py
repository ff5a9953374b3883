"""What running the METIS cut in a child process costs, and what it buys (BENCHMARKS §14).

  python benchmarks/bench_metis_child.py [--graph synth-medium] [--parts 4] [--rounds 2]

`rudder.data.metis.assignment` on a synthetic preset (train balance and in-degrees, as `rudder
data partition` cuts), two ways, alternating, --rounds times:
  in process     the METIS call in this process (`_call`, as before 2026-12-07)
  child process  the same call in a fresh interpreter (`_in_child`: what assignment does now)
each once alone and once beside a thread drawing from libc's rand(), which METIS also draws from.
Printed: seconds per cut and whether each cut equals the first in-process one.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import threading
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", default="synth-medium", help="a rudder.data.synthetic preset")
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()

    from rudder.data import metis
    from rudder.sim.tracegen import load_graph

    g, _ = load_graph(a.graph)
    in_child = metis._in_child
    ways = {"in process": metis._call, "child process": in_child}
    libc, want = ctypes.CDLL(None), None

    def draw(stop: threading.Event) -> None:
        while not stop.is_set():
            libc.rand()

    print(f"{a.graph}: {g.num_nodes():,} nodes, {g.num_edges():,} edges, {a.parts} parts")
    for r in range(a.rounds):
        for way, fn in ways.items():
            for drawing in (False, True):
                stop = threading.Event()
                t = threading.Thread(target=draw, args=(stop,), daemon=True)
                if drawing:
                    t.start()
                metis._in_child = fn
                t0 = time.perf_counter()
                try:
                    cut = metis.assignment(g, a.parts, g.ndata["train_mask"], True, seed=0)
                finally:
                    metis._in_child = in_child
                    stop.set()
                    if drawing:
                        t.join()
                s = time.perf_counter() - t0
                digest = hashlib.sha256(cut.numpy().tobytes()).hexdigest()[:12]
                want = want or digest
                print(f"round {r}  {way:<13}  {'rand() thread' if drawing else 'alone':<13}  {s:6.2f} s  "
                      f"{digest}  {'the same cut' if digest == want else 'ANOTHER CUT'}", flush=True)


if __name__ == "__main__":
    main()
