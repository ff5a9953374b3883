"""The feature path: where DGL's example does `g.ndata["features"][input_nodes]`, Rudder does
`feats[input_nodes]` on a BufferedFeatures, a duck-typed wrapper around the DistTensor.

Local rows come from the local partition, hits from the buffer, and the misses together with
the rows a replacement admits arrive in ONE pull (DistTensor's kvstore pull already serves the
local part from shared memory and batches one request per remote machine).

The output is on the training device (the buffer's). On the CPU each hit's id is swapped for a
local one in the pull and its row overwritten afterwards (no second copy of the local rows). On
a GPU ("compact" assembly) the pull leaves the hits out: only local rows, misses and newcomers
cross PCIe, the hits are written from the device-resident buffer beside them.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.policy import Replace
from rudder.prefetch.pulls import DirectPulls
from rudder.prefetch.step import StepPlan, begin_step, commit_step, finish_step
from rudder.records import StepStats


# What one minibatch did at the buffer: the records' one type for it (the simulator builds the
# same with StepStats.of_counts), so a minibatch record is made from either the same way.
FetchStats = StepStats


class BufferedFeatures:
    def __init__(
        self,
        dist_feat,  # a DistTensor (or any tensor-like with __getitem__ over ids)
        owner_of: Callable[[torch.Tensor], torch.Tensor],  # ids -> partition id
        part_id: int,
        buffer: HaloBuffer | None,
        local_id: int,  # any node this partition owns: pulled in place of a buffer hit
        device: torch.device | str | None = None,  # where rows are assembled (default: the buffer's)
        free_remote: bool = False,  # train.features_free: remote rows are local ones, nothing pulled
    ):
        if device is None:
            device = buffer.device if buffer is not None else "cpu"
        self.device = torch.device(device)
        if buffer is not None and buffer.store_features and not _same_device(buffer.device, self.device):
            raise ValueError(f"the buffer's rows are on {buffer.device}, the output on {self.device}:"
                             " they must be on the same device")
        # compact assembly on GPUs: hits stay on the device (settable, so the CPU tests run it;
        # RUDDER_COMPACT_ASSEMBLY=1 makes CPU trainers use it: the GPU path on a CPU cluster)
        self.compact = self.device.type != "cpu" or os.environ.get("RUDDER_COMPACT_ASSEMBLY") == "1"
        self.rows_to_device = 0  # rows this wrapper copied host -> device (compact assembly)
        logging.getLogger("rudder.features").info(
            "feature rows assembled on %s (%s)", self.device,
            "compact: the pull leaves buffer hits out" if self.compact else "in place of the pull")
        self.dist_feat = dist_feat
        self.owner_of = owner_of
        self.part_id = part_id
        self.buffer = buffer
        self.local_id = int(local_id)
        if free_remote and buffer is not None:
            raise ValueError("free_remote pulls no remote row: it has no buffer to fill")
        self.free_remote = free_remote
        self.row_bytes = int(dist_feat.shape[1]) * torch.empty(0, dtype=dist_feat.dtype).element_size()
        # how pulls travel: one at a time, or (rudder.prefetch.pulls.DGLPulls) several in flight
        self.pulls = DirectPulls()

    def __getitem__(self, input_nodes: torch.Tensor) -> torch.Tensor:
        """Plain DistTensor interface: lookup without replacement."""
        return self.fetch(input_nodes)[0]

    def remote_ids(self, input_nodes: torch.Tensor) -> torch.Tensor:
        return input_nodes[self.owner_of(input_nodes) != self.part_id]

    def fetch(
        self, input_nodes: torch.Tensor, plan: Replace | None = None, future: list[torch.Tensor] = (),
        remote: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, FetchStats]:
        """The minibatch's rows, in input order: `start` then `finish`."""
        return self.finish(self.start(input_nodes, plan, future, remote))

    def start(
        self, input_nodes: torch.Tensor, plan: Replace | None = None, future: list[torch.Tensor] = (),
        remote: torch.Tensor | None = None,
    ) -> "PendingFetch":
        """Looks the minibatch up, plans and commits its round, sends its pull (`finish` gets
        the rows). The pull is the output itself, in input order: each buffer hit's id is
        swapped for `local_id` (a local row, no network) and overwritten with the buffered row
        afterwards, and the newcomers pulled only for the buffer ride at the end. Assembling
        into a fresh tensor instead would copy (and page-fault in) every local row a second time.
        `remote`: this minibatch's `remote_ids(input_nodes)` tensor if the caller has it (the
        one an earlier lookahead round saw in `future`: the buffer then searches it only once)."""
        st = FetchStats(input_rows=int(input_nodes.numel()))
        remote_idx = torch.nonzero(self.owner_of(input_nodes) != self.part_id).flatten()
        st.remote_rows = int(remote_idx.numel())
        st.local_rows = st.input_rows - st.remote_rows
        if self.buffer is None:  # plain DistDGL, or (free_remote) the features-free bound
            ids = input_nodes.clone().index_fill_(0, remote_idx, self.local_id) if self.free_remote else input_nodes
            t1 = time.perf_counter()
            sent = self.pulls.send(self.dist_feat, ids)
            st.t_fetch = time.perf_counter() - t1
            return PendingFetch(st, sent, remote_idx)

        t0 = time.perf_counter()
        step = begin_step(self.buffer, input_nodes[remote_idx] if remote is None else remote, plan, future)
        commit_step(self.buffer, step)  # a minibatch started after this one sees its newcomers
        hit_idx = remote_idx.masked_select(step.hit_mask)  # 1-D x[mask], a few times faster
        kept_idx = None
        if self.compact:
            keep = torch.ones(st.input_rows, dtype=torch.bool)
            keep[hit_idx] = False
            kept_idx = torch.nonzero(keep).flatten()  # output rows that come from the pull
            pull_ids = torch.cat([input_nodes[kept_idx], step.extra_ids])
        else:
            pull_ids = torch.cat([input_nodes, step.extra_ids]).index_fill_(0, hit_idx, self.local_id)
        t1 = time.perf_counter()
        sent = self.pulls.send(self.dist_feat, pull_ids)
        st.t_fetch = time.perf_counter() - t1
        st.t_buffer = t1 - t0
        return PendingFetch(st, sent, remote_idx, step, hit_idx, kept_idx)

    def finish(self, p: "PendingFetch") -> tuple[torch.Tensor, FetchStats]:
        """Receives `p`'s pull (in the order the pulls were started), writes the hits into it and
        the newcomers into the buffer."""
        st, step = p.st, p.step
        t1 = time.perf_counter()
        rows = self.pulls.receive(p.sent)
        if self.buffer is None or self.compact:
            rows = self._to_device(rows)
        st.t_fetch += time.perf_counter() - t1
        if self.buffer is None:
            st.misses = st.fetched_rows = 0 if self.free_remote else st.remote_rows
            st.fetched_bytes = st.fetched_rows * self.row_bytes
            return rows, st

        t2 = time.perf_counter()
        n = st.input_rows
        if self.compact:
            out = rows.new_empty((n, rows.shape[1]))
            m = p.kept_idx.numel()
            out.index_copy_(0, p.kept_idx.to(self.device), rows[:m])
            self.buffer.gather_into(out, p.hit_idx, step.hit_slots)
            # position of each miss inside `rows` (misses, then extras: for the newcomers)
            pos_in_rows = torch.full((n,), -1, dtype=torch.int64).index_copy_(0, p.kept_idx, torch.arange(m))
            where = torch.cat([pos_in_rows[p.remote_idx.masked_select(~step.hit_mask)],
                               torch.arange(m, m + step.extra_ids.numel())]).to(self.device)
        else:
            out = rows[:n]
            self.buffer.gather_into(out, p.hit_idx, step.hit_slots)
            # rows of step.pull_ids (misses, then extras) inside `rows`, for the newcomers
            where = torch.cat([p.remote_idx.masked_select(~step.hit_mask), torch.arange(n, n + step.extra_ids.numel())])
        t_apply = time.perf_counter() - t2 + finish_step(self.buffer, step, rows, where)

        st.hits, st.misses = step.hits, step.misses
        st.replaced_rows = int(step.extra_ids.numel())
        st.admitted_rows = int(step.newcomers.numel())
        st.fetched_rows = st.misses + st.replaced_rows
        st.fetched_bytes = st.fetched_rows * self.row_bytes
        st.t_buffer += t_apply
        return out, st

    def pull(self, ids: torch.Tensor) -> torch.Tensor:
        """A plain pull of `ids` now (the check's: DGL's own), safe while other pulls are in flight."""
        return self.pulls.pull(self.dist_feat, ids)

    def _to_device(self, rows: torch.Tensor) -> torch.Tensor:
        """Pulled rows (host) -> the device; counted in compact assembly, the host->device copy
        on a GPU (a no-op when the CPU tests run compact assembly)."""
        if self.compact:
            self.rows_to_device += int(rows.shape[0])
        return rows.to(self.device)


@dataclass
class PendingFetch:
    """A minibatch between BufferedFeatures.start and finish: planned, its pull sent."""

    st: FetchStats
    sent: Any  # the pull, as its Pulls sent it
    remote_idx: torch.Tensor  # input positions of the remote ids
    step: StepPlan | None = None  # the buffer's step (None without a buffer)
    hit_idx: torch.Tensor | None = None  # input positions of the buffer hits
    kept_idx: torch.Tensor | None = None  # compact assembly: input positions the pull serves


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)  # "cuda" is cuda:0 here
