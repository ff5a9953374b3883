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
once and one plan per stale threshold (the buffer's own plan; every budget a prefix of it), the
later minibatches as lookups in the buffered set each branch leaves (no later round changes it):
`_one_round_rows`; a lookahead branch takes every minibatch through the shared step
(begin_step/finish_step) on its own copy, each with its round. Buffer arithmetic only: no
feature row and no DGL RPC. Its
seconds (the copy at the window's start and the replays at its close) go in the window record
as `t_past_cf`.
"""
from __future__ import annotations

import collections
import copy
import time
from typing import Callable, get_args

import numpy as np
import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.policy import Mechanism, Replace
from rudder.prefetch.step import begin_step, finish_step


def index_copy(buf: HaloBuffer) -> HaloBuffer:
    """A copy of the buffer's index and scores without its feature rows (store_features off):
    the rows (and a device-side gather scratch) become empty tensors instead of being copied.
    The sampled minibatches' ids and positions its caches hold (the lookahead memo, the next-use
    window) are shared, not copied: nothing writes them, and a memo finds a minibatch by its
    tensor's storage, so a copy of them would never be found again (each branch would search
    every sampled-ahead minibatch anew)."""
    memo = {id(t): t.new_empty((0, 0)) for t in (buf.feats, getattr(buf, "_scratch", None))
            if isinstance(t, torch.Tensor)}
    for entry in getattr(buf, "_pos_memo", {}).values():
        memo[id(entry)] = entry
    nu = getattr(buf, "_next_use", None)
    for entry in (nu.window if nu is not None else ()):
        memo.update((id(x), x) for x in entry if isinstance(x, (torch.Tensor, np.ndarray, tuple)))
    new = copy.deepcopy(buf, memo)
    new.store_features = False
    return new


def _later(remote: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Every access after a window's first minibatch, as (distinct ids sorted, accesses of each):
    made once per window, each branch then searches only its buffered ids in it."""
    if len(remote) < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.unique(torch.cat(remote[1:]).numpy(), return_counts=True)


def _later_counts(later: tuple[np.ndarray, np.ndarray], query: np.ndarray) -> np.ndarray:
    """Accesses after the first minibatch of each id of `query` (0 for an id never accessed)."""
    ids, count = later
    if not ids.size or not query.size:
        return np.zeros(query.size, dtype=np.int64)
    at = np.minimum(np.searchsorted(ids, query), ids.size - 1)
    return np.where(ids[at] == query, count[at], 0)


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


def _one_round_rows(buf: HaloBuffer, first: torch.Tensor, later: tuple[np.ndarray, np.ndarray],
                    rounds: dict[str, Replace]) -> tuple[int, dict[str, int]]:
    """Keep, and each MassiveGNN round at the first minibatch, from `buf` (consumed), without a
    replay per branch. After the first minibatch no branch changes its buffered set (only a
    round's `apply` does), so a branch's later hits are the kept set's, minus the victims' and
    plus the newcomers' later accesses. The first minibatch's misses are every branch's (the
    split comes before the round). A round's plan with a smaller budget is a prefix of the same
    plan with a larger one (victims in stale order, newcomers most-missed first, a stable sort),
    so one plan per stale threshold serves every budget: buffer.plan_massivegnn's own plan."""
    _, _, _, hit_slots, miss_ids, missed_pos = buf.split(first)
    misses = int(miss_ids.numel())
    held_hits = int(_later_counts(later, buf.contents().numpy()).sum())
    total_later = int(later[1].sum())
    keep = misses + total_later - held_hits
    if not rounds:
        return keep, {}
    buf.record(hit_slots, missed_pos, count_misses=False)  # a round's minibatch counts no misses
    out = {}
    for sa in dict.fromkeys(r.stale_after for r in rounds.values()):
        group = {k: r for k, r in rounds.items() if r.stale_after == sa}
        most = None if any(r.max_rows is None for r in group.values()) else max(r.max_rows for r in group.values())
        victims, newcomers = buf.plan_massivegnn(most, sa)
        pos = buf.slot_pos[victims]
        gone = np.where(pos.numpy() >= 0, _later_counts(later, buf.halo[pos.clamp(min=0)].numpy()), 0)
        came = _later_counts(later, newcomers.numpy())
        extra = ~torch.isin(newcomers, miss_ids).numpy()
        gone, came, extra = _prefix_sums(gone), _prefix_sums(came), _prefix_sums(extra)
        for k, r in group.items():
            n = victims.numel() if r.max_rows is None else min(victims.numel(), r.max_rows)
            out[k] = misses + int(extra[n]) + total_later - (held_hits - int(gone[n]) + int(came[n]))
    return keep, out


def past_fields(start: HaloBuffer, remote: list[torch.Tensor], rounds: dict[str, Replace],
                futures: list[list[torch.Tensor]] = (), windows: int = 1) -> dict:
    """The window fields: `remote` replayed from `start` (an index copy, consumed) with no round
    and with each of `rounds`; `futures`: what was sampled ahead of each minibatch of `remote`
    (missing ones: nothing); `windows`: how many windows `remote` spans (past_windows, written
    where more than one)."""
    bad = {k: r.mechanism for k, r in rounds.items() if r.mechanism not in get_args(Mechanism)}
    if bad:
        raise ValueError(f"unknown replacement mechanism in past rounds: {bad}")
    futures = list(futures)[:len(remote)]
    futures += [[]] * (len(remote) - len(futures))
    ahead = {k: r for k, r in rounds.items() if r.mechanism == "lookahead"}
    got = {k: _lookahead_rows(index_copy(start), remote, r, futures) for k, r in ahead.items()}
    keep, once = _one_round_rows(start, remote[0], _later(remote), {k: r for k, r in rounds.items() if k not in ahead})
    got.update(once)
    return {"past_minibatches": len(remote), "past_keep_fetched": keep,
            **({"past_windows": windows} if windows > 1 else {}),
            **{f"past_fetched_{label}": got[label] for label in rounds}}


class PastCounterfactual:
    """Keeps what a window's past counterfactual needs while the window runs, measures it at its
    close. `rounds`: the policy's Policy.past_rounds, asked at each window's start and close
    (it answers None or {}: nothing kept, nothing measured; None for a policy without one).
    `windows` > 1 (prefetch.past_windows): the replay starts at the start of the window
    windows - 1 before the one closing and runs over all of them (the earlier windows' index
    copies and remote ids are kept until then; fewer at the run's first windows)."""

    def __init__(self, rounds: Callable[[], dict[str, Replace] | None] | None, windows: int = 1):
        self.rounds = rounds if rounds is not None else lambda: None
        self.windows = max(1, int(windows))
        # the earlier windows still to be replayed: (index copy at its start, its remote ids, futures)
        self._kept: collections.deque = collections.deque(maxlen=self.windows - 1)
        self._opening = True  # the next step is a window's first minibatch
        self._start: HaloBuffer | None = None  # the buffer's index at the open window's start
        self._remote: list[torch.Tensor] = []  # the open window's remote ids, minibatch by minibatch
        self._futures: list[list[torch.Tensor]] = []  # what was sampled ahead of each of its minibatches
        self._t = 0.0  # seconds spent on the open window so far

    @classmethod
    def of(cls, policy) -> "PastCounterfactual":
        """The one a run of `policy` measures: its past_rounds and past_windows (a duck-typed
        policy may have neither: then it measures nothing)."""
        return cls(getattr(policy, "past_rounds", None), getattr(policy, "past_windows", 1))

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
        """At a window's close (after its last minibatch): the past_* fields and `t_past_cf`
        into `window` when the policy wants them; the next step opens the next window."""
        t0 = time.perf_counter()
        start, remote, futures = self._start, self._remote, self._futures
        self._opening, self._start, self._remote, self._futures = True, None, [], []
        rounds = self.rounds()
        if not rounds or start is None or not remote:
            self._kept.clear()  # a gap: the windows before it no longer lead up to the next
            return
        spanned = 1
        if self._kept.maxlen:  # from the oldest kept window's start, over every window since
            kept = list(self._kept)  # oldest first
            if not kept:  # the first: this window alone (its start is consumed: keep a copy)
                self._kept.append((index_copy(start), remote, futures))
            else:
                # the oldest is replayed for the last time once `windows` are spanned (consumed)
                first = self._kept.popleft()[0] if len(kept) == self._kept.maxlen else index_copy(kept[0][0])
                self._kept.append((start, remote, futures))
                start = first
                remote = [r for _, rs, _ in kept for r in rs] + remote
                futures = [f for _, _, fs in kept for f in fs] + futures
                spanned = len(kept) + 1
        window.update(past_fields(start, remote, rounds, futures, spanned))
        window["t_past_cf"] = self._t + time.perf_counter() - t0
