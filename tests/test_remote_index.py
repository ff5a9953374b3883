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
