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
rows: `index_copy`) at each window start and the window's remote id lists; the close replays
them on copies of that index: the first minibatch through the shared step (begin_step/
finish_step) with the branch's round, the later ones as lookups in the buffered set that round
left (no later round changes it); a lookahead branch takes every minibatch through the shared
step, each with its round. Buffer arithmetic only: no feature row and no DGL RPC. Its
seconds (the copy at the window's start and the replays at its close) go in the window record
as `t_past_cf`.
"""
from __future__ import annotations

import collections
import copy
import time
from typing import Callable

import numpy as np
import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.policy import Replace
from rudder.prefetch.step import begin_step, finish_step


def index_copy(buf: HaloBuffer) -> HaloBuffer:
    """A copy of the buffer's index and scores without its feature rows (store_features off):
    the rows (and a device-side gather scratch) become empty tensors instead of being copied."""
    empty = {id(t): t.new_empty((0, 0)) for t in (buf.feats, getattr(buf, "_scratch", None))
             if isinstance(t, torch.Tensor)}
    new = copy.deepcopy(buf, empty)
    new.store_features = False
    return new


def _later(remote: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Every access after a window's first minibatch, as (distinct ids sorted, accesses of each):
    made once per window, each branch then searches only its buffered ids in it."""
    if len(remote) < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.unique(torch.cat(remote[1:]).numpy(), return_counts=True)


def _branch_rows(buf: HaloBuffer, remote: list[torch.Tensor], later: tuple[np.ndarray, np.ndarray],
                 round: Replace | None, futures: list[list[torch.Tensor]]) -> int:
    """A branch's fetched rows. A lookahead round is the regime's round before every minibatch:
    each minibatch through the shared step with it and what was sampled ahead of it. Otherwise
    the first minibatch through the shared step with `round`; after it the branch has no round,
    so the buffered set no longer changes (only a round's `apply` changes it): the later accesses
    hit where their id is buffered (a search of the buffered ids among them)."""
    if round is not None and round.mechanism == "lookahead":
        rows = 0
        for ids, ahead in zip(remote, futures):
            sp = begin_step(buf, ids, round, ahead)
            finish_step(buf, sp)
            rows += sp.misses + int(sp.extra_ids.numel())
        return rows
    sp = begin_step(buf, remote[0], round, futures[0])
    finish_step(buf, sp)
    rows = sp.misses + int(sp.extra_ids.numel())
    ids, count = later
    held = buf.contents().numpy()
    hits = 0
    if ids.size and held.size:
        at = np.minimum(np.searchsorted(ids, held), ids.size - 1)
        hits = int(count[at][ids[at] == held].sum())
    return rows + int(count.sum()) - hits


def past_fields(start: HaloBuffer, remote: list[torch.Tensor], rounds: dict[str, Replace],
                futures: list[list[torch.Tensor]] = (), windows: int = 1) -> dict:
    """The window fields: `remote` replayed from `start` (an index copy, consumed) with no round
    and with each of `rounds`; `futures`: what was sampled ahead of each minibatch of `remote`
    (missing ones: nothing); `windows`: how many windows `remote` spans (past_windows, written
    where more than one)."""
    futures = list(futures)[:len(remote)]
    futures += [[]] * (len(remote) - len(futures))
    branches = [None, *rounds.values()]
    later = _later(remote)
    got = [_branch_rows(start if i == len(branches) - 1 else index_copy(start), remote, later, r, futures)
           for i, r in enumerate(branches)]
    return {"past_minibatches": len(remote), "past_keep_fetched": got[0],
            **({"past_windows": windows} if windows > 1 else {}),
            **{f"past_fetched_{label}": n for label, n in zip(rounds, got[1:])}}


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
