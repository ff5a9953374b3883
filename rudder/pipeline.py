"""MinibatchPipeline: samples minibatches ahead and assembles their features in a background
thread while the training thread computes (bounded queue: memory stays bounded).

The loader thread owns the buffer and the policy: sampling, every DGL RPC of training, the
buffer lookup/replacement and the policy's plan/observe all run there, one minibatch at a time.
The training thread only receives finished tensors (copies), so the buffer never changes under a
minibatch that is reading it, and no DGL RPC is issued from two threads at once.
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
class PipelineState:
    """Values the training thread shares back with the loader (read for window aggregates)."""

    last_t_compute: float = 0.0
    last_t_stall: float = 0.0
    extra: dict = field(default_factory=dict)


class MinibatchPipeline:
    def __init__(
        self,
        sample_iter_factory,  # epoch -> iterator of (input_nodes, seeds, blocks)
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
        self.state = PipelineState()
        self._q: queue.Queue = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- training-thread side -------------------------------------------------------------
    def epoch(self, epoch: int) -> Iterator[Minibatch]:
        """Starts the loader for `epoch` and yields its minibatches; t_stall = time waited."""
        self._thread = threading.Thread(target=self._run, args=(epoch,), name=f"loader-e{epoch}", daemon=True)
        self._thread.start()
        while True:
            t0 = time.perf_counter()
            item = self._q.get()
            stall = time.perf_counter() - t0
            if isinstance(item, _Done):
                self._thread.join()
                if item.error is not None:
                    raise RuntimeError(f"loader thread failed: {item.error!r}") from item.error
                return
            self.state.last_t_stall = stall
            item.stall = stall
            yield item

    def stop(self) -> None:
        self._stop.set()

    # ---- loader-thread side ---------------------------------------------------------------
    def _run(self, epoch: int) -> None:
        try:
            self._load_epoch(epoch)
            self._q.put(_Done())
        except BaseException as exc:  # surfaced in the training thread
            self._q.put(_Done(exc))

    def _load_epoch(self, epoch: int) -> None:
        it = iter(self.sample_iter_factory(epoch))
        ahead: collections.deque = collections.deque()  # sampled, not yet assembled
        exhausted = False
        base = epoch * self.steps_per_epoch
        for step in range(self.steps_per_epoch):
            if self._stop.is_set():
                return
            # keep 1 + lookahead minibatches sampled (the current one and the known future)
            while not exhausted and len(ahead) < 1 + self.lookahead:
                t0 = time.perf_counter()
                try:
                    input_nodes, seeds, blocks = next(it)
                except StopIteration:
                    exhausted = True
                    break
                t_s = time.perf_counter() - t0
                ahead.append((input_nodes, seeds, blocks, t_s, self.feats.remote_ids(input_nodes)))
            if not ahead:
                break
            input_nodes, seeds, blocks, t_sample, remote = ahead.popleft()
            future = [a[4] for a in ahead]
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
            if self.trace_writer is not None:
                self.trace_writer.add(epoch, remote, input_rows=int(input_nodes.numel()))
            x, stats = self.feats.fetch(input_nodes, plan, future, remote=remote)
            y = self.labels[seeds]
            bad = 0
            if self.check:  # here, not in the training thread: DGL RPC stays on one thread
                bad = int((x != self.feats.dist_feat[input_nodes].to(x.device)).any(dim=1).sum())
            # the window aggregates see the training thread's last compute and stall times
            rec = MinibatchRecord.of_step(epoch, step, gstep, stats, t_sample=t_sample,
                                          t_compute=self.state.last_t_compute,
                                          t_stall=self.state.last_t_stall)
            record = rec.to_dict()
            window = self.collector.add(record, lambda: buffer_state(self.feats.buffer, future))
            t_obs = time.perf_counter()
            self.policy.observe(record, window)
            t_pol += time.perf_counter() - t_obs
            self._q.put(Minibatch(epoch, step, gstep, blocks, x, y, input_nodes, stats, t_sample,
                                  window, mismatched_rows=bad, t_policy=t_pol, record=rec))
