"""Interleaved A/B of the buffer's hot path (issue 17), before and after in ONE process, so that
the host's load hits both alike.

before = rudder/prefetch/{buffer,step,features,metrics,nextuse}.py as of `--before` (default 41f550a, loaded by `git
  show`): the lookahead round recomputes next use over the whole halo (8 scatters + O(halo) masks
  per round), `apply` searches the newcomers' positions again, `finish_step` sorts the pull to
  find the newcomers' rows, hit rows are gathered into a fresh tensor, 1-D advanced indexing.
after  = this checkout: next use kept up to date as the window slides (rudder.prefetch.nextuse),
  positions and rows from the plan, hit rows through a reused scratch, index_select/masked_select/
  scatter_ in place of x[idx], x[mask], x[idx] = v.

Part 1, one step (what `t_buffer` counts: lookup, bookkeeping, round, hit rows into the output,
newcomers into the buffer) at synth-bench scale: 300k halo, capacity 75k, ~39k remote ids per
minibatch, 128-dim rows, 1 thread. Two buffers get the same minibatches, alternating A B B A; their
decisions and rows are asserted equal. Part 2, BufferedFeatures.fetch (the training path; its
features.py also as of `--before`) over a plain feature tensor: the `t_buffer` of each minibatch's
record, outputs asserted equal to the table's rows. Part 3, replay throughput over a trace (`--trace
trace-r0.npz`, else a random one at bench_sim.py's scale), whole replays alternating; hits, counts
per minibatch and windows asserted equal.

  python benchmarks/bench_buffer_ab.py [--part step|fetch|replay|all] [--steps 60] [--trace PATH]
      [--replays 3] [--before REV]
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from rudder.prefetch.buffer import HaloBuffer, choose_initial
from rudder.prefetch.policy import Replace
from rudder.prefetch.step import begin_step, finish_step


def module_at(rev: str, path: str, name: str, required: bool = True) -> types.ModuleType | None:
    """The module at `path` (in this repository) as of `rev`, loaded beside this code as `name`
    (git show); None where it did not exist then and `required` is False."""
    src = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True,
                         check=required, cwd=Path(__file__).resolve().parent)
    if src.returncode != 0:
        return None
    mod = types.ModuleType(name)
    sys.modules[name] = mod  # dataclasses look their module up
    exec(compile(src.stdout, f"{rev}:{path}", "exec"), mod.__dict__)
    return mod


def load_before(rev: str) -> tuple[types.ModuleType, ...]:
    """rudder/prefetch/buffer.py, step.py, features.py and metrics.py as of `rev`, loaded beside
    this code (git show); the old features module calls the old step functions."""
    mods = [module_at(rev, f"rudder/prefetch/{name}.py", f"before_{name}")
            for name in ("buffer", "step", "features", "metrics")]
    mods[2].begin_step, mods[2].finish_step = mods[1].begin_step, mods[1].finish_step
    # the old buffer's incremental next use as of `rev` too, where it had one
    nu = module_at(rev, "rudder/prefetch/nextuse.py", "before_nextuse", required=False)
    if nu is not None:
        for name in ("WindowNextUse", "next_use_scratch"):
            if name in mods[0].__dict__:
                setattr(mods[0], name, getattr(nu, name))
    return tuple(mods)


@contextlib.contextmanager
def before_in_replay(old_buffer, old_step, old_metrics):
    """The simulator's buffer and step functions as of `rev` (rudder.sim.replay looks them up
    at each call)."""
    from rudder.sim import replay

    class OldPositionBuffer(old_buffer.HaloBuffer):  # replay.PositionBuffer on the old base
        def __init__(self, num_halo, capacity, **kw):
            super().__init__(torch.arange(num_halo, dtype=torch.int64), capacity, 0, store_features=False, **kw)
            self._H = num_halo

        def halo_positions(self, ids):
            if self._H == 0:
                return super().halo_positions(ids)
            return ids >= 0, ids.clamp(min=0)

    old_state = old_metrics.buffer_state
    if "roll" not in inspect.signature(old_state).parameters:  # before the windows' missed sets
        def old_state(buf, future, roll=False, _f=old_metrics.buffer_state):
            return _f(buf, future)

    names = ("PositionBuffer", "begin_step", "finish_step", "buffer_state")
    saved = [getattr(replay, n) for n in names]
    for n, f in zip(names, (OldPositionBuffer, old_step.begin_step, old_step.finish_step, old_state)):
        setattr(replay, n, f)
    try:
        yield
    finally:
        for n, f in zip(names, saved):
            setattr(replay, n, f)


def step_once(buf, before, ids, plan, future, dim, begin_step, finish_step):
    """One step as BufferedFeatures.fetch assembles it on the CPU: the output is the pull in
    remote-id order (misses in place, hits overwritten from the buffer), newcomers pulled only
    for the buffer at its end."""
    t0, c0 = time.perf_counter(), time.process_time()
    step = begin_step(buf, ids, plan, future)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = ids.numel()
    out = torch.zeros(n + step.extra_ids.numel(), dim)  # the pull: allocated by DistDGL, not counted
    t0, c0 = time.perf_counter(), time.process_time()
    hit_rows = torch.nonzero(step.hit_mask).flatten()
    if before:
        out.index_copy_(0, hit_rows, buf.gather(step.hit_slots))
    else:
        buf.gather_into(out, hit_rows, step.hit_slots)
    where = torch.cat([torch.nonzero(~step.hit_mask).flatten(), torch.arange(n, n + step.extra_ids.numel())])
    finish_step(buf, step, out, where)
    wall += time.perf_counter() - t0
    cpu += time.process_time() - c0
    return wall, cpu, (step.victims.tolist(), step.newcomers.tolist())


def part_step(args, old_buffer, old_step, old_features, old_metrics) -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    H, dim = 300_000, 128
    N = H * 4
    halo = torch.randperm(N, generator=g)[:H]
    cap = H // 4
    init = choose_initial(halo, cap, "random")
    rows = torch.randn(init.numel(), dim, generator=g)
    w = torch.distributions.Pareto(1.0, 1.2).sample((H,))

    def minibatch():  # as bench_buffer.py: 80% halo (skewed), 20% further away
        h = halo[torch.multinomial(w, 48_000, replacement=True, generator=g)]
        return torch.unique(torch.cat([h, torch.randint(N, N * 2, (12_000,), generator=g)]))

    mbs = [minibatch() for _ in range(args.steps + 10)]
    print(f"halo {H}, capacity {cap}, ~{sum(m.numel() for m in mbs) // len(mbs)} remote ids/minibatch, "
          f"dim {dim}, 1 thread, {args.steps} steps each, A B B A")
    for admit in ("misses", "any"):
        plan = Replace("lookahead", int(0.1 * cap), admit=admit)
        bufs = {"before": old_buffer.HaloBuffer(halo, cap, dim), "after": HaloBuffer(halo, cap, dim)}
        steps = {"before": (old_step.begin_step, old_step.finish_step), "after": (begin_step, finish_step)}
        for b in bufs.values():
            b.fill(init, rows)
        t = {k: ([], []) for k in bufs}
        for i in range(args.steps):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            got = {}
            for mode in order:
                wall, cpu, got[mode] = step_once(bufs[mode], mode == "before", mbs[i], plan, mbs[i + 1:i + 9], dim,
                                                 *steps[mode])
                t[mode][0].append(wall)
                t[mode][1].append(cpu)
            assert got["before"] == got["after"], f"step {i}: the two buffers decided differently"
        assert torch.equal(bufs["before"].feats, bufs["after"].feats)
        mb, ma = (statistics.median(t[k][0]) for k in ("before", "after"))
        cb, ca = (statistics.median(t[k][1]) for k in ("before", "after"))
        print(f"lookahead step (k=8, 10%, admit {admit}): median ms wall before {1e3 * mb:.2f}, after "
              f"{1e3 * ma:.2f} ({ma / mb:.2f}x); cpu before {1e3 * cb:.2f}, after {1e3 * ca:.2f} ({ca / cb:.2f}x)")


def part_replay(args, old_buffer, old_step, old_features, old_metrics) -> None:
    from rudder.sim.simulate import simulate
    from rudder.sim.trace import Trace
    from rudder.sim.tracegen import random_trace

    torch.set_num_threads(1)
    if args.trace:
        trace, src = Trace.load(args.trace), args.trace
    else:
        trace = random_trace(halo=200_000, minibatches=80, batch=40_000, nonhalo=0.15, capacity=0.25,
                             skew=0.8, epochs=2, seed=0)
        src = "random halo=200000 batch=40000"
    trace.halo_positions()
    N = trace.num_accesses
    print(f"replay: {src}: {trace.num_minibatches} minibatches, {N} accesses, halo {trace.num_halo}, "
          f"capacity {trace.capacity}; {args.replays} replays each, alternating")
    for policy in args.policies.split(","):
        t = {"before": [], "after": []}
        hits, same = {}, {}
        for i in range(args.replays):
            for mode in (("before", "after") if i % 2 == 0 else ("after", "before")):
                with before_in_replay(old_buffer, old_step, old_metrics) if mode == "before" else contextlib.nullcontext():
                    c0 = time.process_time()
                    r = simulate(trace, policy)
                    t[mode].append((r.seconds, time.process_time() - c0))
                hits[mode] = r.summary()["hits"]
                same[mode] = ({k: v.tolist() for k, v in r.counts.items()}, r.windows)
        assert hits["before"] == hits["after"], f"{policy}: hits differ {hits}"
        # windows compared on the fields the old code records (newer code may record more)
        (cb, wb), (ca, wa) = same["before"], same["after"]
        wa = [{k: w[k] for k in old_w if k in w} for w, old_w in zip(wa, wb)]
        assert cb == ca and wb == wa, f"{policy}: counts per minibatch or windows differ"
        fmt = {k: (N / min(w for w, _ in v) / 1e6, N / min(c for _, c in v) / 1e6) for k, v in t.items()}
        print(f"{policy}: M accesses/s (best of {args.replays}) wall before {fmt['before'][0]:.2f}, after "
              f"{fmt['after'][0]:.2f} ({fmt['after'][0] / fmt['before'][0]:.2f}x); cpu before "
              f"{fmt['before'][1]:.2f}, after {fmt['after'][1]:.2f} ({fmt['after'][1] / fmt['before'][1]:.2f}x)")


def part_fetch(args, old_buffer, old_step, old_features, old_metrics) -> None:
    """BufferedFeatures.fetch, the training path, with a plain tensor as the feature store: the
    `t_buffer` each minibatch's record gets (the share BENCHMARKS section 2 reports)."""
    from rudder.prefetch.features import BufferedFeatures

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    # partition 0 owns ids < local; the rest is its halo. bench: synth-bench's scale (~39k remote,
    # ~60k local input ids); medium: synth-medium P=2's (~9k remote of ~45k input ids, dim 64)
    local, H, dim, draws, nlocal = ((100_000, 300_000, 128, 48_000, 60_000) if args.fetch_scale == "bench"
                                    else (100_000, 51_000, 64, 11_000, 36_000))
    table = torch.randn(local + H, dim, generator=g)
    owner_of = lambda ids: (ids >= local).long()  # noqa: E731
    halo = torch.arange(local, local + H)
    cap = H // 4
    init = choose_initial(halo, cap, "random")
    w = torch.distributions.Pareto(1.0, 1.2).sample((H,))

    def minibatch():  # ~39k remote (skewed) and ~60k local input ids, in sampler order
        r = torch.unique(halo[torch.multinomial(w, draws, replacement=True, generator=g)])
        ids = torch.cat([torch.randperm(local, generator=g)[:nlocal], r])
        return ids[torch.randperm(ids.numel(), generator=g)]

    mbs = [minibatch() for _ in range(args.steps + 10)]
    print(f"fetch: {local} local + {H} halo nodes, capacity {cap}, ~{mbs[0].numel()} input ids/minibatch, "
          f"dim {dim}; {args.steps} minibatches each, A B B A")
    for admit in ("misses", "any"):
        plan = Replace("lookahead", int(0.1 * cap), admit=admit)
        feats = {}
        for mode, mod_b, mod_f in (("before", old_buffer, old_features), ("after", None, None)):
            buf = (mod_b.HaloBuffer if mod_b else HaloBuffer)(halo, cap, dim)
            buf.fill(init, table[init])
            feats[mode] = (mod_f.BufferedFeatures if mod_f else BufferedFeatures)(table, owner_of, 0, buf, 0)
        remote = [feats["after"].remote_ids(m) for m in mbs]  # the pipeline's, sampled ahead
        t = {"before": [], "after": []}
        for i in range(args.steps):
            got = {}
            for mode in (("before", "after") if i % 2 == 0 else ("after", "before")):
                got[mode], st = feats[mode].fetch(mbs[i], plan, remote[i + 1:i + 9], remote=remote[i])
                t[mode].append(st.t_buffer)
            assert torch.equal(got["before"], got["after"]), f"minibatch {i}: outputs differ"
            assert torch.equal(got["after"], table[mbs[i]])
        j = args.steps  # the next minibatch: its window continues the last one
        ops = {mode: _torch_ops(lambda: feats[mode].fetch(mbs[j], plan, remote[j + 1:j + 9], remote=remote[j]))
               for mode in feats}
        mb, ma = statistics.median(t["before"]), statistics.median(t["after"])
        print(f"fetch torch ops (admit {admit}): before {ops['before']}, after {ops['after']}")
        print(f"fetch t_buffer (lookahead k=8, 10%, admit {admit}): median ms before {1e3 * mb:.2f}, after "
              f"{1e3 * ma:.2f} ({ma / mb:.2f}x)")


def _torch_ops(fn) -> int:
    """Top-level torch ops one call makes (each one dispatch; the loader thread releases and takes
    the GIL around each)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--trace", default=None, help="a trace-r<R>.npz to replay in part 2")
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--policies", default="lookahead,lookahead:8:0.1:any")
    ap.add_argument("--part", choices=("step", "fetch", "replay", "all"), default="all")
    ap.add_argument("--before", default="41f550a", help="the git revision to compare against")
    ap.add_argument("--fetch-scale", choices=("bench", "medium"), default="bench",
                    help="part fetch: synth-bench's minibatch and halo sizes, or synth-medium P=2's")
    args = ap.parse_args()
    old = load_before(args.before)
    print(f"before = rudder/prefetch/{{buffer,step,features,metrics}}.py at {args.before}; after = this checkout")
    for name, part in (("step", part_step), ("fetch", part_fetch), ("replay", part_replay)):
        if args.part in (name, "all"):
            part(args, *old)


if __name__ == "__main__":
    main()
