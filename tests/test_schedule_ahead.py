"""The whole epoch scheduled ahead (issue 17 must-have 7): prefetch.schedule_ahead, the replay's
window over the rest of the epoch, and the lookahead round over it against the next use computed
from scratch."""
from __future__ import annotations

import pytest

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


def test_the_window_is_the_rest_of_the_epoch():
    t = random_trace(halo=200, minibatches=30, batch=20, epochs=3, seed=1)
    pt = PositionTrace(t)
    for g in range(len(pt)):
        end = (g // 10 + 1) * 10  # 10 minibatches per epoch
        got = pt.ahead(g, WHOLE_EPOCH)
        assert [x.data_ptr() for x in got] == [pt.remote(j).data_ptr() for j in range(g + 1, end)]


@pytest.mark.parametrize("admit", ["misses", "any"])
def test_whole_epoch_round_equals_the_scratch_next_use(monkeypatch, admit):
    """Epochs of 100 minibatches (beyond the old 62-minibatch ring): the round planned from the
    incremental next use makes exactly the choices of the one computed from scratch each step,
    and the rest of the epoch is what a depth of one epoch gives."""
    t = random_trace(halo=300, minibatches=200, batch=40, epochs=2, skew=0.8, seed=3)
    spec = f"lookahead:epoch:0.2:{admit}"
    inc = simulate(t, spec, verify=True)
    monkeypatch.setattr(HaloBuffer, "incremental_next_use", False)
    scratch = simulate(t, spec, verify=True)
    deep = simulate(t, f"lookahead:100:0.2:{admit}")
    for k in COUNTS:
        assert (inc.counts[k] == scratch.counts[k]).all(), k
        assert (inc.counts[k] == deep.counts[k]).all(), k
    assert inc.total("admitted_rows") > 0  # the round did replace
    # and planning deeper than 8 changed something on this trace (the depth is honoured)
    eight = simulate(t, f"lookahead:8:0.2:{admit}")
    assert any((inc.counts[k] != eight.counts[k]).any() for k in COUNTS)


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
