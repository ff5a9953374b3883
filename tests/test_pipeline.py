"""rudder.pipeline without a cluster (a plain tensor stands in for the DistTensor): the loader runs
on across epoch boundaries, except after an epoch the training thread follows with RPC of its own
(evaluation), the lookahead view of every minibatch stays within its epoch, the rows are the
tensor's, and the stage times of each record add up."""
from __future__ import annotations

import threading

import torch

from rudder.pipeline import MinibatchPipeline, TimedCollate
from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.features import BufferedFeatures
from rudder.prefetch.metrics import MetricsCollector
from rudder.prefetch.policy import Policy

N, DIM, STEPS, EPOCHS, AHEAD = 200, 4, 5, 3, 2
FEAT = torch.arange(N * DIM, dtype=torch.float32).reshape(N, DIM)
OWNER = lambda ids: (ids >= N // 2).long()  # noqa: E731  (nodes 100.. are remote)


class Recording(Policy):
    """Records what the loader showed it: (epoch, step, sampled-ahead minibatches)."""

    def __init__(self):
        self.seen: list[tuple[int, int, int]] = []

    def plan(self, step):
        self.seen.append((step.epoch, step.step, len(step.future_remote)))
        return None


def sampled(epoch: int, log: list, lock: threading.Lock):
    """The sampler: (input_nodes, seeds, blocks, seconds) per minibatch, as TimedCollate gives."""
    g = torch.Generator().manual_seed(epoch)
    collate = TimedCollate(lambda seeds: (torch.cat([seeds, torch.randint(0, N, (30,), generator=g)]),
                                          seeds, None))
    for step in range(STEPS):
        with lock:
            log.append(("sample", epoch, step))
        yield collate(torch.randint(0, N // 2, (10,), generator=g))


def make(hold_after=None):
    log: list = []
    lock = threading.Lock()
    halo = torch.arange(N // 2, N)
    buf = HaloBuffer(halo, 20, DIM)
    buf.fill(halo[:20], FEAT[halo[:20]])
    feats = BufferedFeatures(FEAT, OWNER, 0, buf, local_id=0)
    policy = Recording()
    pipe = MinibatchPipeline(lambda e: sampled(e, log, lock), feats, torch.arange(N) % 3, policy,
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
    # the sampled-ahead view: min(AHEAD, the rest of the epoch), never the next epoch's
    assert policy.seen == [(e, s, min(AHEAD, STEPS - 1 - s)) for e in range(EPOCHS) for s in range(STEPS)]
    assert not pipe._thread.is_alive()


def test_the_loader_waits_while_the_training_thread_evaluates():
    evaluates = lambda e: e == 0  # noqa: E731
    pipe, policy, log, lock = make(hold_after=evaluates)
    train(pipe, log, lock, evaluates)
    # after epoch 0 (evaluated) nothing of epoch 1 is sampled before the evaluation
    assert log.index(("eval", 0, None)) < log.index(("sample", 1, 0))
    assert policy.seen == [(e, s, min(AHEAD, STEPS - 1 - s)) for e in range(EPOCHS) for s in range(STEPS)]
