"""Classic caches over the same traces and capacity as the halo buffer: LRU, LFU, S3-FIFO, SIEVE.

One interface, libCacheSim style: `Cache.access` (hit / miss / insert / evict) is written once
here; a policy only keeps its metadata in three hooks (`_on_hit`, `_on_insert`, `_on_evict`) and
chooses victims (`_victims`); `verify()` checks the invariants (tests call it after every step).

Items are halo positions 0..H-1 (only halo nodes are cacheable). Metadata lives in numpy arrays
indexed by item, so a minibatch is a handful of whole-array operations (no per-node loop).

Batched model, the same as the buffer and the oracle: minibatch t asks for a set of items; a hit
is an item resident *before* t (all lookups happen first, as when a minibatch's features are
assembled in one go). Then t's misses are admitted (their rows were pulled anyway: no extra
rows): the policy first evicts as many old residents as the newcomers need room for, then the
newcomers go in, in the minibatch's order (so a minibatch of single accesses is exactly the
classic one-access-at-a-time policy). A minibatch with more misses than the capacity empties the
cache and keeps its last `capacity` misses. Logical time advances one tick per access.
"""
from __future__ import annotations

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class Cache:
    name = "base"

    def __init__(self, capacity: int, num_items: int):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = int(capacity)
        self.num_items = int(num_items)
        self.resident = np.zeros(self.num_items, dtype=bool)
        self.res = _EMPTY  # resident items (order is the policy's business, not meaningful here)
        self.clock = 0  # logical time: one tick per access
        self.evictions = 0
        self.admitted = 0  # items the last access() admitted

    # ---- the one access path --------------------------------------------------------------
    def access(self, req: np.ndarray) -> int:
        """One minibatch of unique items; returns its hits."""
        req = np.asarray(req, dtype=np.int64)
        times = self.clock + np.arange(req.size, dtype=np.int64)
        self.clock += req.size
        hm = self.resident[req]
        self.admitted = 0
        if hm.any():
            self._on_hit(req[hm], times[hm])
        if self.capacity > 0 and not hm.all():
            self._admit(req[~hm], times[~hm])
        return int(np.count_nonzero(hm))

    def fill(self, items: np.ndarray) -> None:
        """Initial contents, oldest first (as if accessed in this order before the trace)."""
        items = np.asarray(items, dtype=np.int64)
        _, first = np.unique(items, return_index=True)
        items = items[np.sort(first)][: self.capacity]
        items = items[~self.resident[items]]
        if items.size:
            self._admit(items, self.clock + np.arange(items.size, dtype=np.int64))
            self.clock += items.size

    def _admit(self, items: np.ndarray, times: np.ndarray) -> None:
        if items.size > self.capacity:  # keep the last `capacity` of them
            items, times = items[-self.capacity :], times[-self.capacity :]
        self._on_miss(items)
        self.admitted = int(items.size)
        n = self.res.size + items.size - self.capacity
        if n > 0:
            v = self._victims(min(n, self.res.size))
            gone = self.res[v]
            keep = np.ones(self.res.size, dtype=bool)
            keep[v] = False
            self.res = self.res[keep]
            self.resident[gone] = False
            self.evictions += gone.size
            self._on_evict(gone)
        self._on_insert(items, times)
        self.resident[items] = True
        self.res = np.concatenate([self.res, items])

    # ---- what a policy provides -----------------------------------------------------------
    def _on_hit(self, items: np.ndarray, times: np.ndarray) -> None:
        pass

    def _on_miss(self, items: np.ndarray) -> None:
        """Misses about to be admitted, before any eviction makes room for them."""

    def _on_insert(self, items: np.ndarray, times: np.ndarray) -> None:
        pass

    def _on_evict(self, items: np.ndarray) -> None:
        pass

    def _victims(self, n: int) -> np.ndarray:
        """Indices into self.res of exactly n distinct old residents to evict, 0 < n <= len(res)."""
        raise NotImplementedError

    def _verify(self) -> None:
        pass

    # ---- invariants -----------------------------------------------------------------------
    def verify(self) -> None:
        assert self.res.size <= self.capacity, "over capacity"
        assert np.unique(self.res).size == self.res.size, "an item is resident twice"
        assert int(self.resident.sum()) == self.res.size, "resident mask and list disagree"
        assert bool(self.resident[self.res].all()), "resident mask and list disagree"
        self._verify()

    @property
    def size(self) -> int:
        return int(self.res.size)

    def contents(self) -> np.ndarray:
        return np.sort(self.res)


def _smallest(key: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n smallest keys (keys are distinct where it matters)."""
    if n >= key.size:
        return np.arange(key.size)
    return np.argpartition(key, n - 1)[:n]


class LRU(Cache):
    """Evicts the least recently used (a minibatch's hits are used at their position in it)."""

    name = "lru"

    def __init__(self, capacity: int, num_items: int):
        super().__init__(capacity, num_items)
        self.last = np.zeros(num_items, dtype=np.int64)

    def _on_hit(self, items, times):
        self.last[items] = times

    _on_insert = _on_hit

    def _victims(self, n):
        return _smallest(self.last[self.res], n)


class LFU(Cache):
    """Evicts the least frequently used (frequency counted while resident, from 1 at admission;
    forgotten on eviction, as libCacheSim's LFU), ties by least recent use."""

    name = "lfu"

    def __init__(self, capacity: int, num_items: int):
        super().__init__(capacity, num_items)
        self.freq = np.zeros(num_items, dtype=np.int64)
        self.last = np.zeros(num_items, dtype=np.int64)

    def _on_hit(self, items, times):
        self.freq[items] += 1  # items are unique within a minibatch
        self.last[items] = times

    def _on_insert(self, items, times):
        self.freq[items] = 1
        self.last[items] = times

    def _on_evict(self, items):
        self.freq[items] = 0

    def _victims(self, n):
        r = self.res
        return _smallest((self.freq[r] << 40) | self.last[r], n)  # times < 2^40

    def _verify(self):
        assert bool((self.freq[self.res] >= 1).all())


class SIEVE(Cache):
    """SIEVE (NSDI '24): one FIFO queue (new items at the head), a visited bit set on a hit and
    a hand that sweeps from the tail toward the head, clearing visited bits and evicting the
    first unvisited item; it stays where it stopped. A minibatch's n evictions are one sweep
    (wrapping around, so a second lap finds everything cleared), then the newcomers go in at
    the head."""

    name = "sieve"

    def __init__(self, capacity: int, num_items: int):
        super().__init__(capacity, num_items)
        self.visited = np.zeros(num_items, dtype=bool)
        self.seq = np.zeros(num_items, dtype=np.int64)  # queue position: larger = nearer the head
        self.hand = -1  # item the next sweep starts at; -1 = the tail

    def _on_hit(self, items, times):
        self.visited[items] = True

    def _on_insert(self, items, times):
        self.seq[items] = times
        self.visited[items] = False

    def _victims(self, n):
        N = self.res.size
        if n >= N:
            self.hand = -1
            return np.arange(N)
        order = np.argsort(self.seq[self.res], kind="stable")  # tail (oldest) first
        q = self.res[order]
        start = 0
        if self.hand >= 0 and self.resident[self.hand]:
            start = int(np.searchsorted(self.seq[q], self.seq[self.hand]))
        ring = np.concatenate([np.arange(start, N), np.arange(0, start)])  # positions in q
        v = self.visited[q[ring]]
        unv = np.flatnonzero(~v)
        if unv.size >= n:  # one partial lap: clear the visited items passed on the way
            vic = unv[:n]
            last = int(vic[-1])
            passed = ring[:last][v[:last]]
            self.visited[q[passed]] = False
        else:  # a full lap clears every bit; the second lap evicts in queue order
            self.visited[q[ring[v]]] = False
            vis = np.flatnonzero(v)
            vic = np.concatenate([unv, vis[: n - unv.size]])
            last = int(vis[n - unv.size - 1])
        gone = np.zeros(N, dtype=bool)
        gone[vic] = True
        after = np.flatnonzero(~gone[last + 1 :])
        nxt = last + 1 + int(after[0]) if after.size else int(np.flatnonzero(~gone)[0])
        self.hand = int(q[ring[nxt]])
        return order[ring[vic]]

    def _verify(self):
        assert self.hand < 0 or self.resident[self.hand] or self.size == 0, "hand off the queue"


class S3FIFO(Cache):
    """S3-FIFO (SOSP '23), as libCacheSim's S3FIFO.c: a small FIFO S (10% of capacity, at least
    one slot), a main FIFO M (the rest) run as a CLOCK with a 2-bit counter, and a ghost FIFO G
    of ids (90% of capacity). A miss goes to M if its id is in G (and leaves G), else to S
    (before the first eviction, to M once S is full). A hit adds 1 to its counter (max 3).
    Each eviction: if M is over its size or S is empty, M's tail is evicted if its counter is
    0, else re-inserted at M's head with counter-1 (repeat); otherwise S's tail moves to M (counter
    reset to 0) if its counter >= 2, else goes to G and is evicted (repeat until one is).

    Batched: a minibatch's n evictions run as the sequence above, computed in closed form (how
    many S-tail steps happen between M evictions), before its misses enter S/M; all M evictions
    of the minibatch run after its S steps, so an item moved to M and an item re-inserted at
    M's head in the same minibatch may be ordered differently at M's head than one at a time."""

    name = "s3fifo"
    MOVE_TO_MAIN = 2  # libCacheSim's move-to-main-threshold
    MAX_FREQ = 3

    def __init__(self, capacity: int, num_items: int, small_ratio: float = 0.10, ghost_ratio: float = 0.90):
        super().__init__(capacity, num_items)
        self.s_cap = max(1, int(capacity * small_ratio)) if capacity else 0
        self.m_cap = capacity - self.s_cap
        self.g_cap = int(capacity * ghost_ratio)
        self.queue = np.zeros(num_items, dtype=np.int8)  # 0 none, 1 small, 2 main
        self.freq = np.zeros(num_items, dtype=np.int8)
        self.seq = np.zeros(num_items, dtype=np.int64)  # position in its queue: larger = nearer head
        self.next_seq = 0
        self.in_ghost = np.zeros(num_items, dtype=bool)
        self.ghost = _EMPTY  # ghost ids, oldest first
        self.has_evicted = False

    def _stamp(self, items: np.ndarray) -> None:
        self.seq[items] = self.next_seq + np.arange(items.size)
        self.next_seq += items.size

    def _on_hit(self, items, times):
        self.freq[items] = np.minimum(self.freq[items] + 1, self.MAX_FREQ)

    def _on_miss(self, items):
        # the ghost is checked (and the id leaves it) at lookup time, before evictions refill it
        self._ghost_hit = self.in_ghost[items]
        if self._ghost_hit.any():
            self.in_ghost[items] = False
            self.ghost = self.ghost[self.in_ghost[self.ghost]]

    def _on_insert(self, items, times):
        g = getattr(self, "_ghost_hit", None)
        g = np.zeros(items.size, dtype=bool) if g is None or g.size != items.size else g
        self._ghost_hit = None
        to_main = items[g]
        to_small = items[~g]
        if not self.has_evicted:  # libCacheSim: before any eviction, S full -> straight to M
            room = max(0, self.s_cap - int(np.count_nonzero(self.queue[self.res] == 1)))
            to_main = np.concatenate([to_main, to_small[room:]])
            to_small = to_small[:room]
        self.queue[to_small] = 1
        self.queue[to_main] = 2
        self.freq[items] = 0
        self._stamp(items)  # in minibatch order, S and M share the counter

    def _on_evict(self, items):
        self.queue[items] = 0
        self.freq[items] = 0

    def _victims(self, n):
        self.has_evicted = True
        r = self.res
        qr = self.queue[r]
        s_idx = np.flatnonzero(qr == 1)
        s_idx = s_idx[np.argsort(self.seq[r[s_idx]], kind="stable")]  # S, tail first
        m_idx = np.flatnonzero(qr == 2)
        m_idx = m_idx[np.argsort(self.seq[r[m_idx]], kind="stable")]  # M, tail first
        sf = self.freq[r[s_idx]]
        promo = sf >= self.MOVE_TO_MAIN
        if n >= r.size:  # everything goes; S's tail items that would not move go to the ghost
            self._to_ghost(r[s_idx[~promo]])
            return np.arange(r.size)
        g_at = np.flatnonzero(~promo)  # S positions that go to the ghost, in scan order
        G = g_at.size
        M0 = m_idx.size
        # S step j (1-based) consumes S up to g_at[j-1]; P(j) = moves to M in steps 1..j.
        # Before S step j, M evictions so far = E(j-1) = max(0, M0 + P(j-1) - m_cap).
        j = np.arange(1, G + 1)
        P = np.concatenate([[0], g_at - np.arange(G)])  # P(0..G)
        E = np.maximum(0, M0 + P - self.m_cap)  # E(0..G)
        J = int(np.searchsorted(E[:-1] + j, n, side="right"))  # S steps that happen
        if J < G:
            consumed = int(g_at[J - 1]) + 1 if J else 0
        else:  # every ghost-bound S item went; the rest of S (all to-move) moves iff still needed
            consumed = int(g_at[G - 1]) + 1 if G else 0
            if n > G + int(E[G]):
                consumed = s_idx.size
        cons = s_idx[:consumed]
        moved = cons[promo[:consumed]]
        ghosted = cons[~promo[:consumed]]
        # S -> M (counter reset), appended at M's head in scan order
        mi = r[moved]
        self.queue[mi] = 2
        self.freq[mi] = 0
        self._stamp(mi)
        m_all = np.concatenate([m_idx, moved])
        k = n - ghosted.size  # M evictions
        m_vic = self._clock_evict(m_all, k) if k > 0 else _EMPTY
        self._to_ghost(r[ghosted])
        return np.concatenate([ghosted, m_vic])

    def _to_ghost(self, items: np.ndarray) -> None:
        """Evicted from S go to G (oldest first); G keeps its newest g_cap ids."""
        if self.g_cap <= 0 or items.size == 0:
            return
        self.ghost = np.concatenate([self.ghost, items])
        self.in_ghost[items] = True
        if self.ghost.size > self.g_cap:
            drop = self.ghost[: self.ghost.size - self.g_cap]
            self.in_ghost[drop] = False
            self.ghost = self.ghost[self.ghost.size - self.g_cap :]

    def _clock_evict(self, m_all: np.ndarray, k: int) -> np.ndarray:
        """k evictions of the M clock over M (indices into res, tail first), in closed form:
        lap p evicts the items whose counter was p (earlier laps took every counter < p), each
        lap decrementing the survivors and re-inserting them at the head in the same order."""
        items = self.res[m_all]
        f = self.freq[items].astype(np.int64)
        if k >= f.size:
            return m_all
        cum = np.cumsum(np.bincount(f, minlength=self.MAX_FREQ + 1))
        p = int(np.searchsorted(cum, k))  # the lap in which the k-th eviction happens
        before = int(cum[p - 1]) if p else 0
        last = int(np.flatnonzero(f == p)[k - before - 1])
        vic = f < p
        eq = np.flatnonzero(f == p)[: k - before]
        vic[eq] = True
        surv = ~vic
        pos = np.arange(f.size)
        examined = surv & (pos < last)  # passed in lap p too: one more decrement, to the head
        self.freq[items[surv]] = (f[surv] - p - examined[surv]).astype(np.int8)
        self._stamp(items[examined])
        return m_all[vic]

    def _verify(self):
        q = self.queue[self.res]
        assert bool(((q == 1) | (q == 2)).all()), "a resident item in no queue"
        assert int(np.count_nonzero(self.queue)) == self.size, "a queue holds a non-resident item"
        assert bool(((self.freq[self.res] >= 0) & (self.freq[self.res] <= self.MAX_FREQ)).all())
        assert not bool(self.in_ghost[self.res].any()), "a resident item in the ghost"
        assert self.ghost.size <= max(self.g_cap, 0) and int(self.in_ghost.sum()) == self.ghost.size


CACHES: dict[str, type[Cache]] = {c.name: c for c in (LRU, LFU, S3FIFO, SIEVE)}


def make_cache(name: str, capacity: int, num_items: int) -> Cache:
    if name not in CACHES:
        raise ValueError(f"unknown cache policy {name!r}; valid: {', '.join(sorted(CACHES))}")
    return CACHES[name](capacity, num_items)
