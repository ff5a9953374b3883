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

import numpy as np
import torch

from rudder.prefetch import jit

# No bound on the window (it was the 62 bits of a per-node ring): a whole epoch scheduled ahead
# is one window, up to 2^31 - 2 minibatches in all and 2^31 - 2 accesses in the window (int32).
NONE = (1 << 31) - 1  # `first` / `link` of a node no (later) window minibatch uses
_FIRST, _FREQ, _LAST = 0, 1, 2  # columns of a node's 16-byte row (the fourth is padding)
_ROW = np.dtype(np.complex128)  # a 16-byte item: numpy gathers and scatters whole rows as one


class WindowNextUse:
    """A node's first use, frequency and newest link index share one 16-byte row (int32 each),
    so a minibatch entering or leaving gathers its nodes' rows once, updates them in a compact
    copy and scatters them back once: two random passes over the halo-sized state instead of one
    per field and operation (numpy moves a 16-byte item as fast as an 8-byte one). The arrays
    are numpy; `next_use`, `frequency` and `used` also answer torch tensors."""

    def __init__(self, num_halo: int):
        self.state = np.zeros((num_halo, 4), dtype=np.int32)
        self.state[:, _FIRST] = NONE
        self.state[:, _LAST] = -1
        self.link = np.empty(1024, dtype=np.int32)
        self._iota = np.arange(1024, dtype=np.int32)  # link indices, sliced (no arange per minibatch)
        self.n = 0  # entries of link in use (those of window minibatches; the front's start at its lo)
        # (ids, positions, number a, lo: its first index in link, key); holding `ids` keeps its
        # storage (and so its key) alive
        self.window: collections.deque = collections.deque()
        self.count = 0  # the next minibatch number

    @property
    def _rows(self) -> np.ndarray:
        """`state` as one 16-byte item per node (the same memory; made on use, so a deep copy
        of this object, whose arrays are copied one by one, never splits the two)."""
        return self.state.view(_ROW).reshape(self.state.shape[0])

    @property
    def freq(self) -> np.ndarray:
        """How many window minibatches use each node (a strided view)."""
        return self.state[:, _FREQ]

    @property
    def first(self) -> np.ndarray:
        return self.state[:, _FIRST]

    @staticmethod
    def key(ids: torch.Tensor) -> tuple:
        """One minibatch's identity: a view of ids (the simulator re-slices its trace each step)."""
        return (ids.data_ptr(), ids.numel(), ids.stride(0) if ids.dim() else 1,
                ids.untyped_storage().data_ptr())

    def sync(self, future: list[torch.Tensor], positions) -> None:
        """Makes the window `future` (in order); `positions(ids)` gives a minibatch's halo
        positions. Keeps the part that continues, drops the front, adds the back."""
        held = self.window
        drop = len(held)  # the held minibatches before future[0] leave
        if future:
            for i in range(len(held)):
                if self._same(future[0], held[i]):
                    drop = i
                    break
        kept = len(held) - drop
        if kept > len(future) or not all(self._same(future[j], held[drop + j]) for j in range(kept)):
            # not a continuation: start again
            self.state[:, _FIRST] = NONE
            self.state[:, _FREQ] = 0
            self.state[:, _LAST] = -1
            self.window.clear()
            self.n = 0
            drop = kept = 0
        for _ in range(drop):
            self._leave()
        for ids in future[kept:]:
            self._enter(ids, positions(ids), self.key(ids))

    def _same(self, ids: torch.Tensor, held: tuple) -> bool:
        """Whether `ids` is the held minibatch: the very tensor (most rounds: the queue keeps its
        tensors), else a view of the same ids (its key; ~4 torch calls, so only when needed)."""
        return ids is held[0] or self.key(ids) == held[4]

    def _gather(self, pos: np.ndarray) -> np.ndarray:
        return self._rows.take(pos).view(np.int32).reshape(pos.size, 4)

    def _enter(self, ids: torch.Tensor, pos: torch.Tensor, key: tuple) -> None:
        pos = _np(pos)
        a, m = self.count, pos.size
        if a >= NONE:
            raise OverflowError("more than 2^31 - 2 minibatches through one window index")
        self.count += 1
        self._room(m)
        lo = self.n
        k = jit.kernels()
        if k is not None:  # one compiled loop over the positions (the same values)
            k.nu_enter(self.state, self.link, pos, a, lo)
        else:
            self._enter_np(pos, a, lo)
        self.window.append((ids, pos, a, lo, key))
        self.n = lo + m

    def _enter_np(self, pos: np.ndarray, a: int, lo: int) -> None:
        m = pos.size
        self.link[lo:lo + m] = NONE
        every = self._rows
        rows = every.take(pos).view(np.int32).reshape(m, 4)
        prev = rows[:, _LAST]
        self.link[prev[prev >= 0]] = a  # a: the next use after the newest one
        rows[:, _LAST] = self._iota[lo:lo + m]
        rows[:, _FREQ] += 1  # positions are distinct within a minibatch
        np.minimum(rows[:, _FIRST], a, out=rows[:, _FIRST])  # a: the newest
        every[pos] = rows.view(_ROW).reshape(m)

    def _leave(self) -> None:
        """The front minibatch leaves: its nodes' first use moves to their link."""
        _, pos, _, lo, _ = self.window.popleft()
        k = jit.kernels()
        if k is not None:
            k.nu_leave(self.state, self.link, pos, lo)
        else:
            self._leave_np(pos, lo)
        if not self.window:
            self.n = 0

    def _leave_np(self, pos: np.ndarray, lo: int) -> None:
        m = pos.size
        every = self._rows
        rows = every.take(pos).view(np.int32).reshape(m, 4)
        rows[:, _FIRST] = self.link[lo:lo + m]
        rows[:, _FREQ] -= 1
        newest = rows[:, _LAST]  # nodes whose newest use was this one have none left
        newest[newest == self._iota[lo:lo + m]] = -1
        every[pos] = rows.view(_ROW).reshape(m)

    def _room(self, m: int) -> None:
        """Room for m more entries in link: first drop those of minibatches that left (shifting
        the `last` indices), then grow to twice what is live (O(H), amortised over many steps)."""
        if self.n + m <= self.link.size:
            return
        lo = self.window[0][3] if self.window else self.n
        if lo:
            self.link[:self.n - lo] = self.link[lo:self.n].copy()
            last = self.state[:, _LAST]
            np.maximum(last - lo, -1, out=last)  # live indices are >= lo; the rest were -1
            self.window = collections.deque((i, p, a, s - lo, k) for i, p, a, s, k in self.window)
            self.n -= lo
        if 2 * (self.n + m) > self.link.size:  # keep half free: compactions stay rare
            size = max(2 * self.link.size, 2 * (self.n + m))
            if self.n + m >= NONE:
                raise OverflowError("more than 2^31 - 2 accesses in one lookahead window")
            size = min(size, NONE)
            grown = np.empty(size, dtype=np.int32)
            grown[:self.n] = self.link[:self.n]
            self.link = grown
            self._iota = np.arange(grown.size, dtype=np.int32)

    def holds(self, future: list[torch.Tensor]) -> bool:
        """Whether the window is `future` (synced to it, nothing left since)."""
        return len(future) == len(self.window) and all(
            self.key(f) == w[4] for f, w in zip(future, self.window))

    def used(self, pos: torch.Tensor | None = None) -> torch.Tensor:
        """Whether the window uses each node (of `pos`, or all)."""
        return torch.from_numpy((self.freq if pos is None else self.freq[_np(pos)]) != 0)

    def next_use_np(self, pos: np.ndarray) -> np.ndarray:
        """1 + the index in the window of the first minibatch using each node; len(window)+1
        where none does (numpy in, int64 numpy out)."""
        never = len(self.window) + 1
        if not self.window:
            return np.full(pos.shape, never, dtype=np.int64)
        nu = self._gather(pos)[:, _FIRST].astype(np.int64)
        nu -= self.window[0][2] - 1
        return np.minimum(nu, never, out=nu)

    def freq_np(self, pos: np.ndarray) -> np.ndarray:
        return self._gather(pos)[:, _FREQ].astype(np.int64)

    def next_use(self, pos: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.next_use_np(_np(pos)))

    def frequency(self, pos: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.freq_np(_np(pos)))


def _np(t) -> np.ndarray:
    """A tensor's numpy view (shared memory), an array as it is."""
    return t.numpy() if isinstance(t, torch.Tensor) else t


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
