"""Two pulls in flight (train.pulls_in_flight 2) without a cluster: the loader sends minibatch
i+1's pull before it receives i's, the buffer's next round is planned on the index with i's
newcomers while their rows are still on the wire, and still every row handed over is the
tensor's own and the buffer makes the same decisions as with one pull at a time. (The real
cluster's DGLPulls: tests/test_train_integration.py::test_two_pulls_in_flight_on_a_real_cluster.)"""
from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from rudder.config import TrainConfig
from rudder.pipeline import MinibatchPipeline, TimedCollate
from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.features import BufferedFeatures
from rudder.prefetch.metrics import MetricsCollector
from rudder.prefetch.policy import Policy, Replace

N, DIM, STEPS, EPOCHS, AHEAD = 400, 3, 12, 2, 3
FEAT = torch.arange(N * DIM, dtype=torch.float32).reshape(N, DIM)
OWNER = lambda ids: (ids >= N // 4).long()  # noqa: E731  (nodes 100.. are remote: most of them)


class WirePulls:
    """Pulls sent now, their rows read from FEAT only when received (as a wire would deliver
    them), with the order of sends and receives recorded."""

    def __init__(self):
        self.events: list[tuple[str, int]] = []
        self.sent = self.checks = 0
        self.in_flight = self.most_in_flight = 0

    def send(self, feat, ids):
        self.sent += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.events.append(("send", self.sent))
        return self.sent, feat, ids.clone()

    def receive(self, sent):
        k, feat, ids = sent
        self.in_flight -= 1
        self.events.append(("receive", k))
        return feat[ids]

    def pull(self, feat, ids):
        self.checks += 1
        return feat[ids]


class EveryStep(Policy):
    """A lookahead round at every minibatch, any node of the window admitted: newcomers that are
    not this minibatch's misses, and victims that the last minibatch read as hits."""

    def plan(self, step):
        return Replace("lookahead", 12, admit="any")


def sampled(epoch: int):
    g = torch.Generator().manual_seed(100 + epoch)
    collate = TimedCollate(lambda seeds: (torch.cat([seeds, torch.randperm(N - N // 4, generator=g)[:60] + N // 4]),
                                          seeds, None))
    for _ in range(STEPS):
        yield collate(torch.randperm(N // 4, generator=g)[:8])


def run(pulls_in_flight: int, check: bool = False, compact: bool = False, evaluates=None):
    halo = torch.arange(N // 4, N)
    buf = HaloBuffer(halo, 40, DIM)
    buf.fill(halo[:40], FEAT[halo[:40]])
    feats = BufferedFeatures(FEAT, OWNER, 0, buf, local_id=0)
    feats.compact = compact  # the GPU's assembly (the pull leaves the hits out), run on the CPU
    feats.pulls = WirePulls()
    pipe = MinibatchPipeline(sampled, feats, torch.arange(N) % 3, EveryStep(), MetricsCollector(4),
                             STEPS, EPOCHS, AHEAD, queue_size=2, check=check, pulls_in_flight=pulls_in_flight,
                             hold_after=evaluates)
    got = []
    for epoch in range(EPOCHS):
        for step, mb in enumerate(pipe.epoch(epoch)):
            assert (mb.epoch, mb.step) == (epoch, step)  # each epoch hands over its own, in order
            st = mb.stats
            got.append((mb.input_nodes, mb.feats, (st.hits, st.misses, st.replaced_rows, st.admitted_rows),
                        mb.mismatched_rows, mb.record.t_load))
    assert len(got) == STEPS * EPOCHS
    feats.pulls.epoch_ends = pipe.epoch_ends_in_flight
    return got, feats.pulls, buf


@pytest.mark.parametrize("pulls, compact", [(2, False), (3, False), (2, True)])
def test_pulls_in_flight_hand_over_the_same_rows_and_decisions(pulls, compact):
    one, wire1, _ = run(1, compact=compact)
    two, wire2, buf = run(pulls, compact=compact)
    assert len(one) == len(two) == STEPS * EPOCHS
    for (ids1, x1, st1, _, _), (ids2, x2, st2, _, _) in zip(one, two):
        assert torch.equal(ids1, ids2)
        assert torch.equal(x2, FEAT[ids2])  # every hit read the row its slot held at lookup
        assert st1 == st2  # the same hits, misses and round, planned a minibatch earlier
    assert sum(s[2] for _, _, s, _, _ in two) > 0  # the rounds pulled rows ahead of use
    buf.verify()
    filled = torch.nonzero(buf.slot_pos >= 0).flatten()
    assert torch.equal(buf.feats[filled], FEAT[buf.halo[buf.slot_pos[filled]]])  # each slot: its id's row
    assert wire1.most_in_flight == 1 and wire2.most_in_flight == pulls


def test_the_next_pull_is_sent_before_this_one_is_received_also_over_an_epoch_end():
    _, wire, _ = run(2)
    ev = wire.events
    assert wire.epoch_ends == EPOCHS - 1
    # minibatch k+1's pull goes out before k's rows are taken, within an epoch ...
    assert ev[:3] == [("send", 1), ("send", 2), ("receive", 1)]
    # ... and over an epoch's end that no evaluation follows: the next epoch's first pull goes
    # out before the epoch's last is received (its end is handed over after that minibatch)
    assert ev.index(("send", STEPS + 1)) < ev.index(("receive", STEPS))
    assert ev[-1] == ("receive", STEPS * EPOCHS)  # the run's last end receives everything


def test_no_pull_in_flight_over_an_epoch_end_the_training_thread_evaluates_after():
    _, wire, _ = run(2, evaluates=lambda epoch: epoch == 0)
    ev = wire.events
    assert wire.epoch_ends == 0
    first_of_next = ev.index(("send", STEPS + 1))
    assert ("receive", STEPS) in ev[:first_of_next]  # epoch 0's last received before epoch 1 starts


def test_the_check_pull_goes_through_the_same_pulls():
    got, wire, _ = run(2, check=True)
    assert all(bad == 0 for *_, bad, _ in got)
    assert wire.checks == wire.sent == STEPS * EPOCHS  # every minibatch checked through its Pulls


def test_more_than_one_pull_needs_sampler_processes():
    assert TrainConfig(pulls_in_flight=2, samplers=1).pulls_in_flight == 2
    with pytest.raises(ValidationError, match="pulls_in_flight 2 needs train.samplers >= 1"):
        TrainConfig(pulls_in_flight=2)
