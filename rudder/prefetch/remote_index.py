"""A bounded, dynamic index of remote node ids: the universe of a buffer beyond the 1-hop halo
(issue 17, must-have 3): HaloBuffer(universe="remote") finds its per-node state through it.

HaloBuffer keeps per-node state (slot, miss count) in arrays over the halo, found by a binary
search of the sorted halo ids. Every remote node a trainer samples (2+ hops included) cannot
be listed ahead, and all of them may be most of the graph, so this index hands out positions
0..max_nodes-1 to ids as they are first seen: per-node arrays of max_nodes rows then serve any
remote id, with bounded memory. When it is full, a new id takes the position of a known id the
caller lets go (not resident in the buffer), lowest priority first (e.g. the decayed miss
count: what is forgotten is what mattered least); the caller resets that position's state. An
id that finds no room is bypassed (a miss the buffer cannot keep), as a non-halo id is today.

Where every id lies in a known range [0, id_bound) (a trainer's graph node ids; a replay's dense
remote universe) that is not much larger than the index, the ids are found through a direct map
over that range (int32 position per id, -1: not held): a lookup is one gather. The rule: the map
when 4 x id_bound bytes are no more than the table below would take. Else, and where no bound is
given, through a bucketed hash table, all of it tensor ops over whole batches:
  _key [B, W]   the ids held, W per bucket (B a power of two >= max_nodes / 2: ~1-2 ids per
                bucket when full; a bucket's W = 8 keys are one 64-byte cache line)
  _val [B, W]   their positions (int32)
  _cell [max_nodes]  position -> its cell (bucket * W + column), -1: in the stash
A lookup gathers each id's bucket row and compares (a handful of ops, no search); an insert
gives the k-th new id of a bucket the k-th free column of that row (a cumsum over W). An id
whose bucket is full goes to a small sorted stash, searched only when it is not empty, so the
index stays correct whatever the ids (an unlucky id pattern degrades it to the sorted search
it replaced, BENCHMARKS.md §11). Memory: 12 bytes x B x W = 48-96 bytes per max_nodes id.

Positions are handed out exactly as before the table (the lowest free position first, the new
ids in ascending order, then evicted positions in eviction order), so every replay is the same
(tests/test_remote_index.py holds the sorted-array index as the reference). The free positions
are always len(self) .. max_nodes - 1, above the held ones: an insert takes the lowest free
ones, and one that evicts takes all of them first.
"""
from __future__ import annotations

import torch

_EMPTY = torch.empty(0, dtype=torch.int64)


class RemoteIndex:
    W = 8  # ids per bucket row

    def __init__(self, max_nodes: int, initial: torch.Tensor | None = None, id_bound: int | None = None):
        """`id_bound`: every id is in [0, id_bound) (the graph's node count; a replay's remote
        universe): when a direct map over that range takes no more memory than the table would,
        the index is the map (one gather per lookup; an id out of range raises IndexError)."""
        if max_nodes < 0:
            raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
        self.max_nodes = int(max_nodes)
        self.ids = torch.full((self.max_nodes,), -1, dtype=torch.int64)  # id at each position
        self._n = 0  # ids held: at positions 0..n-1
        nb = 1 << (max(1, self.max_nodes // 2) - 1).bit_length()  # buckets: a power of two
        self._skeys = _EMPTY  # the stash: ids whose bucket was full, sorted
        self._spos = _EMPTY  # their positions
        # the direct map: 4 bytes an id of the range, against the table's 12 x W a bucket
        self._map = (torch.full((int(id_bound),), -1, dtype=torch.int32)
                     if id_bound is not None and 0 <= id_bound <= 3 * self.W * nb else None)
        if self._map is None:
            self._bits = nb.bit_length() - 1
            self._mask = nb - 1
            self._key = torch.full((nb, self.W), -1, dtype=torch.int64)
            self._val = torch.full((nb, self.W), -1, dtype=torch.int32)
            self._kflat, self._vflat = self._key.view(-1), self._val.view(-1)
            self._cell = torch.full((self.max_nodes,), -1, dtype=torch.int64)
        if initial is not None and initial.numel():
            self.insert(initial)

    @property
    def direct(self) -> bool:
        """True: a direct map over [0, id_bound); False: the hash table."""
        return self._map is not None

    def __len__(self) -> int:
        return self._n

    def _bucket(self, ids: torch.Tensor) -> torch.Tensor:
        """Bucket of each id: its low bits folded with the higher ones (dense and partitioned id
        ranges spread evenly; ids need not be small)."""
        b = self._bits
        if b == 0:
            return torch.zeros_like(ids)
        return (ids ^ (ids >> b) ^ (ids >> (2 * b))) & self._mask

    def lookup(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(known [n] bool, pos [n] int64; -1 where unknown)."""
        ids = ids.to(torch.int64)
        if not self._n or not ids.numel():
            if self._map is not None and ids.numel():
                self._map.index_select(0, ids)  # an id out of range raises, whatever the fill
            return torch.zeros(ids.numel(), dtype=torch.bool), torch.full_like(ids, -1)
        if self._map is not None:
            pos = self._map.index_select(0, ids).long()
            return pos >= 0, pos
        bk = self._bucket(ids)
        eq = self._key.index_select(0, bk) == ids.unsqueeze(1)  # [n, W]: at most one match a row
        known, col = eq.max(1)
        pos = torch.where(known, self._vflat.index_select(0, bk * self.W + col).long(), -1)
        known = pos >= 0  # (an id of -1 matches an empty cell: never known)
        if self._skeys.numel():  # the stash (rarely anything in it)
            i = torch.searchsorted(self._skeys, ids).clamp_(max=self._skeys.numel() - 1)
            st = self._skeys.index_select(0, i) == ids
            if bool(st.any()):
                known = known | st
                pos = torch.where(st, self._spos.index_select(0, i), pos)
        return known, pos

    def insert(self, ids: torch.Tensor, priority: torch.Tensor | None = None,
               pinned=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions of `ids` [n] (known ones keep theirs; new ones get free positions, then those
        of evicted ids; -1 where no room is left), and the positions evicted (their state is the
        caller's to reset). `priority` [max_nodes]: evict the lowest first (default: any order);
        `pinned` [max_nodes] bool, or a function giving it (called only when an eviction is
        needed): never evict (e.g. resident in the buffer). The ids asked now
        are never evicted to make room for each other."""
        ids = ids.to(torch.int64)
        known, pos = self.lookup(ids)  # the one search of the held ids
        unknown = ~known
        asked = ids.masked_select(unknown)
        evicted = _EMPTY
        if not asked.numel():
            return pos, evicted
        if self._map is None and int(asked.min()) < 0:  # -1 marks an empty cell of the table
            raise ValueError("RemoteIndex holds node ids >= 0")
        new, inverse = torch.unique(asked, return_inverse=True)  # sorted: the smallest get room first
        free = torch.arange(self._n, self.max_nodes, dtype=torch.int64)  # the lowest free first
        need = new.numel() - free.numel()
        if need > 0:
            keep = torch.zeros(self.max_nodes, dtype=torch.bool)
            keep.index_fill_(0, pos.masked_select(known), True)  # asked now: stays
            if pinned is not None:
                keep |= pinned() if callable(pinned) else pinned
            cand = torch.nonzero((self.ids >= 0) & ~keep).flatten()
            if priority is not None and cand.numel() > need:  # the `need` lowest, unsorted
                cand = cand[torch.topk(priority[cand], need, largest=False, sorted=False).indices]
            evicted = cand[:need]
            self._remove(evicted)
            free = torch.cat([free, evicted])
        take = min(new.numel(), free.numel())
        if take:
            add, at = new[:take], free[:take]
            self._place(add, at)
            self.ids.index_copy_(0, at, add)
            # the new ids' positions, by unique's inverse (-1 beyond `take`: no room)
            got = at.index_select(0, inverse.clamp(max=take - 1))
            pos = pos.masked_scatter(unknown, torch.where(inverse < take, got, -1))
        self._n += take - evicted.numel()
        return pos, evicted

    def _remove(self, evicted: torch.Tensor) -> None:
        """Forgets the ids at positions `evicted` (their table cells or stash entries)."""
        if not evicted.numel():
            return
        if self._map is not None:
            self._map.index_fill_(0, self.ids.index_select(0, evicted), -1)
            self.ids.index_fill_(0, evicted, -1)
            return
        cell = self._cell.index_select(0, evicted)
        in_table = cell >= 0
        cell = cell.masked_select(in_table)
        self._kflat.index_fill_(0, cell, -1)
        self._vflat.index_fill_(0, cell, -1)
        if self._skeys.numel() and not bool(in_table.all()):
            gone = torch.zeros(self.max_nodes, dtype=torch.bool)
            gone.index_fill_(0, evicted, True)
            stay = ~gone.index_select(0, self._spos)
            self._skeys, self._spos = self._skeys[stay], self._spos[stay]
        self._cell.index_fill_(0, evicted, -1)
        self.ids.index_fill_(0, evicted, -1)

    def _place(self, add: torch.Tensor, at: torch.Tensor) -> None:
        """Puts the new ids `add` (unique, none held) at positions `at` into the table: the k-th
        new id of a bucket takes the k-th free column of its row; a full row sends it to the
        stash."""
        if self._map is not None:
            self._map.index_copy_(0, add, at.to(torch.int32))
            return
        bk = self._bucket(add)
        bk, order = torch.sort(bk, stable=True)
        add, at = add.index_select(0, order), at.index_select(0, order)
        rank = torch.arange(bk.numel()) - torch.searchsorted(bk, bk)  # k-th new id of its bucket
        free = self._key.index_select(0, bk) < 0  # [m, W]
        ok, col = (free & (free.cumsum(1) == (rank + 1).unsqueeze(1))).max(1)
        cell = bk * self.W + col
        if not bool(ok.all()):  # bucket full: the stash, kept sorted
            over = ~ok
            sk = torch.cat([self._skeys, add.masked_select(over)])
            sp = torch.cat([self._spos, at.masked_select(over)])
            o = torch.argsort(sk)
            self._skeys, self._spos = sk.index_select(0, o), sp.index_select(0, o)
            add, at, cell = add.masked_select(ok), at.masked_select(ok), cell.masked_select(ok)
        self._kflat.index_copy_(0, cell, add)
        self._vflat.index_copy_(0, cell, at.to(torch.int32))
        self._cell.index_copy_(0, at, cell)

    def verify(self) -> None:
        """Invariants (tests call it): ids held at positions 0..len-1, each found at its
        position, each in the table or the stash once."""
        held = torch.nonzero(self.ids >= 0).flatten()
        assert len(self) == held.numel() <= self.max_nodes
        assert torch.equal(held, torch.arange(len(self)))  # the free positions are the top ones
        known, pos = self.lookup(self.ids[:len(self)])
        assert bool(known.all()) and torch.equal(pos, torch.arange(len(self)))
        if self._map is not None:
            assert int((self._map >= 0).sum()) == len(self)
            return
        in_table = int((self._key >= 0).sum())
        assert in_table + self._skeys.numel() == len(self)
        assert int((self._cell >= 0).sum()) == in_table
        assert torch.all(self._skeys[1:] > self._skeys[:-1])
