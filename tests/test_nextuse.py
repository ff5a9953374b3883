"""The lookahead round's incremental next use (issue 17) against the computation from scratch,
and the buffer's reused scratch tensors."""
from __future__ import annotations

import random

import pytest
import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.nextuse import WindowNextUse, next_use_scratch
from rudder.prefetch.policy import Replace
from rudder.prefetch.step import begin_step, finish_step


def _minibatch(rng: random.Random, H: int, size: int) -> torch.Tensor:
    return torch.tensor(sorted(rng.sample(range(H), size)), dtype=torch.int64)


def _windows(rng: random.Random, H: int, n: int, max_depth: int):
    """Windows as training and replay make them, and as they should not: a slide by one (the
    usual), rounds skipped (slides by several), an epoch's end (the window shrinks), a new epoch
    (none kept), a depth change, a copy of a minibatch (other storage: not the same one)."""
    stream = [_minibatch(rng, H, rng.randint(0, H // 2)) for _ in range(n + max_depth)]
    g, depth = 0, max_depth
    while g < n:
        event = rng.random()
        if event < 0.1:
            depth = rng.randint(1, max_depth)
        if event < 0.05:
            yield [t.clone() for t in stream[g + 1:g + 1 + depth]]
        elif event < 0.15:
            yield stream[g + 1:g + 1 + rng.randint(0, depth)]  # end of an epoch
        else:
            yield stream[g + 1:g + 1 + depth]
        g += 1 if rng.random() < 0.8 else rng.randint(2, 12)


@pytest.mark.parametrize("seed,H,max_depth", [(0, 50, 8), (1, 200, 3), (2, 30, 62), (3, 5, 1), (4, 40, 100)])
def test_incremental_next_use_equals_the_scratch_computation(seed, H, max_depth):
    rng = random.Random(seed)
    nu = WindowNextUse(H)
    every = torch.arange(H)
    for future in _windows(rng, H, 300, max_depth):
        nu.sync(future, lambda ids: ids)  # ids are positions here
        want_next, want_freq = next_use_scratch(list(future), H)
        assert torch.equal(nu.next_use(every), want_next)
        assert torch.equal(nu.frequency(every), want_freq)
        assert torch.equal(nu.used(), want_next <= len(future))
    assert nu.count > 62  # more minibatches than the old per-node ring of 62 bits held


def test_a_window_of_any_length_is_kept():  # the old 62-minibatch bound is gone (a whole epoch)
    stream = [torch.tensor([g % 4]) for g in range(300)]
    nu = WindowNextUse(4)
    for g in range(0, 300, 7):
        nu.sync(stream[g:], lambda ids: ids)  # the rest of the "epoch": only the front leaves
        want_next, want_freq = next_use_scratch(stream[g:], 4)
        assert torch.equal(nu.next_use(torch.arange(4)), want_next)
        assert torch.equal(nu.frequency(torch.arange(4)), want_freq)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_rows_survive_growth_compaction_and_copies(seed):
    """Minibatches large against the link array (it grows and compacts many times), windows that
    slide, skip and restart, and a deep copy (a forked replayer's) stepped beside the original:
    next use and frequency equal the scratch computation's at every step, in both."""
    import copy

    rng = random.Random(seed)
    H = 3000
    stream = [_minibatch(rng, H, rng.randint(0, 1500)) for _ in range(80)]
    nu = WindowNextUse(H)
    twin = None
    every = torch.arange(H)
    g = 0
    while g < 70:
        depth = rng.choice([8, 8, 8, 3, 1, 10])
        future = stream[g + 1:g + 1 + depth]
        for w in (nu, twin) if twin is not None else (nu,):
            w.sync(future, lambda ids: ids)
            want_next, want_freq = next_use_scratch(list(future), H)
            assert torch.equal(w.next_use(every), want_next)
            assert torch.equal(w.frequency(every), want_freq)
            assert torch.equal(w.used(), want_next <= len(future))
        if g == 20:
            twin = copy.deepcopy(nu)
        g += 1 if rng.random() < 0.85 else rng.randint(2, 9)
    assert nu.link.size > 1024  # it grew


def test_numpy_and_torch_positions_give_the_same_answers():
    nu = WindowNextUse(10)
    nu.sync([torch.tensor([3, 1]), torch.tensor([1, 7])], lambda ids: ids)
    pos = torch.tensor([1, 3, 7, 0])
    assert nu.next_use(pos).tolist() == nu.next_use_np(pos.numpy()).tolist() == [1, 1, 2, 3]
    assert nu.frequency(pos).tolist() == [2, 1, 1, 0]
    assert nu.used(pos).tolist() == [True, True, True, False]


def _plans(incremental: bool, seed: int, admit: str, budget):
    """Every step's (hits, victims, newcomers) and the final rows, stepping a buffer with rows."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    halo = torch.tensor(sorted(rng.sample(range(1000), 120)))
    table = torch.randn(1000, 3)
    buf = HaloBuffer(halo, 30, 3)
    buf.incremental_next_use = incremental
    buf.fill(halo[:20], table[halo[:20]])
    # minibatches of halo and non-halo ids; each step's window is a view of one stream
    stream = [torch.tensor(rng.sample(range(1000), rng.randint(5, 80))) for _ in range(130)]
    out = []
    for g in range(120):
        depth = 0 if g % 40 == 39 else rng.choice([8, 8, 8, 3])  # an epoch end now and then
        future = stream[g + 1:g + 1 + depth]
        plan = Replace("lookahead", budget, admit=admit) if rng.random() < 0.8 else None
        step = begin_step(buf, stream[g], plan, future)
        pulled = table[step.pull_ids]
        finish_step(buf, step, pulled)
        buf.verify()
        out.append((step.hit_slots.tolist(), step.victims.tolist(), step.newcomers.tolist()))
    filled = buf.slot_pos >= 0
    assert torch.equal(buf.feats[filled], table[buf.halo[buf.slot_pos[filled]]])  # rows follow nodes
    return out


@pytest.mark.parametrize("admit,budget", [("misses", 3), ("misses", None), ("any", 4)])
@pytest.mark.parametrize("seed", [0, 1])
def test_incremental_rounds_plan_as_the_scratch_rounds(seed, admit, budget):
    """The same victims and newcomers at every step as the round that recomputes next use over
    the whole halo, and each buffered row is its node's (newcomers' rows found without a sort)."""
    plans = _plans(True, seed, admit, budget)
    assert plans == _plans(False, seed, admit, budget)
    assert sum(len(p[2]) for p in plans) > 20  # the rounds did replace


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_gather_into_copies_rows_without_aliasing(dtype):
    """The CPU path (numpy row copy) and the scratch path (a non-contiguous output) put the
    same rows in; the scratch is reused, not allocated again; outputs never alias."""
    buf = HaloBuffer(torch.arange(10), 4, 2, dtype=dtype)
    buf.fill(torch.tensor([0, 1, 2, 3]), torch.arange(8.0).reshape(4, 2))
    first = torch.zeros(3, 2, dtype=dtype)
    buf.gather_into(first, torch.tensor([2, 0]), torch.tensor([1, 3]))
    strided = torch.zeros(3, 4, dtype=dtype)[:, ::2]  # not row-contiguous: the scratch path
    buf.gather_into(strided, torch.tensor([2, 0]), torch.tensor([1, 3]))
    scratch = buf._scratch
    assert scratch is not None
    second = torch.zeros(2, 2, dtype=dtype)
    buf.gather_into(second, torch.tensor([1]), torch.tensor([0]))
    buf.gather_into(torch.zeros(2, 4, dtype=dtype)[:, ::2], torch.tensor([1]), torch.tensor([0]))
    assert buf._scratch is scratch  # reused, not allocated again
    assert first.tolist() == strided.tolist() == [[6, 7], [0, 0], [2, 3]]  # untouched by later calls
    assert second.tolist() == [[0, 0], [0, 1]]
    buf.feats.zero_()
    assert first.tolist() == [[6, 7], [0, 0], [2, 3]]  # a copy, not a view of the buffer


def test_window_missing_read_off_the_round_equals_a_unique_over_the_window():
    """buffer_state's `lookahead_missing`: from the round's index when it holds that window,
    else by a unique; both give the distinct halo nodes of the window not buffered."""
    rng = random.Random(5)
    halo = torch.tensor(sorted(rng.sample(range(500), 100)))
    buf = HaloBuffer(halo, 25, 0, store_features=False)
    buf.fill(halo[:10])
    stream = [torch.tensor(rng.sample(range(500), rng.randint(1, 60))) for _ in range(70)]

    def by_unique(future):
        ids = torch.unique(torch.cat(future))
        return int(((buf.slot_of[buf.halo_positions(ids)[1]] < 0) & buf.halo_positions(ids)[0]).sum())

    read_off = 0
    for g in range(60):
        future = stream[g + 1:g + 1 + rng.choice([8, 3, 0])]
        step = begin_step(buf, stream[g], Replace("lookahead", 4) if g % 3 else None, future)
        finish_step(buf, step)
        read_off += buf._next_use is not None and bool(future) and buf._next_use.holds(future)
        assert buf.window_missing(future) == (by_unique(future) if future else 0)
        other = stream[g + 2:g + 5]  # a window the round did not see: the unique path
        assert buf.window_missing(other) == by_unique(other)
    assert read_off > 20
