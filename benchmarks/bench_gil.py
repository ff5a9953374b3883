"""The model step beside another thread of the same process, as in a trainer (its loader thread
samples, plans and assembles while the main thread computes): how much a Python-busy or a
torch-busy neighbour slows the step, at two GIL switch intervals. 1 torch thread; the step is
rudder.model's GraphSAGE on synthetic blocks of synth-bench's minibatch size.

  python benchmarks/bench_gil.py [--steps 15]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.model import SAGE, Block  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)

    def block(ns: int, nd: int, deg: int) -> Block:
        dst = torch.arange(nd).repeat_interleave(deg)
        return Block.from_edges(torch.randint(ns, (nd * deg,), generator=g), dst, ns, nd)

    # synth-bench's median minibatch (BENCHMARKS §8): 68k -> 15k -> 1k nodes, fanout 10,15
    blocks, x, y = [block(68_000, 15_000, 10), block(15_000, 1_000, 15)], torch.randn(68_000, 128), torch.randint(47, (1000,))
    model = SAGE(128, 16, 47, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step() -> float:
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(blocks, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    stop = threading.Event()

    def python_work():  # interpreted work that holds the GIL (dicts, loops)
        while not stop.is_set():
            sum({i: i * i for i in range(2000)}.values())

    def torch_work():  # many small torch ops (each drops the GIL only briefly)
        t = torch.arange(1000)
        while not stop.is_set():
            for _ in range(100):
                t = (t + 1) % 997

    print("| neighbour thread | switch interval | step median (ms) |\n|---|---|---:|")
    for interval in (0.005, 0.0005):
        sys.setswitchinterval(interval)
        for name, work in (("none", None), ("busy Python", python_work), ("small torch ops", torch_work)):
            stop.clear()
            th = threading.Thread(target=work, daemon=True) if work else None
            if th:
                th.start()
            for _ in range(3):
                step()
            ts = [step() for _ in range(args.steps)]
            stop.set()
            if th:
                th.join()
            print(f"| {name} | {interval * 1e3:.1f} ms | {statistics.median(ts) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
