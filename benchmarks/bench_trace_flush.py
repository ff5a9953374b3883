"""What the live trace's periodic rewrites cost the loader thread (BENCHMARKS §15).

  python benchmarks/bench_trace_flush.py [--minibatches 2000] [--ids 69000] [--first 200]

A TraceWriter (rudder.trace) gets --minibatches minibatches of --ids remote ids each (synth-bench
at 2 machines: ~69k input rows a minibatch, most of them remote), as a training run's loader
thread adds them, two ways:
  fixed period   the whole trace rewritten every --first minibatches (before 2026-12-07)
  doubling       rewritten after --first minibatches and each time their number doubles (now)
Printed per way: seconds spent in add() and close() (the loader thread's time), rewrites, and
GB written. The trace's file is the same either way (checked).
"""
from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minibatches", type=int, default=2000)
    p.add_argument("--ids", type=int, default=69_000, help="remote ids per minibatch")
    p.add_argument("--first", type=int, default=200, help="minibatches before the first rewrite")
    a = p.parse_args()

    from rudder.trace import TraceWriter

    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 1_000_000, a.ids) for _ in range(min(a.minibatches, 50))]
    digests = set()
    with tempfile.TemporaryDirectory() as tmp:
        for way in ("fixed period", "doubling"):
            path = Path(tmp) / f"{way.replace(' ', '-')}.npz"
            w = TraceWriter(path, halo=np.arange(10), init=np.zeros(0), capacity=1,
                            flush_from=a.first if way == "doubling" else 0)
            flush, rewrites, written = w.flush, 0, 0

            def counted() -> Path:  # every rewrite, whoever asks for it
                nonlocal rewrites, written
                rewrites += 1
                written += sum(c.nbytes for c in w._chunks)
                return flush()

            w.flush = counted
            t0 = time.perf_counter()
            for g in range(a.minibatches):
                w.add(g // 100, batches[g % len(batches)])
                if way == "fixed period" and (g + 1) % a.first == 0:
                    w.flush()
            w.close()
            secs = time.perf_counter() - t0
            digests.add(hashlib.sha256(path.read_bytes()).hexdigest()[:12])
            print(f"{way:13s} {secs:7.2f} s in add/close, {rewrites:3d} rewrites, {written / 1e9:6.2f} GB written")
    print(f"{a.minibatches} minibatches x {a.ids:,} ids; the same file either way: {len(digests) == 1}")


if __name__ == "__main__":
    main()
