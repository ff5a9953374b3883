"""The whole epoch scheduled ahead (issue 17 must-have 7): prefetch.schedule_ahead, the replay's
window over the rest of the epoch, and the lookahead round over it against the next use computed
from scratch."""
from __future__ import annotations

import collections
import time

import pytest
import torch

from rudder.config import WHOLE_EPOCH, ConfigError, PrefetchConfig, RunConfig, parse_config, sample_ahead
from rudder.prefetch.buffer import HaloBuffer
from rudder.sim.replay import PositionTrace
from rudder.sim.simulate import parse_policy, simulate
from rudder.sim.tracegen import random_trace

COUNTS = ("hits", "misses", "replaced_rows", "admitted_rows", "fetched_rows")


def test_schedule_ahead_samples_the_whole_epoch_for_the_lookahead_policies_only():
    assert sample_ahead(PrefetchConfig(policy="lookahead")) == 8  # the default is unchanged
    assert sample_ahead(PrefetchConfig(policy="lookahead", schedule_ahead=True)) == WHOLE_EPOCH
    assert sample_ahead(PrefetchConfig(policy="rule", schedule_ahead=True)) == WHOLE_EPOCH
    assert sample_ahead(PrefetchConfig(policy="static", schedule_ahead=True)) == 0


def test_a_bad_schedule_ahead_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"prefetch\.schedule_ahead.*bool"):
        parse_config(RunConfig, {"prefetch": {"policy": "lookahead", "schedule_ahead": "soon"}})
    cfg = parse_config(RunConfig, {"prefetch": {"policy": "lookahead", "schedule_ahead": True}})
    assert cfg.prefetch.schedule_ahead


def test_the_replay_policy_spec_takes_epoch_as_the_depth():
    pc = parse_policy("lookahead:epoch:0.5:any").prefetch
    assert pc.schedule_ahead and pc.budget == 0.5 and pc.admit == "any" and pc.lookahead == 8
    assert not parse_policy("lookahead:8").prefetch.schedule_ahead
    with pytest.raises(ValueError, match="lookahead:soon"):
        parse_policy("lookahead:soon")


def test_the_loaders_schedule_by_hand():
    """known_ahead on epochs of 4 with start depth 1: the first epoch plans its first minibatch
    with 1 sampled ahead, then samples two per hand-over (its rest, then the next epoch's), later
    epochs one of the next per hand-over; the last epoch sees its own rest."""
    from rudder.pipeline import known_ahead

    assert known_ahead([4, 4, 4], 1) == [2, 4, 6, 7, 8, 9, 10, 11, 12, 12, 12, 12]
    assert known_ahead([3], 8) == [3, 3, 3]
    assert known_ahead([4, 4], WHOLE_EPOCH) == [4, 5, 6, 7, 8, 8, 8, 8]


def test_the_replays_window_is_what_the_loader_sampled():
    """With the whole epoch scheduled ahead the replay's view of minibatch g is what the loader
    has sampled when it plans g: the rest of g's epoch and the next epoch's so far (the live
    loader's own futures are compared with the same schedule below), the first epoch starting
    from its start depth."""
    from rudder.pipeline import known_ahead

    t = random_trace(halo=200, minibatches=30, batch=20, epochs=3, seed=1)
    pt = PositionTrace(t, start_depth=2)
    known = known_ahead([10, 10, 10], 2)
    for g in range(len(pt)):
        end = (g // 10 + 1) * 10  # 10 minibatches per epoch
        got = pt.ahead(g, WHOLE_EPOCH)
        assert [x.data_ptr() for x in got] == [pt.remote(j).data_ptr() for j in range(g + 1, known[g])]
        assert known[g] <= min(end + 10, 30)  # never beyond the next epoch
        assert known[g] >= (end if g >= 10 else min(end, g + 3))  # the rest of later epochs whole
    assert len(pt.ahead(9, WHOLE_EPOCH)) > 0 and len(pt.ahead(29, WHOLE_EPOCH)) == 0


@pytest.mark.parametrize("admit", ["misses", "any"])
def test_whole_epoch_round_equals_the_scratch_next_use(monkeypatch, admit):
    """Epochs of 100 minibatches (beyond the old 62-minibatch ring): the round planned from the
    incremental next use makes exactly the choices of the one computed from scratch each step,
    and in a run of one epoch the rest of the epoch is what a depth of one epoch gives (over
    several, both go on into the next epoch: a fixed depth as far as it reaches, the whole-epoch
    view as far as the next epoch is sampled)."""
    t = random_trace(halo=300, minibatches=200, batch=40, epochs=2, skew=0.8, seed=3)
    # a first epoch starts with prefetch.lookahead sampled ahead: here the whole epoch
    spec = parse_policy(f"lookahead:epoch:0.2:{admit}", PrefetchConfig(lookahead=100))
    inc = simulate(t, spec, verify=True)
    one = random_trace(halo=300, minibatches=100, batch=40, epochs=1, skew=0.8, seed=3)
    whole, deep = simulate(one, spec), simulate(one, f"lookahead:100:0.2:{admit}")
    monkeypatch.setattr(HaloBuffer, "incremental_next_use", False)
    scratch = simulate(t, spec, verify=True)
    for k in COUNTS:
        assert (inc.counts[k] == scratch.counts[k]).all(), k
        assert (whole.counts[k] == deep.counts[k]).all(), k
    assert inc.total("admitted_rows") > 0  # the round did replace
    # and planning deeper than 2 changed something on this trace (the depth is honoured; with
    # admit any and both views going on into the next epoch, 8 and the epoch choose alike here)
    two = simulate(t, f"lookahead:2:0.2:{admit}")
    assert any((inc.counts[k] != two.counts[k]).any() for k in COUNTS)


def test_the_loader_samples_the_whole_epoch_ahead_and_shows_the_rest_of_it():
    """The live loader (rudder.pipeline, a plain tensor for the DistTensor) with the depth
    schedule_ahead gives: each epoch sampled whole before its first minibatch is planned, every
    minibatch planned over the rest of its epoch, never the next epoch's."""
    import threading

    import torch

    from rudder.pipeline import MinibatchPipeline, TimedCollate
    from rudder.prefetch.features import BufferedFeatures
    from rudder.prefetch.metrics import MetricsCollector
    from rudder.prefetch.policy import Policy

    N, DIM, STEPS, EPOCHS = 200, 4, 7, 2
    feat = torch.arange(N * DIM, dtype=torch.float32).reshape(N, DIM)
    log, lock = [], threading.Lock()

    class Recording(Policy):
        def plan(self, step):
            with lock:
                log.append(("plan", step.epoch, step.step, len(step.future_remote)))
            return None

    def sampled(epoch):
        g = torch.Generator().manual_seed(epoch)  # a new seed per epoch, as training
        collate = TimedCollate(lambda s: (torch.cat([s, torch.randint(0, N, (30,), generator=g)]), s, None))
        for step in range(STEPS):
            with lock:
                log.append(("sample", epoch, step))
            yield collate(torch.randint(0, N // 2, (10,), generator=g))

    halo = torch.arange(N // 2, N)
    buf = HaloBuffer(halo, 20, DIM)
    buf.fill(halo[:20], feat[halo[:20]])
    feats = BufferedFeatures(feat, lambda ids: (ids >= N // 2).long(), 0, buf, local_id=0)
    depth = sample_ahead(PrefetchConfig(policy="lookahead", schedule_ahead=True))
    pipe = MinibatchPipeline(sampled, feats, torch.arange(N) % 3, Recording(), MetricsCollector(4),
                             STEPS, EPOCHS, depth, queue_size=2)
    for epoch in range(EPOCHS):
        for mb in pipe.epoch(epoch):
            assert torch.equal(mb.feats, feat[mb.input_nodes])
    plans = [e for e in log if e[0] == "plan"]
    assert plans == [("plan", e, s, STEPS - 1 - s) for e in range(EPOCHS) for s in range(STEPS)]
    for e in range(EPOCHS):  # every minibatch of epoch e sampled before its first plan
        first_plan = log.index(("plan", e, 0, STEPS - 1))
        assert all(log.index(("sample", e, s)) < first_plan for s in range(STEPS))


def test_schedules_ahead_only_for_policies_that_use_the_future():
    from rudder.config import schedules_ahead

    assert schedules_ahead(PrefetchConfig(policy="lookahead", schedule_ahead=True))
    assert not schedules_ahead(PrefetchConfig(policy="lookahead"))
    assert not schedules_ahead(PrefetchConfig(policy="fixed", schedule_ahead=True))


class ResettingLoader:
    """DGL 2.1's DistDataLoader with samplers 0, as far as the pipeline sees it: one object for
    every epoch, iter() resets it to the next epoch (a new order) and returns itself, and each
    next() samples one minibatch in the caller's thread (logged as ("sample", epoch, step))."""

    N, BATCHES = 200, 6

    def __init__(self, log, lock):
        import torch

        from rudder.pipeline import TimedCollate

        self.log, self.lock, self.epoch = log, lock, -1
        self.collate = TimedCollate(lambda s: (torch.cat([s, s + self.N // 2, self.epoch * 1000 + s]), s, None))

    def __iter__(self):
        self.epoch, self.pos = self.epoch + 1, 0
        return self

    def __next__(self):
        import torch

        if self.pos == self.BATCHES:
            raise StopIteration
        with self.lock:
            self.log.append(("sample", self.epoch, self.pos))
        g = torch.Generator().manual_seed(self.epoch * 100 + self.pos)
        self.pos += 1
        return self.collate(torch.randint(0, self.N // 2, (10,), generator=g))


class SamplerPoolLoader(ResettingLoader):
    """DGL 2.1's DistDataLoader with a sampler process (train.samplers 1): iter() resets it and
    logs ("iter", epoch, what its pool still held: it would come out as the new epoch's), next()
    keeps QUEUE minibatches requested from the pool (a worker thread sampling in the background,
    logged as ("pooled", epoch, step)) and collects the oldest (logged as ("sample", epoch, step))."""

    QUEUE = 2

    def __init__(self, log, lock):
        from concurrent.futures import ThreadPoolExecutor

        super().__init__(log, lock)
        self.pool, self.results, self.num_pending = ThreadPoolExecutor(1), collections.deque(), 0

    def __iter__(self):
        with self.lock:
            self.log.append(("iter", self.epoch + 1, self.num_pending))
        self.epoch, self.requested, self.received, self.num_pending = self.epoch + 1, 0, 0, 0
        return self

    def _sample(self, epoch, step):
        time.sleep(0.002)  # the sampling's own time, beside the caller's
        g = torch.Generator().manual_seed(epoch * 100 + step)
        seeds = torch.randint(0, self.N // 2, (10,), generator=g)
        with self.lock:
            self.log.append(("pooled", epoch, step))
        return torch.cat([seeds, seeds + self.N // 2, epoch * 1000 + seeds]), seeds, None, 0.001

    def __next__(self):
        while self.num_pending < self.QUEUE and self.requested < self.BATCHES:
            self.results.append(self.pool.submit(self._sample, self.epoch, self.requested))
            self.requested, self.num_pending = self.requested + 1, self.num_pending + 1
        if self.received == self.BATCHES:
            raise StopIteration
        got = self._get_data_from_result_queue()
        with self.lock:
            self.log.append(("sample", self.epoch, self.received))
        self.received, self.num_pending = self.received + 1, self.num_pending - 1
        return got

    def _get_data_from_result_queue(self, timeout=1800):
        return self.results.popleft().result(timeout)


def _interleaved(evaluates=lambda e: False, eval_seconds=0.0, epochs=3, start_depth=None,
                 loader_cls=ResettingLoader):
    """A pipeline that samples epoch e+1 while e trains (schedule_ahead's depth), over a
    ResettingLoader (or `loader_cls`); the training thread logs what it receives and its
    evaluations. start_depth: the first epoch's future at its start (train.py: lookahead)."""
    import threading
    import time

    import torch

    from rudder.pipeline import MinibatchPipeline
    from rudder.prefetch.features import BufferedFeatures
    from rudder.prefetch.metrics import MetricsCollector
    from rudder.prefetch.policy import Policy

    N, DIM, STEPS = ResettingLoader.N, 4, ResettingLoader.BATCHES
    feat = torch.arange(N * 1000 * epochs, dtype=torch.float32).reshape(-1, 1).expand(-1, DIM).contiguous()
    log, lock = [], threading.Lock()
    futures = {}

    class Recording(Policy):
        def plan(self, step):
            with lock:
                log.append(("plan", step.epoch, step.step))
            futures[step.epoch, step.step] = [f.clone() for f in step.future_remote]
            return None

    class Trace:  # the remote ids of each minibatch as handed over, in order
        remote = {}

        def add(self, epoch, remote, input_rows):
            self.remote[epoch, len([k for k in self.remote if k[0] == epoch])] = remote.clone()

    halo = torch.arange(N // 2, N)
    buf = HaloBuffer(halo, 20, DIM)
    buf.fill(halo[:20], feat[halo[:20]])
    feats = BufferedFeatures(feat, lambda ids: (ids >= N // 2).long(), 0, buf, local_id=0)
    loader = loader_cls(log, lock)
    trace = Trace()
    depth = sample_ahead(PrefetchConfig(policy="lookahead", schedule_ahead=True))
    pipe = MinibatchPipeline(lambda e: loader, feats, torch.arange(feat.shape[0]) % 3, Recording(),
                             MetricsCollector(4), STEPS, epochs, depth, queue_size=2, trace_writer=trace,
                             hold_after=evaluates, sample_next_epoch=True, start_depth=start_depth)
    for epoch in range(epochs):
        for mb in pipe.epoch(epoch):
            assert torch.equal(mb.feats, feat[mb.input_nodes])
            assert int(mb.input_nodes[-1]) // 1000 == epoch  # sampled for its own epoch
            with lock:
                log.append(("train", epoch, mb.step))
        if evaluates(epoch):
            with lock:
                log.append(("eval", epoch, "start"))
            time.sleep(eval_seconds)  # the loader would sample meanwhile if it could
            with lock:
                log.append(("eval", epoch, "end"))
    assert not pipe._thread.is_alive()
    return log, futures, trace.remote, STEPS


def _sampled_so_far(futures, remote, steps, epochs, start_depth):
    """Asserts that each minibatch was planned over exactly what known_ahead says the loader had
    sampled: the rest of its epoch, then the next epoch's first ones, in order."""
    from rudder.pipeline import known_ahead

    order = [remote[e, j] for e in range(epochs) for j in range(steps)]
    known = known_ahead([steps] * epochs, start_depth)
    for (e, s), fut in futures.items():
        g = e * steps + s
        want = order[g + 1:known[g]]
        assert len(fut) == len(want) and all(a.equal(b) for a, b in zip(fut, want)), (e, s)
    return known


def test_the_next_epoch_is_sampled_while_this_one_trains_and_the_view_goes_into_it():
    """schedule_ahead with sample_next_epoch: epoch e+1's minibatches are sampled during epoch e
    (from its first minibatch on) and all of them before e+1's first minibatch is planned, so
    only epoch 0 starts by sampling; each minibatch is planned over the rest of its own epoch
    and what of the next is sampled so far (exactly known_ahead's schedule, which the replays
    use), and the loader never holds more than one epoch's sampled minibatches."""
    log, futures, remote, STEPS = _interleaved()
    epochs = 3
    for e in range(epochs - 1):
        first_plan = log.index(("plan", e + 1, 0))
        assert all(log.index(("sample", e + 1, s)) < first_plan for s in range(STEPS))
        assert log.index(("sample", e + 1, 0)) < log.index(("plan", e, 1))  # during epoch e
    _sampled_so_far(futures, remote, STEPS, epochs, WHOLE_EPOCH)
    assert len(futures[0, STEPS - 1]) == STEPS - 1  # the next epoch's all but one, at e's last
    held = 0  # sampled, not yet planned
    for kind, *_ in log:
        held += {"sample": 1, "plan": -1}.get(kind, 0)
        assert held <= STEPS
    assert sorted(futures) == [(e, s) for e in range(epochs) for s in range(STEPS)]


def test_no_sampling_while_the_training_thread_evaluates():
    """hold_after: epoch e+1's sampling ends before epoch e's end is handed over, and the loader
    neither samples nor plans (pulls) while the training thread evaluates after an epoch."""
    evaluates = lambda e: True  # noqa: E731
    log, *_ = _interleaved(evaluates, eval_seconds=0.3)
    for e in range(3):
        start, end = log.index(("eval", e, "start")), log.index(("eval", e, "end"))
        assert end == start + 1, log[start:end + 1]  # nothing of the loader in between
        if e < 2:  # and the next epoch was sampled whole before
            assert all(log.index(("sample", e + 1, s)) < start for s in range(ResettingLoader.BATCHES))


def test_the_seeded_shuffle_is_new_each_epoch_and_reproducible():
    """With the next epoch sampled early, the trainer's shuffle is SeedOrder's by (seed, rank,
    epoch): a new permutation every epoch, the same for the same seed, whatever other draws
    torch's global RNG serves meanwhile."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from rudder.seed_order import trainer_order

    part = SimpleNamespace(train_nids=torch.arange(50, 150), rank=1)
    tc = SimpleNamespace(order="shuffle", seed=7)
    a, b = trainer_order(part, tc), trainer_order(part, tc)
    torch.rand(10)  # a draw elsewhere changes nothing
    assert all(np.array_equal(a.epoch(e), b.epoch(e)) for e in range(3))
    assert not np.array_equal(a.epoch(0), a.epoch(1))
    assert sorted(a.epoch(2)) == list(range(100))
    assert not np.array_equal(trainer_order(SimpleNamespace(train_nids=part.train_nids, rank=0), tc).epoch(0),
                              a.epoch(0))


def _held(log):
    """The most minibatches sampled (collected) and not yet planned at any time."""
    held = most = 0
    for kind, *_ in log:
        held += {"sample": 1, "plan": -1}.get(kind, 0)
        most = max(most, held)
    return most


@pytest.mark.parametrize("loader_cls", [ResettingLoader, SamplerPoolLoader])
def test_the_first_epoch_starts_after_its_lookahead_and_samples_its_rest_during_it(loader_cls):
    """No bubble: the first epoch's first minibatch is planned (and handed over) once 1 +
    start_depth of its minibatches are sampled, not the whole epoch; the policy's future is
    what is sampled so far (at least start_depth, growing to the whole rest and on into the next
    epoch); the rest of the first epoch is sampled during it, and all of the second before the
    first's end (no sampling while the training thread evaluates), within one epoch's memory."""
    D, STEPS = 2, ResettingLoader.BATCHES
    log, futures, remote, _ = _interleaved(lambda e: True, eval_seconds=0.05, start_depth=D,
                                           loader_cls=loader_cls)
    first_plan = log.index(("plan", 0, 0))
    assert [x for x in log[:first_plan] if x[0] == "sample"] == [("sample", 0, s) for s in range(D + 1)]
    known = _sampled_so_far(futures, remote, STEPS, 3, D)  # what was sampled, the replays' schedule
    assert known[0] == 1 + D and all(len(futures[0, s]) >= D for s in range(STEPS))
    assert len(futures[0, 2]) > STEPS - 3  # the first epoch's rest was sampled during it, then e+1's
    for e in range(3):
        start = log.index(("eval", e, "start"))
        assert log[start + 1] == ("eval", e, "end")  # nothing of the loader in between
        if e < 2:  # the next epoch sampled whole before this one's end, after this one's sampling
            nxt = [log.index(("sample", e + 1, s)) for s in range(STEPS)]
            assert max(nxt) < start and min(nxt) > log.index(("sample", e, STEPS - 1))
            assert min(nxt) < log.index(("plan", e, STEPS - 1))  # during epoch e
    assert _held(log) <= STEPS


def test_with_sampler_processes_the_next_epoch_samples_beside_this_one():
    """train.samplers > 0: epoch e+1's iterator is opened only after e's last minibatch is
    collected, with nothing of e left in the pool (it would be handed out as e+1's); the sampler
    works on e+1 while e is still being handed over; all of e+1 is collected before e's end, so
    the pool is idle while the training thread evaluates (it shares the pool)."""
    STEPS = ResettingLoader.BATCHES
    log, *_ = _interleaved(lambda e: True, eval_seconds=0.05, start_depth=1, loader_cls=SamplerPoolLoader)
    iters = [x for x in log if x[0] == "iter"]
    assert iters == [("iter", e, 0) for e in range(3)]
    for e in range(2):
        assert log.index(("iter", e + 1, 0)) > log.index(("sample", e, STEPS - 1))
        assert log.index(("pooled", e + 1, 0)) < log.index(("plan", e, STEPS - 1))
        assert log.index(("pooled", e + 1, STEPS - 1)) < log.index(("eval", e, "start"))
    for e in range(3):
        start = log.index(("eval", e, "start"))
        assert log[start + 1] == ("eval", e, "end")
