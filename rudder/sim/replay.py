"""The one replay loop: a trace, minibatch by minibatch, through a `Replayer`.

A replayer is what holds the rows: it is filled once, then asked, for each minibatch, to serve
its remote ids knowing the ids sampled ahead of it; it answers with the counts.

    replayer.fill(initial positions)
    for each minibatch g:  counts[g] = replayer.step(remote ids, sampled-ahead ids)

Adapters:
  BufferReplayer   HaloBuffer's own mechanism (begin_step/finish_step), planned by a Policy
                   exactly as training plans it (StepInfo, start, plan, observe, windows)
  CacheReplayer    a classic cache (rudder.sim.caches: lru, lfu, s3fifo, sieve)
  BeladyReplayer   the hindsight optimum (rudder.sim.oracle): computed over the whole future at
                   construction, then handed out minibatch by minibatch
Ids are halo positions (0..H-1, -1 = not a halo node: a remote row no buffer can hold), so a
lookup is a sign test, not a search (`PositionTrace`). `fork()` copies a replayer with its state:
rudder.agent.hindsight plays both branches of a decision from the same buffer that way.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from rudder.config import WHOLE_EPOCH
from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.metrics import MetricsCollector, buffer_state
from rudder.prefetch.past import PastCounterfactual
from rudder.prefetch.policy import Policy, StepInfo
from rudder.prefetch.step import begin_step, finish_step
from rudder.records import MinibatchRecord, StepStats
from rudder.trace import Trace

COUNT_FIELDS = ("hits", "remote_rows", "misses", "replaced_rows", "admitted_rows", "fetched_rows")


@dataclass
class StepCounts:
    """What one minibatch cost: remote rows = hits + misses; rows over the network = misses +
    replaced_rows (pulled only for the buffer); admitted_rows = slots changed."""

    hits: int
    misses: int
    replaced_rows: int = 0
    admitted_rows: int = 0


class PositionTrace:
    """A trace in halo-position space, translated once (one binary search over all accesses).
    universe="remote": positions over every remote id of the trace (halo ∪ accessed, dense
    0..U-1); a remote-universe buffer then indexes them through its own bounded RemoteIndex."""

    def __init__(self, trace: Trace, universe: str = "halo", start_depth: int | None = None):
        """start_depth: prefetch.lookahead, the first epoch's view at its start under
        schedule_ahead (None: the default's)."""
        from rudder.config import PrefetchConfig
        from rudder.sim.oracle import all_remote

        self.trace, self.universe = trace, universe
        self.start_depth = PrefetchConfig().lookahead if start_depth is None else start_depth
        self._known: list[int] | None = None
        self.space = all_remote(trace) if universe == "remote" else trace  # whose halo numbers ids
        self.ids = torch.from_numpy(position_ids(self.space))
        self.off = trace.offsets.tolist()
        self.ends = epoch_ends(trace.epoch)
        self.epochs, self.steps = trace.epoch.tolist(), trace.steps().tolist()
        self.input_rows = trace.input_rows.tolist()
        # every minibatch's view, made once: the same tensors each step (a whole epoch ahead is
        # a list slice, and the next-use window recognises its minibatches by their views)
        self.views = [self.ids[a:b] for a, b in zip(self.off[:-1], self.off[1:])]

    def __len__(self) -> int:
        return self.trace.num_minibatches

    def remote(self, g: int) -> torch.Tensor:
        return self.views[g]

    def ahead(self, g: int, depth: int) -> list[torch.Tensor]:
        """The minibatches sampled ahead of g, as training samples them: the next `depth`, on
        into the next epoch at an epoch's end (rudder.pipeline); depth = config.WHOLE_EPOCH
        (prefetch.schedule_ahead): what the loader has sampled when it plans g, the rest of g's
        epoch and the next epoch's so far (rudder.pipeline.known_ahead)."""
        if depth >= WHOLE_EPOCH:
            if self._known is None:
                from rudder.pipeline import known_ahead

                lengths = np.diff(np.unique([0, *self.ends])).tolist()
                self._known = known_ahead(lengths, self.start_depth)
            return self.views[g + 1:self._known[g]]
        return self.views[g + 1:g + 1 + depth]


class Replayer:
    """fill once, then step per minibatch; `depth`: how many minibatches it wants sampled ahead.
    `g` is the index of the next minibatch (the loop's cursor, kept by the replayer)."""

    depth = 0

    def __init__(self) -> None:
        self.g = 0
        self.initial_fill = 0

    def fill(self, init: np.ndarray) -> None:
        raise NotImplementedError

    def step(self, remote: torch.Tensor, ahead: list[torch.Tensor]) -> StepCounts:
        raise NotImplementedError

    def fork(self) -> "Replayer":
        return copy.deepcopy(self)


def replay(pt: PositionTrace, replayer: Replayer, counts: dict[str, np.ndarray] | None = None,
           stop: int | None = None, after_step: Callable[[int, StepCounts], Any] | None = None
           ) -> dict[str, np.ndarray]:
    """Steps `replayer` from its cursor to `stop` (default: the end); counts[k][g] per minibatch
    (COUNT_FIELDS; allocated when None). after_step(g, counts), if given, runs after each."""
    if counts is None:
        counts = {k: np.zeros(len(pt), dtype=np.int64) for k in COUNT_FIELDS}
    for g in range(replayer.g, len(pt) if stop is None else stop):
        c = replayer.step(pt.remote(g), pt.ahead(g, replayer.depth))
        counts["hits"][g], counts["misses"][g] = c.hits, c.misses
        counts["replaced_rows"][g], counts["admitted_rows"][g] = c.replaced_rows, c.admitted_rows
        counts["remote_rows"][g] = c.hits + c.misses
        counts["fetched_rows"][g] = c.misses + c.replaced_rows
        if after_step is not None:
            after_step(g, c)
    return counts


# ---- buffer policies ----------------------------------------------------------------------
class PositionBuffer(HaloBuffer):
    """A HaloBuffer whose node ids are halo positions 0..H-1 (non-halo ids: -1): the id ->
    position lookup is a sign test instead of a binary search per minibatch (twice per step in
    `begin_step`). Nothing else differs: lookup, scoring, planning and replacement are
    HaloBuffer's, called by the shared `begin_step`/`finish_step`."""

    def __init__(self, num_halo: int, capacity: int, **kw):
        super().__init__(torch.arange(num_halo, dtype=torch.int64), capacity, 0,
                         store_features=False, **kw)
        self._H = num_halo

    def halo_positions(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._H == 0:
            return super().halo_positions(ids)
        return ids >= 0, ids.clamp(min=0)  # ids are positions in [0, H) or -1


class BufferReplayer(Replayer):
    """The buffer mechanism, planned by `policy` as the training pipeline plans it
    (rudder.pipeline): StepInfo, start() before the first minibatch, plan(), the shared step,
    then the minibatch record and (every window) the window record to observe(). Windows and
    decision records are kept; `wait_for_answer`, when given, is called after each window
    closes (a replay waits for an asynchronous agent) and returns the seconds it waited.
    records=False: plan and step only (no records, windows or observe: a policy that does not
    learn from them, as hindsight's)."""

    def __init__(self, pt: PositionTrace, policy: Policy, capacity: int, *, alpha: float, period: int,
                 depth: int, window: int, verify: bool = False, records: bool = True,
                 wait_for_answer: Callable[[Policy], float] | None = None, max_nodes: int | None = None):
        super().__init__()
        self.pt, self.policy, self.depth, self.verify = pt, policy, depth, verify
        self.records = records
        if pt.universe == "remote":  # ids are positions in pt.space; the index is the buffer's
            halo = np.searchsorted(pt.space.halo, pt.trace.halo)
            self.buf = HaloBuffer(torch.from_numpy(halo), capacity, 0, store_features=False, alpha=alpha,
                                  period=period, universe="remote", max_nodes=max_nodes,
                                  id_bound=pt.space.num_halo)
        else:
            self.buf = PositionBuffer(pt.trace.num_halo, capacity, alpha=alpha, period=period)
        self.collector = MetricsCollector(window)
        # the past counterfactual, as training measures it (a duck-typed policy may have none)
        self.past = PastCounterfactual.of(policy)
        self.wait_for_answer = wait_for_answer
        self.windows: list[dict] = []
        self.decisions: list[dict] = []
        self.waited = 0.0
        self.clock = None  # rudder.sim.timemodel.Clock: records then carry the modelled times

    def fill(self, init: np.ndarray) -> None:
        """`init`: halo positions (of pt.trace), in either universe."""
        if init.size and self.pt.universe == "remote":
            init = np.searchsorted(self.pt.space.halo, self.pt.trace.halo[init])
        if init.size:
            self.buf.fill(torch.from_numpy(np.sort(init)))
        self.initial_fill = int(init.size)

    def step(self, remote: torch.Tensor, ahead: list[torch.Tensor]) -> StepCounts:
        g, pt, pol, buf = self.g, self.pt, self.policy, self.buf
        S = len(pt)
        info = StepInfo(epoch=pt.epochs[g], step=pt.steps[g], global_step=g, remaining_steps=S - g,
                        future_remote=ahead, stale_slots=buf.stale_count(), buffer_fill=buf.size)
        if g == 0 and pol.start(lambda: buffer_state(buf, [remote, *ahead])) and self.wait_for_answer:
            self.waited += self.wait_for_answer(pol)  # the start decision applies at step 0
        plan = pol.plan(info)
        if self.records:  # the past counterfactual keeps the window's accesses (rudder.prefetch.past)
            self.past.step(buf, remote, ahead)
        sp = begin_step(buf, remote, plan, ahead)
        finish_step(buf, sp)
        if self.verify:
            buf.verify()
        c = StepCounts(sp.hits, sp.misses, int(sp.extra_ids.numel()), int(sp.newcomers.numel()))
        self.g += 1
        if not self.records:
            return c
        stats = StepStats.of_counts(pt.input_rows[g], c.hits, c.misses, c.replaced_rows, c.admitted_rows,
                                    pt.trace.feat_bytes)
        timing = {}
        if self.clock is not None:  # the windows (and a policy reading them) see link time
            stats.t_fetch, stall = self.clock.step(c.misses + c.replaced_rows)
            timing = {"t_compute": self.clock.model.compute_s, "t_stall": stall}
        record = MinibatchRecord.of_step(pt.epochs[g], pt.steps[g], g, stats, **timing).to_dict()
        window = self.collector.add(record, lambda: buffer_state(buf, ahead, roll=True))
        if window is not None:
            self.past.close(window)
        pol.observe(record, window)
        if window is not None:
            self.windows.append(window)
            if self.wait_for_answer:
                self.waited += self.wait_for_answer(pol)
        self.decisions.extend(pol.decisions())
        return c

    def fork(self, policy: Policy | None = None) -> "BufferReplayer":
        """A copy with its own buffer (and `policy`, else a copy of this one's); the trace is
        shared, not copied."""
        new = copy.copy(self)
        new.buf, new.collector = copy.deepcopy(self.buf), copy.deepcopy(self.collector)
        new.clock = copy.copy(self.clock)
        new.policy = policy if policy is not None else copy.deepcopy(self.policy)
        new.windows, new.decisions = list(self.windows), list(self.decisions)
        new.past = self.past.fork(getattr(new.policy, "past_rounds", None))
        return new


class NoBufferReplayer(Replayer):
    """Plain DistDGL: every remote row pulled every time."""

    def fill(self, init: np.ndarray) -> None:
        pass

    def step(self, remote, ahead) -> StepCounts:
        self.g += 1
        return StepCounts(0, int(remote.numel()))


# ---- classic caches and the optimum ---------------------------------------------------------
class CacheReplayer(Replayer):
    """A classic cache (demand fetch): admission is on demand, so no extra rows."""

    def __init__(self, cache, verify: bool = False):
        super().__init__()
        self.cache, self.verify = cache, verify

    def fill(self, init: np.ndarray) -> None:
        self.cache.fill(init)
        self.initial_fill = self.cache.size

    def step(self, remote: torch.Tensor, ahead) -> StepCounts:
        ids = remote.numpy()
        hits = self.cache.access(ids[ids >= 0])
        if self.verify:
            self.cache.verify()
        self.g += 1
        return StepCounts(hits, ids.size - hits, 0, self.cache.admitted)


class BeladyReplayer(Replayer):
    """Belady's optimum needs the whole future: computed at construction over the trace
    (rudder.sim.oracle.belady, with its own start rule), then handed out minibatch by minibatch."""

    def __init__(self, trace: Trace, capacity: int, start: str):
        from rudder.sim.oracle import belady

        super().__init__()
        self.result = belady(trace, capacity, start)

    def fill(self, init: np.ndarray) -> None:
        self.initial_fill = self.result.initial_fill  # the oracle chose its own start

    def step(self, remote, ahead) -> StepCounts:
        r, g = self.result, self.g
        self.g += 1
        hits = int(r.hits[g])
        return StepCounts(hits, int(r.remote_rows[g]) - hits, 0, int(r.admitted[g]))


# ---- positions ------------------------------------------------------------------------------
def position_ids(trace: Trace) -> np.ndarray:
    """Every access as its halo position (0..H-1), or -1 where the id is not a halo node."""
    return trace.halo_positions()[1]


def epoch_ends(epoch: np.ndarray) -> list[int]:
    """For each minibatch, the index one past the last minibatch of its epoch."""
    S = epoch.size
    if S == 0:
        return []
    last = np.ones(S, dtype=bool)
    last[:-1] = epoch[1:] != epoch[:-1]
    ends = np.flatnonzero(last) + 1
    return ends[np.searchsorted(ends, np.arange(S), side="right")].tolist()
