"""The past counterfactual (issue 18): at each metrics window's close, the window's own
minibatches played again from the buffer as it was at the window's start, once with no round
(`past_keep_fetched`) and once with each round the policy names (Policy.past_rounds) as the
regime would apply it (`past_fetched_<label>`): a MassiveGNN round at its first minibatch, a
lookahead round before every minibatch (each planned on what was sampled ahead of that
minibatch, as the run had it): what a decision at the last window close would have done to this
window's fetched rows, a measured past fact.

One code path for the replay (rudder.sim.replay.BufferReplayer) and live training (the loader
thread, rudder.pipeline): both call `PastCounterfactual.step` before each minibatch is served
and `close` on each window record. It keeps a copy of the buffer's index and scores (no feature
rows: `index_copy`) at each window start, the window's remote id lists and what was sampled
ahead of each. At the close, keep and the MassiveGNN rounds take the first minibatch's split
once and one plan per stale threshold (the buffer's own plans, made in one call; every budget a
prefix of one), the later minibatches as lookups (their accesses counted once a window) in the
buffered set each branch leaves (no later round changes it):
`_one_round_rows`; a lookahead branch takes every minibatch through the shared step
(begin_step/finish_step) on its own copy, each with its round. Buffer arithmetic only: no
feature row and no DGL RPC. Its
seconds (the copy at the window's start and the replays at its close) go in the window record
as `t_past_cf`; those the loader thread spent on it as `t_past_loader`.

Off the loader (`background`, prefetch.past_thread): the loader keeps only the index copy at
a window's start and hands the close's replays to a thread of its own, so the next minibatch's
pull is not held behind them. The window record then carries the measurement as a future
(PENDING) until `settle` merges it in: the agent's thread settles the windows it reads (before
it builds the prompt that shows them), the run's record writer each window once `measured`.
One worker: the windows are measured in order (a kept window's start is copied by one job
before a later job consumes it).
"""
from __future__ import annotations

import collections
import copy
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, get_args

import numpy as np
import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.policy import Mechanism, Replace
from rudder.prefetch.step import begin_step, finish_step


PENDING = "_past_pending"  # a window's past counterfactual still measured off the loader (a Future)


def settle(window: dict | None) -> dict | None:
    """`window` with its past counterfactual merged in: waits for the measurement when it is
    still running off the loader (PENDING), a no-op otherwise. Its error, if it failed, is
    raised here, as it would have been on the loader thread."""
    if window is not None and PENDING in window:
        window.update(window.pop(PENDING).result())
    return window


def measured(window: dict) -> bool:
    """Whether `settle` would return at once (no measurement of it still running)."""
    return PENDING not in window or window[PENDING].done()


def index_copy(buf: HaloBuffer) -> HaloBuffer:
    """A copy of the buffer's index and scores without its feature rows (store_features off):
    the rows (and a device-side gather scratch) become empty tensors instead of being copied
    (the sampled minibatches its caches hold are shared by any copy: HaloBuffer.__deepcopy__)."""
    memo = {id(t): t.new_empty((0, 0)) for t in (buf.feats, getattr(buf, "_scratch", None))
            if isinstance(t, torch.Tensor)}
    new = copy.deepcopy(buf, memo)
    new.store_features = False
    return new


# A window's ids are counted in a dense array (one bincount, lookups by index) rather than sorted
# when the largest is below this bound or 16x their number (the array stays within ~32 MB or 128 B
# an access): a graph's node ids fit it; ids from a sparse space fall back to the sort.
DENSE_IDS = 1 << 22


class _Later:
    """Every access after a window's first minibatch, counted once per window; each branch then
    looks up only its buffered ids (`counts`). `total`: all of them, the ones no buffer can hold
    (-1 in a replay's halo-position space: not a halo node) included."""

    def __init__(self, remote: list[torch.Tensor]):
        ids = torch.cat(remote[1:]).numpy() if len(remote) > 1 else np.zeros(0, dtype=np.int64)
        self.total = int(ids.size)
        if ids.size and ids.min() < 0:
            ids = ids[ids >= 0]
        self.ids: np.ndarray | None = None  # distinct ids sorted, where not dense
        if not ids.size or ids.max() < max(DENSE_IDS, 16 * ids.size):
            self.count = np.bincount(ids)  # accesses by id
        else:
            self.ids, self.count = np.unique(ids, return_counts=True)

    def counts(self, query: np.ndarray) -> np.ndarray:
        """Accesses of each id of `query` (0 for an id never accessed)."""
        if not self.count.size or not query.size:
            return np.zeros(query.size, dtype=np.int64)
        if self.ids is None:  # ids beyond the largest accessed one count 0
            inside = query < self.count.size
            return np.where(inside, self.count[np.where(inside, query, 0)], 0)
        at = np.minimum(np.searchsorted(self.ids, query), self.ids.size - 1)
        return np.where(self.ids[at] == query, self.count[at], 0)


def _prefix_sums(x: np.ndarray) -> np.ndarray:
    """[0, x0, x0 + x1, ...]: element n is the total of a plan's first n pairs."""
    return np.concatenate([[0], np.cumsum(x)])


def _lookahead_rows(buf: HaloBuffer, remote: list[torch.Tensor], round: Replace,
                    futures: list[list[torch.Tensor]]) -> int:
    """A lookahead branch: the regime's round before every minibatch, each through the shared
    step with what was sampled ahead of it."""
    rows = 0
    for ids, ahead in zip(remote, futures):
        sp = begin_step(buf, ids, round, ahead)
        finish_step(buf, sp)
        rows += sp.misses + int(sp.extra_ids.numel())
    return rows


def _one_round_rows(buf: HaloBuffer, first: torch.Tensor, later: _Later,
                    rounds: dict[str, Replace]) -> tuple[int, dict[str, int], int]:
    """Keep, and each MassiveGNN round at the first minibatch, from `buf` (consumed), without a
    replay per branch. After the first minibatch no branch changes its buffered set (only a
    round's `apply` does), so a branch's later hits are the kept set's, minus the victims' and
    plus the newcomers' later accesses. The first minibatch's misses are every branch's (the
    split comes before the round). A round's plan with a smaller budget is a prefix of the same
    plan with a larger one (victims in stale order, newcomers most-missed first, a stable sort),
    so one plan per stale threshold serves every budget, and one call plans every threshold
    (buffer.massivegnn_plans: plan_massivegnn's own plans, one sort for all). Also returns the
    most slots any of the rounds would have swapped: 0 where none had anything to swap."""
    _, _, _, hit_slots, miss_ids, missed_pos = buf.split(first)
    misses = int(miss_ids.numel())
    held_hits = int(later.counts(buf.contents().numpy()).sum())
    total_later = later.total
    keep = misses + total_later - held_hits
    if not rounds:
        return keep, {}, 0
    buf.record(hit_slots, missed_pos, count_misses=False)  # a round's minibatch counts no misses
    most = None if any(r.max_rows is None for r in rounds.values()) else max(r.max_rows for r in rounds.values())
    plans = buf.massivegnn_plans(list(dict.fromkeys(r.stale_after for r in rounds.values())), most)
    missed = np.zeros(buf.halo.numel(), dtype=bool)
    missed[missed_pos.numpy()] = True  # the first minibatch's misses, by halo position
    out, swapped = {}, 0
    for sa, (victims, new_pos) in plans.items():
        pos = buf.slot_pos[victims]
        gone = np.where(pos.numpy() >= 0, later.counts(buf.halo[pos.clamp(min=0)].numpy()), 0)
        came = later.counts(buf.halo[new_pos].numpy())
        extra = ~missed[new_pos.numpy()]  # newcomers the first minibatch did not pull anyway
        gone, came, extra = _prefix_sums(gone), _prefix_sums(came), _prefix_sums(extra)
        for k, r in rounds.items():
            if r.stale_after == sa:
                n = victims.numel() if r.max_rows is None else min(victims.numel(), r.max_rows)
                swapped = max(swapped, n)
                out[k] = misses + int(extra[n]) + total_later - (held_hits - int(gone[n]) + int(came[n]))
    return keep, out, swapped


def past_fields(start: HaloBuffer, remote: list[torch.Tensor], rounds: dict[str, Replace],
                futures: list[list[torch.Tensor]] = (), windows: int = 1) -> dict:
    """The window fields: `remote` replayed from `start` (an index copy, consumed) with no round
    and with each of `rounds`; `futures`: what was sampled ahead of each minibatch of `remote`
    (missing ones: nothing); `windows`: how many windows `remote` spans (past_windows, written
    where more than one). With MassiveGNN rounds, `past_round_slots`: the most slots one of them
    would have swapped; 0 says no round was measured (at the replay's start no node had been
    missed yet, or no slot was stale), not that rounds change nothing."""
    bad = {k: r.mechanism for k, r in rounds.items() if r.mechanism not in get_args(Mechanism)}
    if bad:
        raise ValueError(f"unknown replacement mechanism in past rounds: {bad}")
    futures = list(futures)[:len(remote)]
    futures += [[]] * (len(remote) - len(futures))
    ahead = {k: r for k, r in rounds.items() if r.mechanism == "lookahead"}
    got = {k: _lookahead_rows(index_copy(start), remote, r, futures) for k, r in ahead.items()}
    one = {k: r for k, r in rounds.items() if k not in ahead}
    keep, once, swapped = _one_round_rows(start, remote[0], _Later(remote), one)
    got.update(once)
    return {"past_minibatches": len(remote), "past_keep_fetched": keep,
            **({"past_windows": windows} if windows > 1 else {}),
            **({"past_round_slots": swapped} if one else {}),
            **{f"past_fetched_{label}": got[label] for label in rounds}}


class PastCounterfactual:
    """Keeps what a window's past counterfactual needs while the window runs, measures it at its
    close. `rounds`: the policy's Policy.past_rounds, asked at each window's start and close
    (it answers None or {}: nothing kept, nothing measured; None for a policy without one).
    `windows` > 1 (prefetch.past_windows): the replay starts at the start of the window
    windows - 1 before the one closing and runs over all of them (the earlier windows' index
    copies and remote ids are kept until then; fewer at the run's first windows, and with
    MassiveGNN rounds never from a start before any miss: the run's first window is measured
    alone, and the next ones from the second's start)."""

    def __init__(self, rounds: Callable[[], dict[str, Replace] | None] | None, windows: int = 1,
                 background: bool = False):
        self.rounds = rounds if rounds is not None else lambda: None
        self.windows = max(1, int(windows))
        self.background = background  # the close's replays on a worker thread (module docstring)
        self._pool: ThreadPoolExecutor | None = None
        # the earlier windows still to be replayed: (index copy at its start, its remote ids,
        # futures); a job on the worker may still copy the oldest's start (never changed after)
        self._kept: collections.deque = collections.deque(maxlen=self.windows - 1)
        self._opening = True  # the next step is a window's first minibatch
        self._start: HaloBuffer | None = None  # the buffer's index at the open window's start
        self._remote: list[torch.Tensor] = []  # the open window's remote ids, minibatch by minibatch
        self._futures: list[list[torch.Tensor]] = []  # what was sampled ahead of each of its minibatches
        self._t = 0.0  # seconds spent on the open window so far

    @classmethod
    def of(cls, policy, background: bool = False) -> "PastCounterfactual":
        """The one a run of `policy` measures: its past_rounds and past_windows (a duck-typed
        policy may have neither: then it measures nothing)."""
        return cls(getattr(policy, "past_rounds", None), getattr(policy, "past_windows", 1), background)

    def step(self, buf: HaloBuffer, remote: torch.Tensor, future: list[torch.Tensor] = ()) -> None:
        """Before a minibatch is served (its plan not yet applied): its remote ids (halo or not)
        and what is sampled ahead of it (references: the loader's own tensors), and at a
        window's first minibatch a copy of the buffer's index."""
        if self._opening:
            self._opening = False
            t0 = time.perf_counter()
            if self.rounds() is not None:
                self._start = index_copy(buf)
            self._t = time.perf_counter() - t0
        if self._start is not None:
            self._remote.append(remote)
            self._futures.append(list(future))

    def fork(self, rounds: Callable[[], dict[str, Replace] | None] | None) -> "PastCounterfactual":
        """A copy for a fork of the run (a replay's branch) whose policy's past rounds are
        `rounds`: it measures the open window too when they want it."""
        new = PastCounterfactual(rounds, self.windows)
        new._opening, new._t = self._opening, self._t
        if self._start is not None and new.rounds() is not None:
            new._start, new._remote, new._futures = index_copy(self._start), list(self._remote), list(self._futures)
            new._kept.extend((index_copy(s), list(r), list(f)) for s, r, f in self._kept)
        return new

    def close(self, window: dict) -> None:
        """At a window's close (after its last minibatch): the past_* fields, `t_past_cf` and
        `t_past_loader` into `window` when the policy wants them (background: a PENDING future
        of them, `settle` merges it); the next step opens the next window."""
        t0 = time.perf_counter()
        start, remote, futures = self._start, self._remote, self._futures
        self._opening, self._start, self._remote, self._futures = True, None, [], []
        rounds = self.rounds()
        if not rounds or start is None or not remote:
            self._kept.clear()  # a gap: the windows before it no longer lead up to the next
            return
        copy_first, spanned = False, 1
        # a MassiveGNN round brings in missed nodes: at a start before any miss (the run's
        # first minibatch) every such round swaps nothing, so no later window is replayed from
        # there or before (this one alone says so: past_round_slots 0)
        if all(r.mechanism == "massivegnn" for r in rounds.values()) and not bool((start.miss_count > 0).any()):
            self._kept.clear()
        elif self._kept.maxlen:  # from the oldest kept window's start, over every window since
            kept = list(self._kept)  # oldest first
            self._kept.append((start, remote, futures))  # its start is replayed by later windows
            if not kept:  # the first: this window alone, from a copy of its start (kept above)
                copy_first = True
            else:
                # the oldest is replayed for the last time once `windows` are spanned (consumed;
                # the deque dropped it), else from a copy of it
                copy_first = len(kept) < self._kept.maxlen
                start = kept[0][0]
                remote = [r for _, rs, _ in kept for r in rs] + remote
                futures = [f for _, _, fs in kept for f in fs] + futures
                spanned = len(kept) + 1
        args = (start, copy_first, remote, rounds, futures, spanned, self._t)
        if not self.background:
            window.update(self._measure(*args))
            window["t_past_loader"] = window["t_past_cf"]
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rudder-past")
        window[PENDING] = self._pool.submit(self._measure, *args)
        window["t_past_loader"] = self._t + time.perf_counter() - t0

    @staticmethod
    def _measure(start: HaloBuffer, copy_first: bool, remote: list[torch.Tensor], rounds: dict[str, Replace],
                 futures: list[list[torch.Tensor]], spanned: int, t_open: float) -> dict:
        """The window fields of one close (`start` consumed unless `copy_first`): on the loader
        thread or the worker."""
        t0 = time.perf_counter()
        fields = past_fields(index_copy(start) if copy_first else start, remote, rounds, futures, spanned)
        fields["t_past_cf"] = t_open + time.perf_counter() - t0
        return fields

    def shutdown(self) -> None:
        """No more windows: the worker ends once the measurements handed to it are done."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
