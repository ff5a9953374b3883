"""RemoteIndex: positions for remote ids seen so far, bounded; eviction lowest priority first,
never pinned nor asked ids; checked on exact small cases and against its invariants on random
sequences."""
from __future__ import annotations

import pytest
import torch

from rudder.prefetch.remote_index import RemoteIndex

T = lambda *x: torch.tensor(x, dtype=torch.int64)  # noqa: E731


def test_insert_then_lookup_keeps_positions():
    ix = RemoteIndex(4)
    pos, ev = ix.insert(T(30, 10, 30))
    assert pos.tolist()[0] == pos.tolist()[2] and sorted(pos.tolist()[:2]) == [0, 1]
    assert ev.numel() == 0 and len(ix) == 2
    again, _ = ix.insert(T(10, 50))
    assert again[0] == pos[1] and again[1] not in pos.tolist()
    known, p = ix.lookup(T(50, 10, 99))
    assert known.tolist() == [True, True, False] and p[2] == -1
    ix.verify()


def test_full_index_evicts_the_lowest_priority_unpinned_id():
    ix = RemoteIndex(3, initial=T(10, 20, 30))
    _, (p10, p20, p30) = ix.lookup(T(10, 20, 30))
    prio = torch.zeros(3)
    prio[p10], prio[p20], prio[p30] = 0.5, 0.1, 0.9
    pinned = torch.zeros(3, dtype=torch.bool)
    pos, ev = ix.insert(T(40), prio, pinned)
    assert ev.tolist() == [int(p20)] and pos.tolist() == [int(p20)]  # 40 takes 20's position
    assert ix.lookup(T(20))[0].tolist() == [False]
    # 10 is now the lowest, but pinned (resident): 30 goes
    pinned[p10] = True
    prio[p20] = 1.0  # 40's
    pos, ev = ix.insert(T(50), prio, pinned)
    assert ev.tolist() == [int(p30)] and ix.lookup(T(10, 30))[0].tolist() == [True, False]
    ix.verify()


def test_no_room_bypasses_and_asked_ids_stay():
    ix = RemoteIndex(2, initial=T(1, 2))
    pinned = torch.tensor([True, False])
    # 2 is asked in the same call: it is not evicted for 3; 3 finds no room
    pos, ev = ix.insert(T(2, 3), torch.zeros(2), pinned)
    assert ev.numel() == 0 and pos[1] == -1 and pos[0] >= 0
    assert RemoteIndex(0).insert(T(5))[0].tolist() == [-1]
    with pytest.raises(ValueError, match="max_nodes must be >= 0, got -1"):
        RemoteIndex(-1)


@pytest.mark.parametrize("seed", range(5))
def test_random_sequences_keep_the_invariants(seed):
    g = torch.Generator().manual_seed(seed)
    cap = 50
    ix = RemoteIndex(cap)
    where: dict[int, int] = {}  # id -> position, as the index said
    for _ in range(40):
        ids = torch.randint(0, 200, (30,), generator=g)
        prio = torch.rand(cap, generator=g)
        pinned = torch.rand(cap, generator=g) < 0.3
        before = ix.ids.clone()
        pos, ev = ix.insert(ids, prio, pinned)
        ix.verify()
        asked = set(ids.tolist())
        assert not pinned[ev].any()  # never a pinned position
        assert not set(before[ev].tolist()) & asked  # never an id asked now
        if ev.numel():  # the evicted are the lowest-priority candidates
            kept = (before >= 0) & ~pinned
            kept[ev] = False
            kept &= ~torch.isin(before, ids)
            assert prio[ev].max() <= prio[kept].min() if kept.any() else True
        for i, p in zip(ids.tolist(), pos.tolist()):
            if p >= 0:
                assert ix.ids[p] == i
                if i in where and where[i] not in ev.tolist():
                    assert where[i] == p  # a known id keeps its position
                where[i] = p
        for gone in before[ev].tolist():
            where.pop(gone, None)
        # room was taken whenever any existed: a bypassed id means no free or evictable slot
        if (pos < 0).any():
            assert (ix.ids >= 0).all()


def test_pinned_may_be_a_function_called_only_when_an_eviction_is_needed():
    calls = []

    def pinned():
        calls.append(1)
        m = torch.zeros(3, dtype=torch.bool)
        m[idx.lookup(torch.tensor([5]))[1]] = True  # id 5 stays
        return m

    idx = RemoteIndex(3)
    idx.insert(torch.tensor([5, 6, 7]), pinned=pinned)
    assert not calls  # room enough: not called
    pos, evicted = idx.insert(torch.tensor([8]), torch.tensor([0.0, 1.0, 2.0]), pinned=pinned)
    assert calls and evicted.numel() == 1
    known, _ = idx.lookup(torch.tensor([5, 8]))
    assert bool(known.all()) and int(pos[0]) == int(evicted[0])
    idx.verify()


class SortedIndex:
    """The index as it was before the hash table (commit 0638da8): sorted ids searched with
    searchsorted, new ids merged in. The reference for the positions the table hands out."""

    def __init__(self, max_nodes: int):
        self.max_nodes = max_nodes
        self.ids = torch.full((max_nodes,), -1, dtype=torch.int64)
        self._keys = self._pos = torch.empty(0, dtype=torch.int64)

    def __len__(self):
        return int(self._keys.numel())

    def lookup(self, ids):
        ids = ids.to(torch.int64)
        if not len(self):
            return torch.zeros(ids.numel(), dtype=torch.bool), torch.full_like(ids, -1)
        i = torch.searchsorted(self._keys, ids).clamp(max=len(self) - 1)
        known = self._keys[i] == ids
        return known, torch.where(known, self._pos[i], torch.full_like(ids, -1))

    def insert(self, ids, priority=None, pinned=None):
        ids = ids.to(torch.int64)
        known, pos = self.lookup(ids)
        new = torch.unique(ids[~known])
        evicted = torch.empty(0, dtype=torch.int64)
        if not new.numel():
            return pos, evicted
        free = torch.nonzero(self.ids < 0).flatten()
        need = new.numel() - free.numel()
        if need > 0:
            keep = torch.zeros(self.max_nodes, dtype=torch.bool)
            keep[pos[known]] = True
            if pinned is not None:
                keep |= pinned() if callable(pinned) else pinned
            cand = torch.nonzero((self.ids >= 0) & ~keep).flatten()
            if priority is not None and cand.numel() > need:
                cand = cand[torch.topk(priority[cand], need, largest=False, sorted=False).indices]
            evicted = cand[:need]
            self.ids[evicted] = -1
            free = torch.cat([free, evicted])
            stay = ~torch.isin(self._pos, evicted)
            self._keys, self._pos = self._keys[stay], self._pos[stay]
        take = min(new.numel(), free.numel())
        add, at = new[:take], free[:take]
        self.ids[at] = add
        keys, kpos = torch.cat([self._keys, add]), torch.cat([self._pos, at])
        o = torch.argsort(keys)
        self._keys, self._pos = keys[o], kpos[o]
        if take:
            j = torch.searchsorted(add, ids).clamp(max=take - 1)
            pos = torch.where(~known & (add[j] == ids), at[j], pos)
        return pos, evicted

    def verify(self):
        pass


class NarrowIndex(RemoteIndex):
    W = 1  # one id per bucket: collisions all the time, so the stash is used and emptied

    def __init__(self, max_nodes, initial=None, id_bound=None):
        super().__init__(max_nodes, initial)  # never the direct map


class TableIndex(RemoteIndex):
    def __init__(self, max_nodes, initial=None, id_bound=None):
        super().__init__(max_nodes, initial)  # the hash table even where a bound is known


def direct_index(max_nodes):
    ix = RemoteIndex(max_nodes, id_bound=300)
    assert ix.direct
    return ix


def test_the_direct_map_is_taken_only_where_it_is_no_larger_than_the_table():
    assert RemoteIndex(1000, id_bound=12_000).direct  # 512 buckets x 8 x 3
    assert not RemoteIndex(1000, id_bound=12_289).direct and not RemoteIndex(1000).direct
    with pytest.raises(IndexError):
        RemoteIndex(10, id_bound=100).insert(T(5, 100))
    with pytest.raises(IndexError):
        RemoteIndex(10, id_bound=100).lookup(T(-1))
    table = RemoteIndex(10, initial=T(3))
    assert table.lookup(T(-1, 3))[0].tolist() == [False, True]  # -1 is an empty cell's mark
    with pytest.raises(ValueError, match="node ids >= 0"):
        table.insert(T(-1))


# ids dense (0..299) or spread over 2^40; the direct map takes ids in [0, id_bound) only
INDEX_SPACES = [pytest.param(cls, space, id=f"{name}-{sname}")
                for cls, name in ((TableIndex, "table"), (NarrowIndex, "stash"), (direct_index, "direct"))
                for space, sname in ((300, "dense"), (1 << 40, "wide"))
                if not (cls is direct_index and space > 300)]


@pytest.mark.parametrize("cls, space", INDEX_SPACES)
@pytest.mark.parametrize("seed", range(4))
def test_the_table_hands_out_the_positions_of_the_sorted_index(cls, space, seed):
    """Random inserts (duplicates, evictions by priority with ties, pinned positions, a full
    index that bypasses) and lookups: the same positions, evictions and ids as the sorted
    index, step by step."""
    g = torch.Generator().manual_seed(seed)
    cap = 64
    pool = torch.randint(0, space, (300,), generator=g) if space > 300 else torch.arange(300)
    a, b = cls(cap), SortedIndex(cap)
    for step in range(60):
        ids = pool[torch.randint(0, pool.numel(), (int(torch.randint(1, 50, (1,), generator=g)),), generator=g)]
        prio = torch.randint(0, 4, (cap,), generator=g).double()  # ties: topk decides, in both
        pinned = torch.rand(cap, generator=g) < 0.4
        args = (prio, pinned) if step % 3 else ()
        pa, ea = a.insert(ids, *args)
        pb, eb = b.insert(ids, *args)
        assert torch.equal(pa, pb) and torch.equal(ea, eb) and torch.equal(a.ids, b.ids), step
        assert len(a) == len(b)
        a.verify()
        q = pool[torch.randint(0, pool.numel(), (40,), generator=g)]
        ka, qa = a.lookup(q)
        kb, qb = b.lookup(q)
        assert torch.equal(ka, kb) and torch.equal(qa, qb)
    if cls is NarrowIndex:
        assert a._skeys.numel()  # one-id buckets overflow into the stash


@pytest.mark.parametrize("cls,spec,max_nodes", [
    (SortedIndex, "lookahead", None), (SortedIndex, "lookahead", 400), (SortedIndex, "lookahead:8:0.1:any", 400),
    (SortedIndex, "fixed:10:0.5", 400), (TableIndex, "lookahead", 400), (NarrowIndex, "lookahead", 400)],
    ids=["sorted-lookahead", "sorted-lookahead-400", "sorted-any-400", "sorted-fixed-400", "table-lookahead-400",
         "stash-lookahead-400"])
def test_remote_universe_replays_are_those_of_the_sorted_index(monkeypatch, cls, spec, max_nodes):
    """A remote-universe replay (through the direct map: the replay knows its id range) counts
    the same hits, misses and rows, minibatch by minibatch, as through the sorted index it
    replaced, the hash table, and a table that sends most ids to its stash."""
    import numpy as np

    from rudder.config import PrefetchConfig  # noqa: F401
    from rudder.prefetch import buffer
    from rudder.sim.simulate import PolicySpec, parse_policy, simulate
    from rudder.sim.tracegen import random_trace

    t = random_trace(halo=300, minibatches=60, batch=120, nonhalo=0.4, capacity=0.25, skew=0.6, epochs=2, seed=4)
    p = parse_policy(spec)
    p = PolicySpec(p.spec, p.base, p.prefetch.model_copy(update=dict(universe="remote", universe_max_nodes=max_nodes)))
    new = simulate(t, p, verify=True)
    monkeypatch.setattr(buffer, "RemoteIndex", lambda n, id_bound=None: cls(n))
    ref = simulate(t, p, verify=True)
    for k in ("hits", "misses", "fetched_rows", "replaced_rows", "admitted_rows"):
        assert np.array_equal(new.counts[k], ref.counts[k]), k
    assert new.total("hits") > 0
