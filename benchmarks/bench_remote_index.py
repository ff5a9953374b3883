"""The remote universe's index (issue 17, BENCHMARKS.md §11): RemoteIndex before and after in ONE
process, alternating, so that the host's load hits both alike.

before = rudder/prefetch/remote_index.py as of `--before` (default 0638da8, loaded by `git show`):
  the held ids sorted, a lookup is a searchsorted over them, an insert merges the new ids in
  (O(ids held) per insert) and finds the free positions by a scan of all positions.
after  = this checkout: a bucketed hash table (one row gather and a compare per id), the free
  positions known without a scan, the new ids' positions from unique's inverse.

Part `ops`: the index calls of a remote-universe lookahead replay of each trace (insert with the
miss counts as priority and the buffer's pinned positions; lookups), recorded once with the
trace's global node ids, then replayed on a fresh index of each kind (each insert followed by a
lookup of the same ids, timed apart), `--repeats` times
alternating A B B A; every result asserted equal. Reported: ids per second through insert and
lookup (median over repeats of the summed call times).
Part `replay`: whole replays (`rudder sim`'s simulate, lookahead, universe remote), the buffer's
RemoteIndex swapped for the old one; best of `--repeats`, alternating; counts asserted equal.

  python benchmarks/bench_remote_index.py --traces T2/trace-r0.npz T4/trace-r0.npz \\
      [--max-nodes 0 51003] [--part ops|replay|all] [--repeats 5] [--before REV]
(traces by `rudder tracegen --graph synth-medium --parts 2 --fraction 0.25 --out T2`; max nodes 0:
the default, 2 x the halo)
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from rudder.prefetch import buffer
from rudder.prefetch.remote_index import RemoteIndex
from rudder.trace import Trace


def load_before(rev: str) -> type:
    from bench_buffer_ab import module_at  # benchmarks/ is on sys.path when run as a script

    return module_at(rev, "rudder/prefetch/remote_index.py", "before_remote_index").RemoteIndex


def policy_spec(max_nodes: int | None):
    from rudder.sim.simulate import PolicySpec, parse_policy

    p = parse_policy("lookahead")
    return PolicySpec(p.spec, p.base, p.prefetch.model_copy(update=dict(universe="remote", universe_max_nodes=max_nodes)))


def record_calls(trace: Trace, max_nodes: int | None) -> tuple[int, list, int]:
    """The index calls of one replay, ids mapped back to the trace's global node ids (a monotone
    map: the same positions as with the replay's dense ids), and the ids' bound (the largest + 1)."""
    from rudder.sim.oracle import all_remote
    from rudder.sim.simulate import simulate

    space = torch.from_numpy(all_remote(trace).halo)
    calls: list = []
    made: list = []

    class Recording(RemoteIndex):
        def __init__(self, n, initial=None, id_bound=None):
            self._inside = False
            super().__init__(n, initial)
            made.append(n)

        def lookup(self, ids):
            if not self._inside:  # insert's own lookup is not a call of its own
                calls.append(("lookup", space[ids], None, None))
            return super().lookup(ids)

        def insert(self, ids, priority=None, pinned=None):
            got: list = []

            def pin():
                got.append((pinned() if callable(pinned) else pinned).clone())
                return got[-1]

            calls.append(("insert", space[ids], None if priority is None else priority.clone(), got))
            self._inside = True
            try:
                return super().insert(ids, priority, pin if pinned is not None else None)
            finally:
                self._inside = False

    saved = buffer.RemoteIndex
    buffer.RemoteIndex = Recording
    try:
        simulate(trace, policy_spec(max_nodes))
    finally:
        buffer.RemoteIndex = saved
    return made[0], calls, int(space.max()) + 1


def run_calls(cls: type, n: int, calls: list) -> tuple[float, float, int, int, list]:
    """(insert s, lookup s, ids inserted, ids looked up, results) of the calls on a fresh index."""
    ix = cls(n)
    t_ins = t_look = 0.0
    n_ins = n_look = 0
    out = []
    for kind, ids, prio, pinned in calls:
        if kind == "lookup":
            t0 = time.perf_counter()
            r = ix.lookup(ids)
            t_look += time.perf_counter() - t0
            n_look += ids.numel()
        else:
            pin = (lambda: pinned[0]) if pinned else None
            t0 = time.perf_counter()
            r = ix.insert(ids, prio, pin)
            t_ins += time.perf_counter() - t0
            n_ins += ids.numel()
            out.append(r)
            t0 = time.perf_counter()  # and a lookup of the same ids (known now, or bypassed)
            r = ix.lookup(ids)
            t_look += time.perf_counter() - t0
            n_look += ids.numel()
        out.append(r)
    return t_ins, t_look, n_ins, n_look, out


def part_ops(args, Before) -> None:
    print("| trace | index max nodes | inserts (ids/call) | evicting inserts | lookups (ids/call) | "
          "insert M ids/s: before | table | direct map | lookup M ids/s: before | table | direct map |")
    print("|" + "---|" * 11)
    for path in args.traces:
        trace = Trace.load(path)
        for mn in args.max_nodes:
            n, calls, bound = record_calls(trace, mn or None)
            kinds = {"before": Before, "table": RemoteIndex,
                     "direct": lambda m: RemoteIndex(m, id_bound=bound)}
            res = {k: [] for k in kinds}
            ref = None
            for i in range(args.repeats):
                for mode in (list(kinds) if i % 2 == 0 else list(kinds)[::-1]):
                    t_ins, t_look, n_ins, n_look, out = run_calls(kinds[mode], n, calls)
                    res[mode].append((t_ins, t_look))
                    if ref is None:
                        ref = out
                    else:
                        for a, b in zip(ref, out):
                            assert all(torch.equal(x, y) for x, y in zip(a, b)), "results differ"
            ins = [c for c in calls if c[0] == "insert"]
            ev = sum(1 for c in ins if c[3])
            n_calls = len(calls)  # lookups: one after each insert, and the replay's own
            ri = [n_ins / statistics.median(t for t, _ in res[k]) / 1e6 for k in kinds]
            rl = [n_look / statistics.median(t for _, t in res[k]) / 1e6 for k in kinds]
            print(f"| {path} | {n:,} | {len(ins)} ({n_ins // max(len(ins), 1):,}) | {ev} | "
                  f"{n_calls} ({n_look // max(n_calls, 1):,}) | {ri[0]:.1f} | {ri[1]:.1f} ({ri[1] / ri[0]:.1f}x) | "
                  f"{ri[2]:.1f} ({ri[2] / ri[0]:.1f}x) | {rl[0]:.1f} | {rl[1]:.1f} ({rl[1] / rl[0]:.1f}x) | "
                  f"{rl[2]:.1f} ({rl[2] / rl[0]:.1f}x) |", flush=True)


def part_replay(args, Before) -> None:
    from rudder.sim.simulate import simulate

    print("| trace | index max nodes | accesses | hits | M accesses/s: before | table | direct map (the replay's) | "
          "halo universe |")
    print("|" + "---|" * 8)
    kinds = {"before": lambda m, id_bound=None: Before(m), "table": lambda m, id_bound=None: RemoteIndex(m),
             "direct": RemoteIndex}
    for path in args.traces:
        trace = Trace.load(path)
        trace.halo_positions()
        N = trace.num_accesses
        halo = max(N / simulate(trace, "lookahead").seconds for _ in range(args.repeats)) / 1e6
        for mn in args.max_nodes:
            spec = policy_spec(mn or None)
            t = {k: [] for k in kinds}
            counts = {}
            for i in range(args.repeats):
                for mode in (list(kinds) if i % 2 == 0 else list(kinds)[::-1]):
                    saved = buffer.RemoteIndex
                    buffer.RemoteIndex = kinds[mode]
                    try:
                        r = simulate(trace, spec)
                    finally:
                        buffer.RemoteIndex = saved
                    t[mode].append(r.seconds)
                    counts[mode] = {k: r.counts[k].copy() for k in ("hits", "fetched_rows", "replaced_rows")}
            for mode in kinds:
                assert all(np.array_equal(counts["before"][k], counts[mode][k]) for k in counts[mode]), mode
            m = {k: N / min(v) / 1e6 for k, v in t.items()}
            n = r.summary().get("universe_max_nodes")
            print(f"| {path} | {n:,} | {N:,} | {int(counts['direct']['hits'].sum()):,} | {m['before']:.2f} | "
                  f"{m['table']:.2f} ({m['table'] / m['before']:.2f}x) | {m['direct']:.2f} "
                  f"({m['direct'] / m['before']:.2f}x) | {halo:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--max-nodes", type=int, nargs="+", default=[0], help="0: the default (2 x halo)")
    ap.add_argument("--part", choices=["ops", "replay", "all"], default="all")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--before", default="0638da8")
    args = ap.parse_args()
    torch.set_num_threads(1)
    Before = load_before(args.before)
    print(f"before {args.before}, 1 thread, {args.repeats} repeats alternating")
    if args.part in ("ops", "all"):
        part_ops(args, Before)
    if args.part in ("replay", "all"):
        part_replay(args, Before)


if __name__ == "__main__":
    main()
