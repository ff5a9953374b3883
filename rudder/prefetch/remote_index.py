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

Vectorised: lookups are one searchsorted over the sorted ids; an insert merges the new ids in
with one sort (O(U log U), U = ids held).
"""
from __future__ import annotations

import torch

_EMPTY = torch.empty(0, dtype=torch.int64)


class RemoteIndex:
    def __init__(self, max_nodes: int, initial: torch.Tensor | None = None):
        if max_nodes < 0:
            raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
        self.max_nodes = int(max_nodes)
        self.ids = torch.full((self.max_nodes,), -1, dtype=torch.int64)  # id at each position
        self._keys = _EMPTY  # the ids held, sorted
        self._pos = _EMPTY  # their positions
        if initial is not None and initial.numel():
            self.insert(initial)

    def __len__(self) -> int:
        return int(self._keys.numel())

    def lookup(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(known [n] bool, pos [n] int64; -1 where unknown)."""
        ids = ids.to(torch.int64)
        if not len(self):
            return torch.zeros(ids.numel(), dtype=torch.bool), torch.full_like(ids, -1)
        i = torch.searchsorted(self._keys, ids).clamp(max=len(self) - 1)
        known = self._keys[i] == ids
        return known, torch.where(known, self._pos[i], torch.full_like(ids, -1))

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
        new = torch.unique(ids[~known])
        evicted = _EMPTY
        if not new.numel():
            return pos, evicted
        free = torch.nonzero(self.ids < 0).flatten()
        need = new.numel() - free.numel()
        if need > 0:
            keep = torch.zeros(self.max_nodes, dtype=torch.bool)
            keep[pos[known]] = True  # asked now: stays
            if pinned is not None:
                keep |= pinned() if callable(pinned) else pinned
            cand = torch.nonzero((self.ids >= 0) & ~keep).flatten()
            if priority is not None and cand.numel() > need:  # the `need` lowest, unsorted
                cand = cand[torch.topk(priority[cand], need, largest=False, sorted=False).indices]
            evicted = cand[:need]
            self.ids[evicted] = -1
            free = torch.cat([free, evicted])
            gone = torch.zeros(self.max_nodes, dtype=torch.bool)
            gone[evicted] = True
            stay = ~gone.index_select(0, self._pos)
            self._keys, self._pos = self._keys[stay], self._pos[stay]
        take = min(new.numel(), free.numel())
        add, at = new[:take], free[:take]  # new is sorted: the smallest ids get room first
        self.ids[at] = add
        # merge the sorted new ids into the sorted keys (no sort of all held ids)
        U = self._keys.numel() + take
        dest = torch.searchsorted(self._keys, add) + torch.arange(take)
        old = torch.ones(U, dtype=torch.bool)
        old[dest] = False
        keys, kpos = torch.empty(U, dtype=torch.int64), torch.empty(U, dtype=torch.int64)
        keys[dest], kpos[dest] = add, at
        keys[old], kpos[old] = self._keys, self._pos
        self._keys, self._pos = keys, kpos
        # positions of the ids asked: known ones kept theirs; new ones from `add` (a small search)
        if take:
            j = torch.searchsorted(add, ids).clamp(max=take - 1)
            got = add[j] == ids
            pos = torch.where(~known & got, at[j], pos)
        return pos, evicted

    def verify(self) -> None:
        """Invariants (tests call it): keys sorted and unique, each key at its position."""
        held = torch.nonzero(self.ids >= 0).flatten()
        assert len(self) == held.numel() <= self.max_nodes
        assert torch.all(self._keys[1:] > self._keys[:-1])
        assert torch.equal(self.ids[self._pos], self._keys)
