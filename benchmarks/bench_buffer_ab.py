"""Interleaved A/B of one lookahead step (issue 17): `locate` searching the current minibatch
again (before) vs reusing the positions the previous round memoised for it (after), alternating
step by step in one process so that the host's load hits both alike.

  python benchmarks/bench_buffer_ab.py   (300k halo, capacity 75k, 128-dim rows, 1 thread)
"""
from __future__ import annotations

import statistics
import time
import types

import torch

from rudder.prefetch.buffer import HaloBuffer, choose_initial
from rudder.prefetch.policy import Replace
from rudder.prefetch.step import begin_step, finish_step


def search_again(self, ids):  # `locate` as it was: a fresh search every minibatch
    is_halo, pos = self.halo_positions(ids)
    return is_halo, pos, torch.where(is_halo, self.slot_of[pos], torch.full_like(pos, -1))


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    H, dim = 300_000, 128
    N = H * 4
    halo = torch.randperm(N, generator=g)[:H]
    cap = H // 4
    buf = HaloBuffer(halo, cap, dim)
    init = choose_initial(halo, cap, "random")
    buf.fill(init, torch.randn(init.numel(), dim))
    w = torch.distributions.Pareto(1.0, 1.2).sample((H,))

    def minibatch():  # as bench_buffer.py: 80% halo (skewed), 20% further away
        h = halo[torch.multinomial(w, 48_000, replacement=True)]
        return torch.unique(torch.cat([h, torch.randint(N, N * 2, (12_000,))]))

    mbs = [minibatch() for _ in range(130)]
    memo_locate = buf.locate
    for admit in ("misses", "any"):
        plan = Replace("lookahead", int(0.1 * cap), admit=admit)
        t: dict[str, list[float]] = {"before": [], "after": []}
        for i in range(120):
            mode = "before" if i % 2 == 0 else "after"
            buf.locate = types.MethodType(search_again, buf) if mode == "before" else memo_locate
            t0 = time.perf_counter()
            step = begin_step(buf, mbs[i], plan, mbs[i + 1 : i + 9])
            buf.gather(step.hit_slots)
            finish_step(buf, step, torch.zeros(step.pull_ids.numel(), dim))
            t[mode].append(time.perf_counter() - t0)
        print(f"lookahead round (k=8, 10%, admit {admit}): median ms per minibatch before "
              f"{1e3 * statistics.median(t['before']):.2f}, after {1e3 * statistics.median(t['after']):.2f} "
              "(60 steps each, interleaved)")


if __name__ == "__main__":
    main()
