"""MinibatchPipeline: samples minibatches ahead and assembles their features in a background
thread while the training thread computes (bounded queue: memory stays bounded).

The loader thread owns the buffer and the policy: every DGL RPC of training in this process,
the buffer lookup/replacement and the policy's plan/observe all run there, one minibatch at a
time. The training thread only receives finished tensors (copies), so the buffer never changes
under a minibatch that is reading it, and no DGL RPC is issued from two threads at once: DGL 2.1
has one receive queue per process and its remote_call/recv_responses take whatever response
comes next, so a second RPC thread would take the first one's responses.

Sampling runs beside the pull in DistDGL's sampler processes (train.samplers > 0: each its own
RPC client, the neighbour sampling of the next minibatches runs while this thread pulls); with
none it runs in this thread before the pull. The loader runs on across epoch boundaries, except
after an epoch the training thread follows with RPC of its own (evaluation: `hold_after`).

With train.pulls_in_flight 2 the loader starts minibatch i+1 (plans it, commits its round to the
buffer's index, sends its pull) before it receives i's rows and hands i over, so the link
carries i+1's rows while the loader assembles i (rudder.prefetch.step says why the buffer stays
right). The policy then plans i+1 before it observes i. Pulls stay in flight over an epoch's
end (its end is handed over after its last minibatch, whenever that is received) unless the
training thread evaluates after it, or it is the last: then the end receives everything.

The policy's view of the future (a fixed `lookahead` of minibatches sampled ahead; with
sample_next_epoch everything sampled, below) slides on over an epoch's end: once epoch e's last minibatch
is sampled, epoch e+1's iterator opens and its first ones are sampled as the window needs them,
before e's last hand-over (so still before an evaluation after e). A round near the end of e then keeps rows that e+1's start uses (a replay of the
study's synth-medium traces: 1 point fewer rows of `none`, most of the gap to Belady), and the
replays' view is the same (rudder.sim.replay.PositionTrace.ahead).

sample_next_epoch (prefetch.schedule_ahead): the policy plans over the rest of the epoch as
sampled so far. Epoch e+1's minibatches are sampled during epoch e, after the hand-overs of e's
(while the training thread computes), so e+1 starts with nothing left to sample. The first epoch
has nothing before it: it starts once 1 + `start_depth` of its minibatches are sampled (its
policy's future grows as the rest are sampled, during it). After each hand-over the loader
samples its share of what is left (the rest of this epoch first: DGL 2.1's iter() for e+1 would
reset the loader e still samples from, then e+1's), enough that all of e+1 is sampled before
e's end is handed over, so no sampling RPC follows an epoch the training thread evaluates
after. With sampler processes (train.samplers > 0) "sampling" here is collecting what they
sampled in the background: e+1's sampling then runs beside e's pulls. The policy sees
everything sampled: the rest of e, then what of e+1 is sampled so far (`known_ahead` says how
much, for the replays), so a round near e's end keeps what e+1's start uses (replays: Belady's
hits or within 0.5% of them, where the rest of e alone got 0.93-0.98). The loader then holds
about one epoch's sampled minibatches at any time (the rest of e plus e+1's so far), plus the
queue's.
"""
from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from rudder.config import WHOLE_EPOCH
from rudder.prefetch.features import BufferedFeatures, FetchStats
from rudder.prefetch.metrics import MetricsCollector, buffer_state
from rudder.prefetch.past import PastCounterfactual
from rudder.prefetch.policy import Policy, StepInfo
from rudder.records import MinibatchRecord


@dataclass
class Minibatch:
    epoch: int
    step: int
    global_step: int
    blocks: Any
    feats: torch.Tensor
    labels: torch.Tensor
    input_nodes: torch.Tensor
    stats: FetchStats
    t_sample: float
    window: dict | None = None  # the window record this minibatch closed, if any
    stall: float = 0.0  # seconds the training thread waited for this minibatch
    mismatched_rows: int = 0  # check mode: rows that differ from a direct pull
    t_policy: float = 0.0  # seconds the loader spent in policy.plan + policy.observe
    record: MinibatchRecord | None = None  # as the loader saw it; the trainer completes it


@dataclass
class _Done:
    error: BaseException | None = None


@dataclass
class _EpochEnd:
    epoch: int


class _Sampled:
    """One epoch's minibatches sampled so far and not yet assembled, in order: each entry
    (input_nodes, seeds, blocks, t_sample, t_sample_wait, remote ids). The epoch's iterator is
    opened on the first sample (after the previous epoch's sampling ended: DGL 2.1's loader
    resets itself on iter(), so one loader object serves every epoch)."""

    def __init__(self, open_iter, steps: int, remote_ids):
        self.open_iter, self.left, self.remote_ids = open_iter, steps, remote_ids
        self.it = None
        self.ahead: collections.deque = collections.deque()
        self.done = steps <= 0  # nothing more to sample: the epoch's steps, or the loader ended

    def sample(self) -> bool:
        """Samples the next minibatch; False when the epoch has no more."""
        if self.done:
            return False
        if self.it is None:
            self.it = iter(self.open_iter())
        t0 = time.perf_counter()
        try:
            got = next(self.it)
        except StopIteration:
            self.done = True
            return False
        t_wait = time.perf_counter() - t0
        self.left -= 1
        # (input_nodes, seeds, blocks[, sampling seconds where it ran: TimedCollate])
        t_s = got[3] if len(got) > 3 else t_wait
        self.ahead.append((got[0], got[1], got[2], t_s, t_wait, self.remote_ids(got[0])))
        if self.left <= 0:
            self.finish()
        return True

    def fill(self, n: int) -> None:
        """Samples until n minibatches wait (or the epoch has no more)."""
        while len(self.ahead) < n and self.sample():
            pass

    def finish(self) -> None:
        """No more sampling: an epoch cut short (train.max_steps_per_epoch, the least steps over
        the ranks) samples no minibatch it will not train (none of its time, and the view goes
        from the epoch as trained to the next one's first: what the replays see, rudder.sim.replay)."""
        if self.done:  # once: by now the next epoch's iterator may be this same loader object
            return     # (the window that slides over the boundary opens it), its pending the next's
        self.done = True
        if self.it is not None:
            discard_pending(self.it)


class TimedCollate:
    """A DGL collate function (NodeCollator.collate) that also returns its own seconds: the
    sampling work, measured where it runs (a sampler process or the loader thread). Picklable,
    for DistDGL's sampler processes."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, items):
        t0 = time.perf_counter()
        input_nodes, seeds, blocks = self.collate(items)
        return input_nodes, seeds, blocks, time.perf_counter() - t0


@dataclass
class PipelineState:
    """Values the training thread shares back with the loader (read for window aggregates)."""

    last_t_compute: float = 0.0
    last_t_stall: float = 0.0
    extra: dict = field(default_factory=dict)


class MinibatchPipeline:
    def __init__(
        self,
        sample_iter_factory,  # epoch -> iterator of (input_nodes, seeds, blocks[, t_sample])
        feats: BufferedFeatures,
        labels,  # DistTensor of labels
        policy: Policy,
        collector: MetricsCollector,
        steps_per_epoch: int,
        epochs: int,
        lookahead: int,
        queue_size: int = 2,
        trace_writer=None,
        check: bool = False,
        hold_after=None,  # epoch -> True: the training thread issues DGL RPC after it (evaluation)
        sample_next_epoch: bool = False,  # sample epoch e+1 during e (schedule_ahead)
        start_depth: int | None = None,  # sample_next_epoch: the first epoch's future at its start
        pulls_in_flight: int = 1,  # >1: the next minibatches' pulls are sent before this one's is received
        past_thread: bool = False,  # the past counterfactual's replays off the loader thread (rudder.prefetch.past)
    ):
        self.sample_iter_factory = sample_iter_factory
        self.feats = feats
        self.labels = labels
        self.policy = policy
        self.collector = collector
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.lookahead = lookahead
        self.trace_writer = trace_writer
        self.check = check  # compare every assembled row with a plain pull (an extra RPC)
        self.hold_after = hold_after or (lambda epoch: False)
        self.sample_next_epoch = sample_next_epoch
        self.start_depth = lookahead if start_depth is None else min(start_depth, lookahead)
        self.state = PipelineState()
        self.pulls_in_flight = pulls_in_flight
        self._pending: collections.deque[_Started] = collections.deque()
        self.epoch_ends_in_flight = 0  # epoch ends crossed with a pull still on the wire
        # the window records' past counterfactual when the policy wants it (the replay's code)
        self.past = PastCounterfactual.of(policy, background=past_thread)
        self._q: queue.Queue = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._asked = threading.Condition()
        self._asked_epoch = -1  # the last epoch the training thread asked for

    # ---- training-thread side -------------------------------------------------------------
    def epoch(self, epoch: int) -> Iterator[Minibatch]:
        """Yields `epoch`'s minibatches (the loader, started on the first call, runs on from
        there across the epochs); t_stall = time waited."""
        with self._asked:
            self._asked_epoch = epoch
            self._asked.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(epoch,), name="loader", daemon=True)
            self._thread.start()
        while True:
            t0 = time.perf_counter()
            item = self._q.get()
            stall = time.perf_counter() - t0
            if isinstance(item, _EpochEnd):
                if item.epoch != epoch:
                    raise RuntimeError(f"loader ended epoch {item.epoch} while epoch {epoch} was asked for")
                if epoch == self.epochs - 1:
                    self._thread.join()  # it only puts _Done now: no RPC of the loader follows
                return
            if isinstance(item, _Done):
                self._thread.join()
                if item.error is not None:
                    raise RuntimeError(f"loader thread failed: {item.error!r}") from item.error
                raise RuntimeError(f"loader ended before epoch {epoch} did")
            self.state.last_t_stall = stall
            item.stall = stall
            yield item

    def stop(self) -> None:
        self._stop.set()
        with self._asked:
            self._asked.notify_all()

    # ---- loader-thread side ---------------------------------------------------------------
    def _run(self, first: int) -> None:
        try:
            cur = self._sampled(first)
            for epoch in range(first, self.epochs):
                if epoch > first and self.hold_after(epoch - 1):
                    with self._asked:  # the training thread evaluates (RPC) before asking
                        self._asked.wait_for(lambda: self._asked_epoch >= epoch or self._stop.is_set())
                if self._stop.is_set():
                    break
                # the next epoch, opened lazily: sampled during this one with sample_next_epoch,
                # else only its first minibatches, once this epoch's last one is sampled, for the
                # window that slides over the boundary (the iterator of one epoch at a time)
                nxt = self._sampled(epoch + 1) if epoch + 1 < self.epochs else None
                if not self._load_epoch(epoch, cur, nxt):
                    break
                cur.finish()
                cur = nxt  # None after the last epoch
            self._q.put(_Done())
        except BaseException as exc:  # surfaced in the training thread
            self._q.put(_Done(exc))
        finally:
            self.past.shutdown()  # no more windows (those handed to its thread still finish)

    def _sampled(self, epoch: int) -> _Sampled:
        steps = self.steps_per_epoch if epoch < self.epochs else 0
        return _Sampled(lambda: self.sample_iter_factory(epoch), steps, self.feats.remote_ids)

    def _load_epoch(self, epoch: int, cur: _Sampled, nxt: _Sampled | None) -> bool:
        """Hands over epoch `epoch`'s minibatches (sampled in `cur`, 1 + lookahead of them ahead;
        with sample_next_epoch 1 + start_depth, the rest of `cur` and then all of `nxt`, the
        next epoch's, sampled after the hand-overs and finished before this returns). False:
        stopped."""
        base = epoch * self.steps_per_epoch
        depth = self.start_depth if self.sample_next_epoch else self.lookahead
        for step in range(self.steps_per_epoch):
            if self._stop.is_set():
                return False
            t_load = time.perf_counter()
            cur.fill(1 + depth)  # the current minibatch and the known future
            if not cur.ahead:
                break
            beyond = None
            if nxt is not None and self.sample_next_epoch:
                beyond = nxt.ahead  # what of the next epoch is sampled so far (cur's rest first)
            elif nxt is not None and cur.done and self.lookahead < WHOLE_EPOCH:
                nxt.fill(1 + depth - len(cur.ahead))  # the window goes on into the next epoch
                beyond = nxt.ahead
            self._put(epoch, step, base + step, cur.ahead, t_load, beyond)
            if self.sample_next_epoch:  # after the hand-over: the training thread computes meanwhile
                _sample_share(cur, nxt, self.steps_per_epoch - step)
        # pulls stay in flight into the next epoch when no RPC of the training thread follows
        carry = bool(self._pending) and nxt is not None and not self.hold_after(epoch)
        if not carry:
            self._drain()
        while self.sample_next_epoch and nxt is not None and not self._stop.is_set() and nxt.sample():
            pass  # the rest of e+1 (an epoch shorter than its steps): none after e's end
        if carry:
            self._pending[-1].ends.append(epoch)  # its hand-over ends the epoch
            self.epoch_ends_in_flight += 1
        else:
            self._q.put(_EpochEnd(epoch))
        return not self._stop.is_set()

    def _put(self, epoch: int, step: int, gstep: int, ahead: collections.deque, t_load: float,
             beyond: collections.deque | None = None) -> None:
        """Starts the first minibatch of `ahead` (`_start`) and hands over the oldest started
        one once `pulls_in_flight` have their pulls on the wire."""
        self._pending.append(self._start(epoch, step, gstep, ahead, t_load, beyond))
        if len(self._pending) >= self.pulls_in_flight:
            self._finish(self._pending.popleft())

    def _drain(self) -> None:
        """Hands over every started minibatch (an epoch's end that the training thread follows
        with RPC of its own, or the last: nothing stays in flight over it)."""
        while self._pending:
            self._finish(self._pending.popleft())

    def _start(self, epoch: int, step: int, gstep: int, ahead: collections.deque, t_load: float,
               beyond: collections.deque | None = None) -> _Started:
        """Plans the first minibatch of `ahead` and sends its pull; the policy sees the next
        `lookahead` of the rest of the epoch, then of `beyond` (the next epoch's first)."""
        input_nodes, seeds, blocks, t_sample, t_sample_wait, remote = ahead.popleft()
        following = ahead if beyond is None else itertools.chain(ahead, beyond)
        future = [a[5] for a in itertools.islice(following, self.lookahead)]
        buf = self.feats.buffer
        info = StepInfo(
            epoch=epoch, step=step, global_step=gstep,
            remaining_steps=self.epochs * self.steps_per_epoch - gstep,
            future_remote=future,
            stale_slots=buf.stale_count() if buf is not None else 0,
            buffer_fill=buf.size if buf is not None else 0,
        )
        t_pol = time.perf_counter()
        if gstep == 0 and buf is not None:  # what the buffer lacks of the known future, once
            self.policy.start(lambda: buffer_state(buf, [remote, *future]))
        plan = self.policy.plan(info) if buf is not None else None
        t_pol = time.perf_counter() - t_pol  # the agent's cost to training: queue polls only
        if self.trace_writer is not None:
            self.trace_writer.add(epoch, remote, input_rows=int(input_nodes.numel()))
        if buf is not None:
            self.past.step(buf, remote, future)
        t_asm = time.perf_counter()
        fetch = self.feats.start(input_nodes, plan, future, remote=remote)
        t_end = time.perf_counter()
        return _Started(epoch, step, gstep, blocks, seeds, input_nodes, t_sample, t_sample_wait,
                        future, fetch, t_pol, t_end - t_asm, t_end - t_load)

    def _finish(self, s: _Started) -> None:
        """Receives a started minibatch's rows and hands it over."""
        t0 = time.perf_counter()
        x, stats = self.feats.finish(s.fetch)
        t_labels = time.perf_counter()
        y = self.labels[s.seeds]
        t_labels = time.perf_counter() - t_labels
        t_asm = s.t_assemble + time.perf_counter() - t0 - stats.t_fetch  # all but the pull itself
        bad = 0
        if self.check:  # here, not in the training thread: DGL RPC stays on one thread
            bad = int((x != self.feats.pull(s.input_nodes).to(x.device)).any(dim=1).sum())
        # the window aggregates see the training thread's last compute and stall times
        rec = MinibatchRecord.of_step(s.epoch, s.step, s.gstep, stats, t_sample=s.t_sample,
                                      t_compute=self.state.last_t_compute,
                                      t_stall=self.state.last_t_stall,
                                      t_sample_wait=s.t_sample_wait, t_plan=s.t_plan,
                                      t_assemble=max(t_asm, 0.0), t_labels=t_labels)
        record = rec.to_dict()
        window = self.collector.add(record, lambda: buffer_state(self.feats.buffer, s.future, roll=True))
        if window is not None:
            self.past.close(window)  # before the policy observes it (past_thread: a future of it)
        t_obs = time.perf_counter()
        self.policy.observe(record, window)
        t_pol = s.t_plan + time.perf_counter() - t_obs
        rec.t_load = s.t_load + time.perf_counter() - t0  # the loader's own time on it
        self._q.put(Minibatch(s.epoch, s.step, s.gstep, s.blocks, x, y, s.input_nodes, stats, s.t_sample,
                              window, mismatched_rows=bad, t_policy=t_pol, record=rec))
        for epoch in s.ends:
            self._q.put(_EpochEnd(epoch))


@dataclass
class _Started:
    """A minibatch planned and its pull sent, not yet handed over (MinibatchPipeline._start)."""

    epoch: int
    step: int
    gstep: int
    blocks: Any
    seeds: torch.Tensor
    input_nodes: torch.Tensor
    t_sample: float
    t_sample_wait: float
    future: list
    fetch: Any  # BufferedFeatures.start's PendingFetch
    t_plan: float  # the policy's plan (its observe is added at the hand-over: t_policy)
    t_assemble: float  # so far: the start's, pull send included (its t_fetch is subtracted)
    t_load: float  # so far: from the loader's turn on it to its pull sent
    # the epochs its hand-over ends (its own, when it is the last one and the next epoch
    # started before it was received; an epoch with no minibatch too)
    ends: list = field(default_factory=list)


def _sample_share(cur: _Sampled, nxt: _Sampled | None, slots: int) -> None:
    """Samples this hand-over's share of what `cur` and `nxt` have left, spread evenly over the
    `slots` after this and the epoch's later hand-overs, so the last leaves nothing (the first
    epoch has its own rest to sample besides the next one's: about two per hand-over; later
    epochs one). `cur` first: `nxt`'s iter() would reset the DGL loader `cur` still samples from."""
    left = (0 if cur.done else cur.left) + (0 if nxt is None or nxt.done else nxt.left)
    for _ in range(_share(left, slots)):
        if not cur.sample() and (nxt is None or not nxt.sample()):
            return


def _share(left: int, slots: int) -> int:
    """What one hand-over samples of `left` minibatches with `slots` hand-overs to go (ceil)."""
    return -(-left // max(slots, 1))


def known_ahead(lengths: list[int], start_depth: int) -> list[int]:
    """sample_next_epoch's schedule, for the replays: for each minibatch (numbered over the run,
    epochs of `lengths` minibatches), one past the last minibatch sampled when the loader plans
    it. The first epoch samples 1 + start_depth before its first plan and 1 + start_depth ahead
    of each; after each hand-over `_sample_share` samples its share of the rest of this epoch and
    the next, in order; an epoch's end samples what is left of the next. So the known future of
    minibatch g is minibatches g + 1 .. known[g] - 1, contiguous over the epoch's end."""
    known, sampled, end = [], 0, 0
    for e, steps in enumerate(lengths):
        start, end = end, end + steps
        nxt_end = end + (lengths[e + 1] if e + 1 < len(lengths) else 0)
        for s in range(steps):
            sampled = max(sampled, min(end, start + s + 1 + start_depth))  # cur.fill(1 + depth)
            known.append(sampled)
            left = nxt_end - sampled
            sampled += min(left, _share(left, steps - s))
        sampled = nxt_end
    return known


def discard_pending(it) -> int:
    """Receives and drops what DGL's DistDataLoader `it` still has its sampler processes
    sampling: an epoch cut short (train.max_steps_per_epoch, the least steps over the ranks)
    leaves them in the pool's result queue, and DGL's next iter() would hand them out as the
    next epoch's first minibatches. Returns how many were dropped (0 without sampler processes)."""
    pending = getattr(it, "num_pending", 0)
    if getattr(it, "pool", None) is None or pending <= 0:
        return 0
    for _ in range(pending):
        it._get_data_from_result_queue()
    it.num_pending = 0
    return pending
