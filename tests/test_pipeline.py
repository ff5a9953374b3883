"""rudder.pipeline without a cluster (a plain tensor stands in for the DistTensor): the loader runs
on across epoch boundaries, except after an epoch the training thread follows with RPC of its own
(evaluation), the lookahead view of every minibatch slides on into the next epoch (as the
replays' does), the rows are the tensor's, and the stage times of each record add up."""
from __future__ import annotations

import threading

import torch

from rudder.pipeline import MinibatchPipeline, TimedCollate
from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.features import BufferedFeatures
from rudder.prefetch.metrics import MetricsCollector
from rudder.prefetch.policy import Policy

N, DIM, STEPS, EPOCHS, AHEAD = 200, 4, 5, 3, 2
# the sampled-ahead view of each minibatch: the next AHEAD of the run, across epoch boundaries
VIEW = [(e, s, min(AHEAD, EPOCHS * STEPS - 1 - (e * STEPS + s))) for e in range(EPOCHS) for s in range(STEPS)]
FEAT = torch.arange(N * DIM, dtype=torch.float32).reshape(N, DIM)
OWNER = lambda ids: (ids >= N // 2).long()  # noqa: E731  (nodes 100.. are remote)


class Recording(Policy):
    """Records what the loader showed it: (epoch, step, sampled-ahead minibatches)."""

    def __init__(self):
        self.seen: list[tuple[int, int, int]] = []

    def plan(self, step):
        self.seen.append((step.epoch, step.step, len(step.future_remote)))
        return None


def sampled(epoch: int, log: list, lock: threading.Lock, batches: int = STEPS):
    """The sampler: (input_nodes, seeds, blocks, seconds) per minibatch, as TimedCollate gives."""
    g = torch.Generator().manual_seed(epoch)
    collate = TimedCollate(lambda seeds: (torch.cat([seeds, torch.randint(0, N, (30,), generator=g)]),
                                          seeds, None))
    for step in range(batches):
        with lock:
            log.append(("sample", epoch, step))
        yield collate(torch.randint(0, N // 2, (10,), generator=g))


def make(hold_after=None, batches: int = STEPS):
    """batches > STEPS: an epoch cut short (train.max_steps_per_epoch below the loader's batches)."""
    log: list = []
    lock = threading.Lock()
    halo = torch.arange(N // 2, N)
    buf = HaloBuffer(halo, 20, DIM)
    buf.fill(halo[:20], FEAT[halo[:20]])
    feats = BufferedFeatures(FEAT, OWNER, 0, buf, local_id=0)
    policy = Recording()
    pipe = MinibatchPipeline(lambda e: sampled(e, log, lock, batches), feats, torch.arange(N) % 3, policy,
                             MetricsCollector(4), STEPS, EPOCHS, AHEAD, queue_size=2, hold_after=hold_after)
    return pipe, policy, log, lock


def train(pipe, log, lock, evaluates=lambda e: False, after_last=None):
    got = []
    for epoch in range(EPOCHS):
        for mb in pipe.epoch(epoch):
            if epoch == 0 and mb.step == STEPS - 1 and after_last is not None:
                after_last()  # the training thread holds epoch 0's last minibatch
            assert torch.equal(mb.feats, FEAT[mb.input_nodes])  # hits and pulls: the tensor's rows
            r = mb.record
            assert min(r.t_sample, r.t_sample_wait, r.t_plan, r.t_fetch, r.t_assemble) >= 0
            assert r.t_load >= r.t_plan + r.t_fetch + r.t_assemble
            got.append((mb.epoch, mb.step))
        if evaluates(epoch):
            with lock:  # what the loader did by the time this thread evaluates
                log.append(("eval", epoch, None))
    return got


def test_the_loader_runs_on_across_epochs_with_the_same_view():
    pipe, policy, log, lock = make()
    reached = threading.Event()

    def next_epoch_sampled():  # without being asked: the loader goes on into epoch 1
        for _ in range(600):
            with lock:
                if ("sample", 1, 0) in log:
                    return reached.set()
            threading.Event().wait(0.05)

    got = train(pipe, log, lock, after_last=next_epoch_sampled)
    assert reached.is_set()
    assert got == [(e, s) for e in range(EPOCHS) for s in range(STEPS)]
    # the sampled-ahead view: the next AHEAD minibatches, the next epoch's first at an epoch's end
    assert policy.seen == VIEW
    assert not pipe._thread.is_alive()


def test_the_loader_waits_while_the_training_thread_evaluates():
    evaluates = lambda e: e == 0  # noqa: E731
    pipe, policy, log, lock = make(hold_after=evaluates)
    train(pipe, log, lock, evaluates)
    # after epoch 0 (evaluated) only epoch 1's first AHEAD minibatches are sampled before the
    # evaluation (for epoch 0's last views, before its last minibatch is handed over), the rest
    # after it: the loader issues no RPC while the training thread evaluates
    at = log.index(("eval", 0, None))
    assert [x for x in log[:at] if x[1] == 1] == [("sample", 1, s) for s in range(AHEAD)]
    assert all(x[1] == 1 and x[2] >= AHEAD for x in log[at + 1:at + 1 + STEPS - AHEAD])
    assert policy.seen == VIEW


def test_an_epoch_cut_short_samples_only_what_it_trains():
    """The loader's batches beyond the epoch's steps are not sampled (their time is not spent in
    the loader) and the lookahead view goes from the epoch as trained to the next epoch's first
    minibatches, as the replays' does."""
    pipe, policy, log, lock = make(batches=STEPS + 4)
    got = train(pipe, log, lock)
    assert got == [(e, s) for e in range(EPOCHS) for s in range(STEPS)]
    assert [x for x in log if x[0] == "sample"] == [("sample", e, s) for e in range(EPOCHS) for s in range(STEPS)]
    assert policy.seen == VIEW


class PooledLoader:
    """DGL 2.1's DistDataLoader with sampler processes, as far as the pipeline sees it: iter()
    resets its position and pending count, but results its pool was still sampling stay in the
    pool's result queue (here a list), and __next__ takes the oldest one first."""

    def __init__(self, batches: int, queue_size: int = 4):
        self.batches, self.queue_size = batches, queue_size
        self.pool = []  # the pool's result queue, kept across iter()
        self.epoch = -1

    def __iter__(self):
        self.epoch += 1
        self.current_pos = self.recv_idxs = self.num_pending = 0
        return self

    def __next__(self):
        while self.num_pending < self.queue_size and self.current_pos < self.batches:
            seeds = torch.full((10,), self.epoch * 10 + self.current_pos)  # names its epoch
            self.pool.append((torch.cat([seeds, seeds + N // 2]), seeds, None, 0.0))
            self.current_pos += 1
            self.num_pending += 1
        if self.recv_idxs == self.batches:
            raise StopIteration
        self.recv_idxs += 1
        self.num_pending -= 1
        return self._get_data_from_result_queue()

    def _get_data_from_result_queue(self, timeout=1800):
        return self.pool.pop(0)


def test_an_epoch_cut_short_leaves_nothing_for_the_next():
    """max_steps_per_epoch (or the least steps over the ranks) below the loader's batches: what
    the sampler processes were still sampling is dropped, not trained as the next epoch's."""
    import dgl

    assert hasattr(dgl.distributed.DistDataLoader, "_get_data_from_result_queue")  # what we call
    halo = torch.arange(N // 2, N)
    buf = HaloBuffer(halo, 20, DIM)
    feats = BufferedFeatures(FEAT, OWNER, 0, buf, local_id=0)
    loader = PooledLoader(batches=8)
    pipe = MinibatchPipeline(lambda e: loader, feats, torch.arange(N) % 3, Recording(),
                             MetricsCollector(4), 3, EPOCHS, 1, queue_size=2)
    for epoch in range(EPOCHS):
        firsts = [int(mb.input_nodes[0]) for mb in pipe.epoch(epoch)]
        assert firsts == [epoch * 10 + s for s in range(3)], (epoch, firsts)
    assert loader.pool == []
