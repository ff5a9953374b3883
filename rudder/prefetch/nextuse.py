"""Next use over the sampled-ahead window, kept up to date instead of recomputed (issue 17).

A lookahead round needs, for the halo nodes it compares (this minibatch's misses, the buffered
slots), the first minibatch of the window that uses each one and how many use it. Between two
rounds the window slides: the minibatch now trained on leaves its front, one newly sampled
enters at its back (with the whole epoch scheduled ahead, none enters: the window is the rest of
the epoch). So per halo node we keep
  first [H] int64  the number a of the first window minibatch using it (NONE: none)
  freq  [H] int64  how many window minibatches use it
  last  [H] int64  where its newest use sits in `link` (-1: none in the window)
and per access of a window minibatch, in one flat array,
  link  [n] int64  the number of the next window minibatch using the same node (NONE: none)
so a minibatch entering or leaving touches only its own positions (O(its size), not O(H) nor
O(window)), whatever the depth: entering, it is its nodes' next use after their newest one (a
link) and their first use if they had none; leaving (always the front), its nodes' first use
moves to its links. Minibatch numbers a are given in order of entry, so the window's are
consecutive and a node's next use is first - front + 1. A minibatch's positions are distinct
(its input nodes).

A window that does not continue the last one (another epoch, a fork, a round skipped until its
minibatches all left) is rebuilt: the same cost as computing it from scratch, once.
`next_use_scratch` is that computation, the reference the tests compare against.
"""
from __future__ import annotations

import collections

import torch

# No bound on the window (it was the 62 bits of a per-node ring): a whole epoch scheduled ahead
# is one window.
NONE = 1 << 62  # `first` / `link` of a node no (later) window minibatch uses


class WindowNextUse:
    def __init__(self, num_halo: int):
        self.freq = torch.zeros(num_halo, dtype=torch.int64)
        self.first = torch.full((num_halo,), NONE, dtype=torch.int64)  # number of the first use
        self.last = torch.full((num_halo,), -1, dtype=torch.int64)  # index in link of the newest use
        self.link = torch.empty(1024, dtype=torch.int64)
        self.n = 0  # entries of link in use (those of window minibatches; the front's start at its lo)
        # (ids, positions, number a, lo: its first index in link); holding `ids` keeps its
        # storage (and so its key) alive
        self.window: collections.deque = collections.deque()
        self.count = 0  # the next minibatch number

    @staticmethod
    def key(ids: torch.Tensor) -> tuple:
        """One minibatch's identity: a view of ids (the simulator re-slices its trace each step)."""
        return (ids.data_ptr(), ids.numel(), ids.stride(0) if ids.dim() else 1,
                ids.untyped_storage().data_ptr())

    def sync(self, future: list[torch.Tensor], positions) -> None:
        """Makes the window `future` (in order); `positions(ids)` gives a minibatch's halo
        positions. Keeps the part that continues, drops the front, adds the back."""
        keys = [self.key(f) for f in future]
        held = [self.key(w[0]) for w in self.window]
        drop = len(held)  # the held minibatches before future[0] leave
        if keys:
            for i in range(len(held)):
                if held[i] == keys[0]:
                    drop = i
                    break
        kept = len(held) - drop
        if held[drop:] != keys[:kept]:  # not a continuation: start again
            self.freq.zero_()
            self.first.fill_(NONE)
            self.last.fill_(-1)
            self.window.clear()
            self.n = 0
            drop = kept = 0
        for _ in range(drop):
            self._leave()
        for ids in future[kept:]:
            self._enter(ids, positions(ids))

    def _enter(self, ids: torch.Tensor, pos: torch.Tensor) -> None:
        a, m = self.count, pos.numel()
        self.count += 1
        self._room(m)
        lo = self.n
        idx = torch.arange(lo, lo + m)
        self.link[lo:lo + m] = NONE
        prev = self.last.gather(0, pos)
        has = prev >= 0
        self.link.index_fill_(0, prev.masked_select(has), a)  # a: the next use after the newest one
        self.last.scatter_(0, pos, idx)
        self.freq.scatter_add_(0, pos, torch.ones_like(pos))
        self.first.scatter_(0, pos, self.first.gather(0, pos).clamp_(max=a))  # a: the newest
        self.window.append((ids, pos, a, lo))
        self.n = lo + m

    def _leave(self) -> None:
        """The front minibatch leaves: its nodes' first use moves to their link."""
        _, pos, _, lo = self.window.popleft()
        m = pos.numel()
        self.first.scatter_(0, pos, self.link[lo:lo + m])
        self.freq.scatter_add_(0, pos, torch.full_like(pos, -1))
        newest = self.last.gather(0, pos)  # nodes whose newest use was this one have none left
        self.last.scatter_(0, pos, newest.masked_fill_(newest == torch.arange(lo, lo + m), -1))
        if not self.window:
            self.n = 0

    def _room(self, m: int) -> None:
        """Room for m more entries in link: first drop those of minibatches that left (shifting
        the `last` indices), then grow to twice what is live (O(H), amortised over many steps)."""
        if self.n + m <= self.link.numel():
            return
        lo = self.window[0][3] if self.window else self.n
        if lo:
            self.link[:self.n - lo] = self.link[lo:self.n].clone()
            self.last.sub_(lo).clamp_(min=-1)  # live indices are >= lo; the rest were -1
            self.window = collections.deque((i, p, a, s - lo) for i, p, a, s in self.window)
            self.n -= lo
        if 2 * (self.n + m) > self.link.numel():  # keep half free: compactions stay rare
            grown = torch.empty(max(2 * self.link.numel(), 2 * (self.n + m)), dtype=torch.int64)
            grown[:self.n] = self.link[:self.n]
            self.link = grown

    def holds(self, future: list[torch.Tensor]) -> bool:
        """Whether the window is `future` (synced to it, nothing left since)."""
        return len(future) == len(self.window) and all(
            self.key(f) == self.key(w[0]) for f, w in zip(future, self.window))

    def used(self, pos: torch.Tensor | None = None) -> torch.Tensor:
        """Whether the window uses each node (of `pos`, or all)."""
        return (self.freq if pos is None else self.freq.gather(0, pos)) != 0

    def next_use(self, pos: torch.Tensor) -> torch.Tensor:
        """1 + the index in the window of the first minibatch using each node; len(window)+1
        where none does."""
        never = len(self.window) + 1
        if not self.window:
            return torch.full_like(pos, never)
        front = self.window[0][2]
        return (self.first.gather(0, pos) - (front - 1)).clamp_(max=never)

    def frequency(self, pos: torch.Tensor) -> torch.Tensor:
        return self.freq.gather(0, pos)


def next_use_scratch(positions: list[torch.Tensor], num_halo: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(next use [H], frequency [H]) over a window given as each minibatch's halo positions,
    computed from nothing: next use = 1 + index of the first minibatch using the node
    (len+1: none), frequency = minibatches using it."""
    never = len(positions) + 1
    next_use = torch.full((num_halo,), never, dtype=torch.int64)
    freq = torch.zeros(num_halo, dtype=torch.int64)
    for d, pos in enumerate(positions, start=1):  # per minibatch, not per node
        next_use.scatter_reduce_(0, pos, torch.full_like(pos, d), reduce="amin")
        freq.index_add_(0, pos, torch.ones_like(pos))
    return next_use, freq
