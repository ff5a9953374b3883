"""HaloBuffer mechanism against a plain per-node reference written here, plus properties."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rudder.prefetch.buffer import HaloBuffer, choose_initial
from rudder.prefetch.policy import Replace
from rudder.prefetch.step import begin_step, finish_step


class PlainMassiveGNN:
    """Straight from SPEC.md, one node at a time (the reference the vectorised code must match)."""

    def __init__(self, halo, capacity, alpha, period, init):
        self.halo = set(int(h) for h in halo)
        self.decay = 1 - alpha
        self.threshold = self.decay**period
        self.capacity = capacity
        self.slots = [None] * capacity  # slot -> node
        self.score = [0.0] * capacity
        self.miss = {h: 0.0 for h in self.halo}
        for i, n in enumerate(sorted(int(x) for x in init)):
            self.slots[i] = n
            self.score[i] = 1.0

    def step(self, remote, replace):
        where = {n: i for i, n in enumerate(self.slots) if n is not None}
        hits = [n for n in remote if n in where]
        misses = [n for n in remote if n not in where]
        hit_slots = {where[n] for n in hits}
        for i in range(self.capacity):  # as the reference: all decay, hits divided back
            self.score[i] *= self.decay
            if i in hit_slots:
                self.score[i] /= self.decay
        if not replace:
            for n in misses:
                if n in self.halo:
                    self.miss[n] += 1
        else:
            empty = [i for i in range(self.capacity) if self.slots[i] is None]
            stale = sorted(
                (i for i in range(self.capacity) if self.slots[i] is not None and self.score[i] < self.threshold),
                key=lambda i: self.score[i],
            )
            victims = empty + stale
            cands = sorted((n for n in self.halo if n not in where and self.miss[n] > 0), key=lambda n: (-self.miss[n], n))
            k = min(len(victims), len(cands))
            for i, n in zip(victims[:k], cands[:k]):
                old = self.slots[i]
                if old is not None:
                    self.miss[old] = self.score[i]
                self.score[i] = self.miss[n]
                self.slots[i] = n
        return len(hits), len(misses)

    def contents(self):
        return sorted(n for n in self.slots if n is not None)


def run_both(halo, capacity, alpha, period, init, trace, period_replace):
    buf = HaloBuffer(torch.tensor(halo), capacity, 0, alpha=alpha, period=period, store_features=False)
    buf.fill(torch.tensor(sorted(init), dtype=torch.int64))
    ref = PlainMassiveGNN(halo, capacity, alpha, period, init)
    for t, remote in enumerate(trace):
        replace = t > 0 and t % period_replace == 0
        plan = Replace("massivegnn") if replace else None
        step = begin_step(buf, torch.tensor(remote, dtype=torch.int64), plan)
        finish_step(buf, step)
        h, m = ref.step(remote, replace)
        assert (step.hits, step.misses) == (h, m), f"minibatch {t}"
        assert sorted(buf.contents().tolist()) == ref.contents(), f"contents after minibatch {t}"
        buf.verify()
    return buf, ref


def test_scores_decay_and_hits_skip_decay():
    buf = HaloBuffer(torch.arange(10), 3, 0, alpha=0.5, period=2, store_features=False)
    buf.fill(torch.tensor([0, 1, 2]))
    for _ in range(3):
        finish_step(buf, begin_step(buf, torch.tensor([0, 5]), None))
    slot0 = int(buf.slot_of[0])
    assert buf.score[slot0] == pytest.approx(1.0)  # hit every time: never decayed
    assert buf.score[int(buf.slot_of[1])] == pytest.approx(0.125)  # 0.5^3
    assert buf.threshold == pytest.approx(0.25)
    assert buf.stale_count() == 2
    assert buf.miss_count[5] == 3  # node 5 missed in three minibatches


def test_replacement_hands_scores_over():
    buf = HaloBuffer(torch.arange(10), 2, 0, alpha=0.5, period=1, store_features=False)
    buf.fill(torch.tensor([0, 1]))
    for _ in range(2):
        finish_step(buf, begin_step(buf, torch.tensor([0, 7, 8, 8 + 1]), None))
    finish_step(buf, begin_step(buf, torch.tensor([7]), None))
    # node 1 never hit: 0.5^3 < 0.5 -> stale; node 0 hit twice then decayed once: 0.5 (not < 0.5)
    step = begin_step(buf, torch.tensor([0]), Replace("massivegnn"))
    assert step.victims.tolist() == [int(buf.slot_of[1])]
    old_score = float(buf.score[step.victims[0]])
    finish_step(buf, step)
    assert buf.contents().tolist() == [0, 7]  # 7 missed 3 times: the most missed
    assert buf.miss_count[1] == pytest.approx(old_score)  # evicted: miss count := old score
    assert buf.score[int(buf.slot_of[7])] == pytest.approx(3.0)  # new slot: its miss count


@pytest.mark.parametrize("seed", range(6))
def test_matches_plain_reference(seed):
    g = torch.Generator().manual_seed(seed)
    halo = sorted(torch.randperm(200, generator=g)[:60].tolist())
    others = list(range(200, 230))  # remote but not halo: never cacheable
    pool = torch.tensor(halo + others)
    trace = []
    for _ in range(40):
        k = int(torch.randint(5, 40, (1,), generator=g))
        trace.append(sorted(set(pool[torch.randint(0, len(pool), (k,), generator=g)].tolist())))
    init = halo[:10]
    run_both(halo, 15, alpha=0.1, period=3, init=init, trace=trace, period_replace=5)


def test_lookahead_prefers_soonest_and_keeps_used():
    buf = HaloBuffer(torch.arange(10), 2, 0, store_features=False)
    buf.fill(torch.tensor([0, 1]))
    future = [torch.tensor([0, 5]), torch.tensor([6]), torch.tensor([5, 7])]
    step = begin_step(buf, torch.tensor([9]), Replace("lookahead", None, admit="any"), future)
    finish_step(buf, step)
    # 0 is used next minibatch: kept. 1 is never used: evicted for 5 (used soonest)
    assert sorted(buf.contents().tolist()) == [0, 5]
    assert step.extra_ids.tolist() == [5]  # 5 was not a miss now: an extra row


def test_lookahead_admits_free_misses_first_and_respects_budget():
    buf = HaloBuffer(torch.arange(10), 3, 0, store_features=False)
    buf.fill(torch.tensor([0, 1, 2]))
    future = [torch.tensor([3, 4]), torch.tensor([3, 4])]
    step = begin_step(buf, torch.tensor([4]), Replace("lookahead", 1, admit="any"), future)
    finish_step(buf, step)
    assert step.newcomers.tolist() == [4]  # tie on next use: the free one (this minibatch's miss)
    assert step.extra_ids.numel() == 0
    assert buf.size == 3 and 4 in buf.contents().tolist()


def test_lookahead_demand_admission_pulls_no_extra_row():
    buf = HaloBuffer(torch.arange(10), 2, 0, store_features=False)
    buf.fill(torch.tensor([0, 1]))
    future = [torch.tensor([0, 5]), torch.tensor([6, 7]), torch.tensor([7])]
    # misses now: 6 (used at +2), 7 (+2, +3), 8 (never again); 5 is used at +1 but not missed now
    step = begin_step(buf, torch.tensor([6, 7, 8]), Replace("lookahead", None), future)
    finish_step(buf, step)
    assert step.extra_ids.numel() == 0 and step.pull_ids.tolist() == [6, 7, 8]
    # 0 is used next: kept; 1 is never used: gives way to 7 (same next use as 6, used more often)
    assert sorted(buf.contents().tolist()) == [0, 7]
    with pytest.raises(ValueError, match="admit mode"):
        buf.plan_lookahead(future, None, None, admit="bogus")


@pytest.mark.parametrize("jit", [True, False])
def test_lookahead_fills_empty_slots_with_misses_of_no_known_reuse(jit, monkeypatch):
    """Empty slots take this minibatch's misses even when the window shows no reuse (Belady's
    round alone leaves them empty): no extra row, no eviction, within the round's budget; a
    full buffer gains nothing from it, and the filled slots give way to a known reuse later."""
    from rudder.prefetch import jit as kernels

    monkeypatch.setenv("RUDDER_NO_JIT", "0" if jit else "1")
    kernels.refresh()
    monkeypatch.setattr(kernels, "_loaded", {})  # the next test reads its own environment
    assert (kernels.kernels() is not None) == jit
    buf = HaloBuffer(torch.arange(100, 120), 6, 0, store_features=False)
    buf.fill(torch.tensor([100]))
    future = [torch.tensor([100, 111])]  # 111 is a miss now and used next; 112-115 never again
    step = begin_step(buf, torch.tensor([111, 112, 113, 114, 115]), Replace("lookahead", 3), future)
    finish_step(buf, step)
    assert step.extra_ids.numel() == 0 and step.newcomers.numel() == 3  # the budget: 3 rows
    assert step.newcomers[0].item() == 111  # the round's own pick first, then the fill
    assert sorted(buf.contents().tolist()) == [100, 111, 112, 113]
    assert set(step.victims.tolist()) <= {1, 2, 3, 4, 5}  # empty slots only: nothing evicted
    buf.verify()
    # the rest of the empty slots fill at the next miss; then the buffer is full
    step = begin_step(buf, torch.tensor([114, 115, 116]), Replace("lookahead", None), [torch.tensor([100])])
    finish_step(buf, step)
    assert buf.size == 6 and sorted(buf.contents().tolist()) == [100, 111, 112, 113, 114, 115]
    step = begin_step(buf, torch.tensor([116, 117]), Replace("lookahead", None), [torch.tensor([100])])
    assert step.newcomers.numel() == 0  # full, and no miss is used again in the window
    finish_step(buf, step)
    # a miss used next takes the slot of a filled node the window does not use
    step = begin_step(buf, torch.tensor([118]), Replace("lookahead", None), [torch.tensor([118, 100])])
    finish_step(buf, step)
    assert step.newcomers.tolist() == [118] and 100 in buf.contents().tolist() and buf.size == 6
    buf.verify()


def _jit_path(jit: bool, monkeypatch) -> None:
    from rudder.prefetch import jit as kernels

    monkeypatch.setenv("RUDDER_NO_JIT", "0" if jit else "1")
    kernels.refresh()
    monkeypatch.setattr(kernels, "_loaded", {})  # the next test reads its own environment
    assert (kernels.kernels() is not None) == jit


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("admit", ["misses", "any"])
def test_empty_suffix_round_admits_what_the_full_search_admits(jit, admit, monkeypatch):
    """While the empty slots are the suffix [filled, C), a round that fills no more slots than
    are empty takes the lowest ones without ranking the C slots; it must admit exactly the nodes
    the ranking over every slot admits (a buffer told its empties are unknown), step by step."""
    _jit_path(jit, monkeypatch)
    g = torch.Generator().manual_seed(5)
    halo = torch.arange(1000, 1600)
    fast, full = (HaloBuffer(halo, 500, 0, store_features=False) for _ in range(2))
    for b in (fast, full):
        b.fill(halo[:40])
    full._suffix = False  # every round ranks all slots; _fill_empty searches them
    mbs = [halo[torch.randperm(600, generator=g)[:60]].sort().values for _ in range(30)]
    for i, mb in enumerate(mbs):
        future, plan = mbs[i + 1:i + 6], Replace("lookahead", 10, admit=admit)
        assert fast._empty_from() == fast.size  # the suffix held: the search was skipped
        steps = [begin_step(b, mb, plan, future) for b in (fast, full)]
        assert steps[0].hits == steps[1].hits
        assert sorted(steps[0].newcomers.tolist()) == sorted(steps[1].newcomers.tolist())
        assert sorted(steps[0].victims.tolist()) == list(range(fast.size, fast.size + steps[0].victims.numel()))
        for b, st_ in zip((fast, full), steps):
            finish_step(b, st_)
            b.verify()
        assert sorted(fast.contents().tolist()) == sorted(full.contents().tolist())
    assert fast.size == full.size < 500  # never full: every round's victims were empty slots


def test_filling_a_slot_out_of_order_ends_the_empty_suffix():
    buf = HaloBuffer(torch.arange(20), 8, 0, store_features=False)
    buf.fill(torch.tensor([0, 1]))
    assert buf._empty_from() == 2
    buf.apply(torch.tensor([2, 3]), torch.tensor([5, 6]))  # the lowest empty slots: still a suffix
    assert buf._empty_from() == 4 and buf.size == 4
    buf.apply(torch.tensor([6]), torch.tensor([7]))  # slot 4 and 5 stay empty below it
    assert buf._empty_from() == -1 and buf.size == 5
    # the rounds fall back to searching the slots: the holes are filled, nothing is evicted
    step = begin_step(buf, torch.tensor([8, 9, 10]), Replace("lookahead", None), [torch.tensor([8, 9, 10])])
    finish_step(buf, step)
    assert sorted(step.victims.tolist()) == [4, 5, 7]
    assert buf.size == 8
    buf.verify()


def test_lookahead_never_swaps_for_a_later_use():
    buf = HaloBuffer(torch.arange(10), 1, 0, store_features=False)
    buf.fill(torch.tensor([0]))
    future = [torch.tensor([0]), torch.tensor([5])]
    step = begin_step(buf, torch.tensor([], dtype=torch.int64), Replace("lookahead", None), future)
    assert step.newcomers.numel() == 0  # 0 is needed sooner than 5


def test_features_follow_their_nodes():
    halo = torch.arange(100, 120)
    table = torch.randn(200, 4)
    buf = HaloBuffer(halo, 5, 4)
    init = torch.tensor([100, 101, 102])
    buf.fill(init, table[init])
    step = begin_step(buf, torch.tensor([100, 110, 111]), Replace("lookahead", None, admit="any"),
                      [torch.tensor([110, 111, 112])])
    pulled = table[step.pull_ids]
    finish_step(buf, step, pulled)
    for slot in torch.nonzero(buf.slot_pos >= 0).flatten():
        node = buf.halo[buf.slot_pos[slot]]
        assert torch.equal(buf.feats[slot], table[node])


def test_choose_initial():
    halo = torch.tensor([5, 3, 9, 7])
    ids = choose_initial(torch.tensor([3, 5, 7, 9]), 2, "degree", torch.tensor([10, 1, 2, 5]))
    assert ids.tolist() == [3, 9]
    assert choose_initial(halo, 2, "empty").numel() == 0
    assert choose_initial(halo, 3, "random", seed=1).numel() == 3
    with pytest.raises(ValueError, match="unknown init"):
        choose_initial(halo, 2, "bogus")
    with pytest.raises(ValueError, match="capacity"):
        HaloBuffer(halo, 5)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),
    st.floats(0, 1),
    st.lists(st.lists(st.integers(0, 120), max_size=30), min_size=1, max_size=25),
    st.sampled_from(["massivegnn", "lookahead"]),
    st.integers(1, 5),
)
def test_properties_never_owned_never_twice_never_over(nhalo, frac, trace, mech, every):
    halo = torch.arange(0, 2 * nhalo, 2)  # even ids are halo; odd ids remote non-halo
    owned = torch.arange(1000, 1010)  # the partition's own nodes: never to be buffered
    capacity = math.floor(frac * nhalo)
    buf = HaloBuffer(halo, capacity, 0, alpha=0.2, period=2, store_features=False)
    buf.fill(choose_initial(halo, capacity, "random", seed=0))
    mbs = [torch.unique(torch.tensor(m, dtype=torch.int64)) for m in trace]
    for t, remote in enumerate(mbs):
        plan = Replace(mech, 3) if t % every == 0 else None
        step = begin_step(buf, remote, plan, mbs[t + 1 : t + 4])
        finish_step(buf, step)
        buf.verify()
        c = buf.contents()
        assert c.numel() <= capacity
        assert c.unique().numel() == c.numel()
        assert bool(torch.isin(c, halo).all()) and not bool(torch.isin(c, owned).any())
        assert step.hits + step.misses == remote.numel()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_rows_live_on_the_device_and_the_index_on_the_cpu(device):
    halo = torch.arange(100, 140)
    table = torch.randn(200, 6)
    buf = HaloBuffer(halo, 8, 6, device=device)
    assert buf.feats.device.type == device and buf.feat_bytes == 8 * 6 * 4
    assert all(t.device.type == "cpu" for t in (buf.halo, buf.slot_of, buf.slot_pos, buf.score, buf.miss_count))
    buf.fill(halo[:8], table[halo[:8]])  # rows pulled on the host cross once, at admission
    step = begin_step(buf, torch.tensor([101, 150, 130, 103]), Replace("massivegnn"))
    rows = buf.gather(step.hit_slots)  # CPU slot numbers in, device rows out
    assert rows.device.type == device and torch.equal(rows.cpu(), table[[101, 103]])
    buf.apply(torch.tensor([0, 1]), torch.tensor([130, 131]), table[[130, 131]])
    assert torch.equal(buf.gather(buf.lookup(torch.tensor([131, 130]))[1]).cpu(), table[[131, 130]])
    buf.verify()


def test_a_score_exactly_at_the_threshold_is_not_stale():
    # alpha 0.5, period 2: threshold 0.25 exactly, and two unhit minibatches take a score from
    # 1 to exactly 0.25. Stale means strictly below: the windows table and the agent's prompt
    # (stale_count) must agree with the slots a replacement round takes (stale_slots).
    buf = HaloBuffer(torch.arange(10), 3, 0, alpha=0.5, period=2, store_features=False)
    buf.fill(torch.tensor([0, 1, 2]))
    finish_step(buf, begin_step(buf, torch.tensor([0, 2]), None))
    finish_step(buf, begin_step(buf, torch.tensor([0]), None))
    assert buf.score[int(buf.slot_of[1])] == buf.threshold == 0.25  # at, not below
    assert buf.score[int(buf.slot_of[2])] == 0.5
    assert buf.stale_count() == 0 and buf.stale_slots().numel() == 0
    finish_step(buf, begin_step(buf, torch.tensor([0]), None))  # 0.125 and 0.25
    assert buf.stale_count() == 1 and buf.stale_slots().tolist() == [int(buf.slot_of[1])]


def test_lookahead_evicts_the_lowest_score_among_slots_unused_in_the_window():
    buf = HaloBuffer(torch.arange(10), 2, 0, alpha=0.5, period=2, store_features=False)
    buf.fill(torch.tensor([0, 1]))
    finish_step(buf, begin_step(buf, torch.tensor([1]), None))  # 1 hit: score 1; 0 decays to 0.5
    assert buf.score[int(buf.slot_of[0])] < buf.score[int(buf.slot_of[1])]
    # neither 0 nor 1 is used in the window (a tie on next use): history decides, 0 goes
    step = begin_step(buf, torch.tensor([9]), Replace("lookahead", 1, admit="any"), [torch.tensor([5])])
    finish_step(buf, step)
    assert sorted(buf.contents().tolist()) == [1, 5]


@pytest.mark.parametrize("admit", ["misses", "any"])
def test_lookahead_never_swaps_for_an_equally_soon_use(admit):
    # "sooner only": a newcomer used as soon as the resident it would replace gains nothing,
    # and under admit=any the swap would pull an extra row for nothing
    buf = HaloBuffer(torch.arange(10), 1, 0, store_features=False)
    buf.fill(torch.tensor([0]))
    now = torch.tensor([5]) if admit == "misses" else torch.tensor([], dtype=torch.int64)
    step = begin_step(buf, now, Replace("lookahead", None, admit=admit), [torch.tensor([0, 5])])
    finish_step(buf, step)
    assert step.newcomers.numel() == 0 and step.extra_ids.numel() == 0
    assert buf.contents().tolist() == [0]


def test_a_minibatch_seen_ahead_is_searched_once():
    """The lookahead round's halo positions of a sampled-ahead minibatch serve its own lookup
    when it is trained on (one search per minibatch), with the same answer as a fresh search."""
    halo = torch.arange(0, 200, 2)
    buf = HaloBuffer(halo, 10, 0, store_features=False)
    buf.fill(halo[:10])
    mbs = [torch.tensor([0, 2, 30, 31, 44]), torch.tensor([4, 30, 33, 50, 190]), torch.tensor([8, 31])]
    searched = []
    search = buf.halo_positions
    buf.halo_positions = lambda ids: (searched.append(ids.numel()), search(ids))[1]
    begin_step(buf, mbs[0], Replace("lookahead", 5), mbs[1:])
    assert searched == [5, 5, 2]  # mbs[0] fresh; mbs[1], mbs[2] by the round (memoised)
    expect = [t.clone() for t in HaloBuffer(halo, 10, 0, store_features=False).locate(mbs[1])]
    expect[2] = torch.where(expect[0], buf.slot_of[expect[1]], -1)  # slots of this buffer
    got = buf.locate(mbs[1])
    assert searched == [5, 5, 2]  # not searched again
    assert all(torch.equal(a[got[0]], b[expect[0]]) for a, b in zip(got, expect)) and torch.equal(got[0], expect[0])
    buf.locate(mbs[1].clone())  # other storage: searched (the memo keys on the tensor)
    assert searched == [5, 5, 2, 5]


# ---- universe="remote": any remote id, through a bounded RemoteIndex (issue 17) ------------
def test_remote_universe_buffers_and_hits_a_two_hop_id():
    halo = torch.tensor([10, 20, 30])
    two_hop = 77  # remote, not a halo node: the halo buffer can never keep it
    hb = HaloBuffer(halo, 2, 0, store_features=False, alpha=0.5, period=1)
    lk = Replace("lookahead")
    sp = begin_step(hb, torch.tensor([two_hop, 10]), lk, [torch.tensor([two_hop])])
    finish_step(hb, sp)
    assert two_hop not in hb.contents().tolist()

    rb = HaloBuffer(halo, 2, 0, store_features=False, alpha=0.5, period=1, universe="remote", max_nodes=8)
    sp = begin_step(rb, torch.tensor([two_hop, 10]), lk, [torch.tensor([two_hop])])
    assert sp.hits == 0 and two_hop in sp.newcomers.tolist()
    finish_step(rb, sp)
    assert two_hop in rb.contents().tolist()
    sp = begin_step(rb, torch.tensor([two_hop]), None)
    assert sp.hits == 1 and sp.misses == 0
    rb.verify()
    assert rb.universe_nodes() == 2 and rb.num_halo == 3


def test_remote_universe_rejects_bad_settings():
    with pytest.raises(ValueError, match="universe"):
        HaloBuffer(torch.tensor([1]), 1, universe="khop")
    with pytest.raises(ValueError, match="max_nodes"):
        HaloBuffer(torch.tensor([1]), 4, universe="remote", max_nodes=2)


@pytest.mark.parametrize("mech", ["lookahead", "massivegnn"])
def test_remote_universe_serves_true_rows_while_its_index_evicts(mech):
    """A small index (max_nodes 40) over ~200 remote ids evicts all the time: every row served
    from the buffer must still be the true row of its id (no stale state after an eviction)."""
    from rudder.prefetch.features import BufferedFeatures

    g = torch.Generator().manual_seed(3)
    N, local, D = 260, 60, 4
    feat = torch.randn(N, D, generator=g)
    owner_of = lambda ids: (ids >= local).long()  # noqa: E731  partition 0 owns 0..59
    halo = torch.arange(local, local + 50)
    buf = HaloBuffer(halo, 16, D, alpha=0.2, period=3, universe="remote", max_nodes=40)
    buf.fill(halo[:8], feat[halo[:8]])
    bf = BufferedFeatures(feat, owner_of, 0, buf, local_id=0)
    # skewed draws: some remote ids recur (hits), many are seen once (index churn)
    w = torch.cat([torch.full((local,), 1.0), torch.linspace(8, 0.2, N - local)])
    batches = [torch.unique(torch.multinomial(w, 40, generator=g)) for _ in range(40)]
    remotes = [bf.remote_ids(b) for b in batches]
    hits = 0
    for i, b in enumerate(batches):
        plan = Replace(mech) if mech == "lookahead" or i % 3 == 0 else None
        out, st = bf.fetch(b, plan, remotes[i + 1:i + 5], remote=remotes[i])
        assert torch.equal(out, feat[b])
        buf.verify()
        held = buf.slot_pos >= 0
        assert torch.equal(buf.feats[held], feat[buf.halo[buf.slot_pos[held]]])  # rows match ids
        hits += st.hits
    assert hits > 0
    assert len(buf.index) == 40  # full: ids were evicted along the way
    assert bool((buf.halo[buf.slot_pos[buf.slot_pos >= 0]] >= local).all())


def test_a_deep_copy_shares_the_sampled_minibatches_and_steps_alike():
    """A replay's fork (the judge's branches, copy.deepcopy) copies the buffer's state but shares
    the trace slices its lookahead caches hold: a copy of a slice is the whole trace's storage."""
    import copy

    gen = torch.Generator().manual_seed(0)
    halo = torch.arange(1000, 3000)
    trace = torch.cat([halo[torch.randperm(2000, generator=gen)[:300]] for _ in range(40)])
    views = [trace[g * 300:(g + 1) * 300] for g in range(40)]
    buf = HaloBuffer(halo, 500, 0, alpha=0.05, period=10, store_features=False)
    plan = Replace("lookahead", 50)
    for g in range(10):
        finish_step(buf, begin_step(buf, views[g], plan, views[g + 1:g + 9]))
    cp = copy.deepcopy(buf)
    assert buf._pos_memo and buf._next_use.window
    assert all(a is b for a, b in zip(cp._pos_memo.values(), buf._pos_memo.values(), strict=True))
    assert all(a is b for a, b in zip(cp._next_use.window, buf._next_use.window, strict=True))
    assert torch.equal(cp.slot_of, buf.slot_of) and cp.slot_of.data_ptr() != buf.slot_of.data_ptr()
    for g in range(10, 14):  # the copy steps as the original would, and leaves it alone
        a = begin_step(cp, views[g], plan, views[g + 1:g + 9])
        finish_step(cp, a)
        assert not torch.equal(cp.slot_of, buf.slot_of) or a.newcomers.numel() == 0
        b = begin_step(buf, views[g], plan, views[g + 1:g + 9])
        finish_step(buf, b)
        assert (a.hits, a.misses, a.newcomers.tolist()) == (b.hits, b.misses, b.newcomers.tolist())
        assert torch.equal(cp.slot_of, buf.slot_of) and torch.equal(cp.score, buf.score)
