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
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from rudder.prefetch.features import BufferedFeatures, FetchStats
from rudder.prefetch.metrics import MetricsCollector, buffer_state
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
        self.state = PipelineState()
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
            for epoch in range(first, self.epochs):
                if epoch > first and self.hold_after(epoch - 1):
                    with self._asked:  # the training thread evaluates (RPC) before asking
                        self._asked.wait_for(lambda: self._asked_epoch >= epoch or self._stop.is_set())
                if self._stop.is_set():
                    break
                self._load_epoch(epoch)
                self._q.put(_EpochEnd(epoch))
            self._q.put(_Done())
        except BaseException as exc:  # surfaced in the training thread
            self._q.put(_Done(exc))

    def _load_epoch(self, epoch: int) -> None:
        it = iter(self.sample_iter_factory(epoch))
        ahead: collections.deque = collections.deque()  # sampled, not yet assembled
        exhausted = False
        # an epoch cut short (train.max_steps_per_epoch, the least steps over the ranks) samples
        # no minibatch it will not train: none of its time, and the view stays within the epoch
        # as trained (what the replays see: rudder.sim.replay)
        left = self.steps_per_epoch
        base = epoch * self.steps_per_epoch
        for step in range(self.steps_per_epoch):
            if self._stop.is_set():
                return
            t_load = time.perf_counter()
            # keep 1 + lookahead minibatches sampled (the current one and the known future)
            while not exhausted and len(ahead) < 1 + self.lookahead and left > 0:
                t0 = time.perf_counter()
                try:
                    got = next(it)
                except StopIteration:
                    exhausted = True
                    break
                left -= 1
                t_wait = time.perf_counter() - t0
                # (input_nodes, seeds, blocks[, sampling seconds where it ran: TimedCollate])
                t_s = got[3] if len(got) > 3 else t_wait
                input_nodes = got[0]
                ahead.append((input_nodes, got[1], got[2], t_s, t_wait, self.feats.remote_ids(input_nodes)))
            if not ahead:
                break
            input_nodes, seeds, blocks, t_sample, t_sample_wait, remote = ahead.popleft()
            future = [a[5] for a in ahead]
            gstep = base + step
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
            t_plan = t_pol
            if self.trace_writer is not None:
                self.trace_writer.add(epoch, remote, input_rows=int(input_nodes.numel()))
            t_asm = time.perf_counter()
            x, stats = self.feats.fetch(input_nodes, plan, future, remote=remote)
            t_labels = time.perf_counter()
            y = self.labels[seeds]
            t_labels = time.perf_counter() - t_labels
            t_asm = time.perf_counter() - t_asm - stats.t_fetch  # all but the pull itself
            bad = 0
            if self.check:  # here, not in the training thread: DGL RPC stays on one thread
                bad = int((x != self.feats.dist_feat[input_nodes].to(x.device)).any(dim=1).sum())
            # the window aggregates see the training thread's last compute and stall times
            rec = MinibatchRecord.of_step(epoch, step, gstep, stats, t_sample=t_sample,
                                          t_compute=self.state.last_t_compute,
                                          t_stall=self.state.last_t_stall,
                                          t_sample_wait=t_sample_wait, t_plan=t_plan,
                                          t_assemble=max(t_asm, 0.0), t_labels=t_labels)
            record = rec.to_dict()
            window = self.collector.add(record, lambda: buffer_state(self.feats.buffer, future, roll=True))
            t_obs = time.perf_counter()
            self.policy.observe(record, window)
            t_pol += time.perf_counter() - t_obs
            rec.t_load = time.perf_counter() - t_load
            self._q.put(Minibatch(epoch, step, gstep, blocks, x, y, input_nodes, stats, t_sample,
                                  window, mismatched_rows=bad, t_policy=t_pol, record=rec))
        discard_pending(it)


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
