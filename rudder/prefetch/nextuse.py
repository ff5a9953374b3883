"""Next use over the sampled-ahead window, kept up to date instead of recomputed (issue 17).

A lookahead round needs, for the halo nodes it compares (this minibatch's misses, the buffered
slots), the first minibatch of the window that uses each one and how many use it. Between two
rounds the window slides: the minibatch now trained on leaves its front, one newly sampled
enters at its back. So per halo node we keep
  bits [H] int64   bit (a mod 62) set when the window's minibatch number a uses the node
  freq [H] int64   how many window minibatches use it
  first [H] int64  the number a of the first window minibatch using it
and a minibatch entering or leaving touches only its own positions (O(its size), not O(H)):
entering, it is its nodes' first use if they had none; leaving (always the front), its nodes'
first use moves to their next set bit. Minibatch numbers a are given in order of entry, so the
window's are consecutive (at most 62 of them) and a node's next use is first - front + 1.

A window that does not continue the last one (another epoch, a fork, a round skipped until its
minibatches all left) is rebuilt: the same cost as computing it from scratch, once.
`next_use_scratch` is that computation, the reference the tests compare against.
"""
from __future__ import annotations

import collections

import torch

RING = 62  # bits per node: bit 63 is the sign and bit 62 keeps the shifts clear of it
NONE = 1 << 62  # `first` of a node no window minibatch uses


class WindowNextUse:
    def __init__(self, num_halo: int):
        self.bits = torch.zeros(num_halo, dtype=torch.int64)
        self.freq = torch.zeros(num_halo, dtype=torch.int64)
        self.first = torch.full((num_halo,), NONE, dtype=torch.int64)  # number of the first use
        # (ids, positions, number a); holding `ids` keeps its storage (and so its key) alive
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
        if len(future) > RING:
            raise ValueError(f"a window of {len(future)} minibatches exceeds {RING}")
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
            self.bits.zero_()
            self.freq.zero_()
            self.first.fill_(NONE)
            self.window.clear()
            drop = kept = 0
        for _ in range(drop):
            self._leave()
        for ids in future[kept:]:
            self._enter(ids, positions(ids))

    def _enter(self, ids: torch.Tensor, pos: torch.Tensor) -> None:
        a = self.count
        self.count += 1
        self.bits.scatter_(0, pos, self.bits.gather(0, pos) | (1 << (a % RING)))
        self.freq.scatter_add_(0, pos, torch.ones_like(pos))
        self.first.scatter_(0, pos, self.first.gather(0, pos).clamp_(max=a))  # a: the newest
        self.window.append((ids, pos, a))

    def _leave(self) -> None:
        """The front minibatch a leaves: its nodes' first use moves to their next set bit."""
        _, pos, a = self.window.popleft()
        x = self.bits.gather(0, pos) & ~(1 << (a % RING))
        self.bits.scatter_(0, pos, x)
        self.freq.scatter_add_(0, pos, torch.full_like(pos, -1))
        # rotate minibatch a+1's bit to bit 0 (62-bit values: no shift reaches the sign); the
        # window's numbers are consecutive, so bit j is minibatch a+1+j
        s = (a + 1) % RING
        r = (x >> s) | ((x & ((1 << s) - 1)) << (RING - s))
        self.first.scatter_(0, pos, torch.where(x != 0, _lowest_bit(r) + (a + 1), NONE))

    def holds(self, future: list[torch.Tensor]) -> bool:
        """Whether the window is `future` (synced to it, nothing left since)."""
        return len(future) == len(self.window) and all(
            self.key(f) == self.key(w[0]) for f, w in zip(future, self.window))

    def used(self, pos: torch.Tensor | None = None) -> torch.Tensor:
        """Whether the window uses each node (of `pos`, or all)."""
        return (self.bits if pos is None else self.bits.gather(0, pos)) != 0

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


def _lowest_bit(x: torch.Tensor) -> torch.Tensor:
    """Index of the lowest set bit of each x > 0 (x < 2^62): the exponent of x & -x as a
    double (exact: a power of two); garbage at 0."""
    return ((x & -x).double().view(torch.int64) >> 52) - 1023


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
