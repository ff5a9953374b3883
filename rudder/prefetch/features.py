"""The feature path: where DGL's example does `g.ndata["features"][input_nodes]`, Rudder does
`feats[input_nodes]` on a BufferedFeatures, a duck-typed wrapper around the DistTensor.

Local rows come from the local partition, hits from the buffer, and the misses together with
the rows a replacement admits arrive in ONE pull (DistTensor's kvstore pull already serves the
local part from shared memory and batches one request per remote machine).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.policy import Replace
from rudder.prefetch.step import begin_step, finish_step


@dataclass
class FetchStats:
    input_rows: int = 0
    local_rows: int = 0
    remote_rows: int = 0
    hits: int = 0
    misses: int = 0
    replaced_rows: int = 0  # rows pulled only to be admitted into the buffer
    admitted_rows: int = 0  # slots changed this minibatch (admitted misses cost no extra row)
    fetched_rows: int = 0  # misses + replaced_rows
    fetched_bytes: int = 0
    t_fetch: float = 0.0  # the pull (network)
    # what the buffer adds: lookup + bookkeeping + replacement + writing hit rows into the
    # output (the local/remote split is not counted: DistDGL's own pull does it too)
    t_buffer: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class BufferedFeatures:
    def __init__(
        self,
        dist_feat,  # a DistTensor (or any tensor-like with __getitem__ over ids)
        owner_of: Callable[[torch.Tensor], torch.Tensor],  # ids -> partition id
        part_id: int,
        buffer: HaloBuffer | None,
        local_id: int,  # any node this partition owns: pulled in place of a buffer hit
    ):
        self.dist_feat = dist_feat
        self.owner_of = owner_of
        self.part_id = part_id
        self.buffer = buffer
        self.local_id = int(local_id)
        self.row_bytes = int(dist_feat.shape[1]) * torch.empty(0, dtype=dist_feat.dtype).element_size()

    def __getitem__(self, input_nodes: torch.Tensor) -> torch.Tensor:
        """Plain DistTensor interface: lookup without replacement."""
        return self.fetch(input_nodes)[0]

    def remote_ids(self, input_nodes: torch.Tensor) -> torch.Tensor:
        return input_nodes[self.owner_of(input_nodes) != self.part_id]

    def fetch(
        self, input_nodes: torch.Tensor, plan: Replace | None = None, future: list[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, FetchStats]:
        """The output is the pull itself, in input order: each buffer hit's id is swapped for
        `local_id` (a local row, no network) and overwritten with the buffered row afterwards,
        and the newcomers pulled only for the buffer ride at the end. Assembling into a fresh
        tensor instead would copy (and page-fault in) every local row a second time."""
        st = FetchStats(input_rows=int(input_nodes.numel()))
        remote_idx = torch.nonzero(self.owner_of(input_nodes) != self.part_id).flatten()
        st.remote_rows = int(remote_idx.numel())
        st.local_rows = st.input_rows - st.remote_rows
        if self.buffer is None:  # plain DistDGL
            t1 = time.perf_counter()
            out = self.dist_feat[input_nodes]
            st.t_fetch = time.perf_counter() - t1
            st.misses = st.fetched_rows = st.remote_rows
            st.fetched_bytes = st.fetched_rows * self.row_bytes
            return out, st

        t0 = time.perf_counter()
        step = begin_step(self.buffer, input_nodes[remote_idx], plan, future)
        hit_idx = remote_idx[step.hit_mask]
        pull_ids = input_nodes.clone()
        pull_ids[hit_idx] = self.local_id
        pull_ids = torch.cat([pull_ids, step.extra_ids])
        t_book = time.perf_counter() - t0

        t1 = time.perf_counter()
        rows = self.dist_feat[pull_ids]
        st.t_fetch = time.perf_counter() - t1

        t2 = time.perf_counter()
        n = input_nodes.numel()
        out = rows[:n]
        out.index_copy_(0, hit_idx, self.buffer.gather(step.hit_slots))
        # rows of step.pull_ids (misses, then extras) inside `rows`, for the newcomers
        where = torch.cat([remote_idx[~step.hit_mask], torch.arange(n, n + step.extra_ids.numel())])
        t_apply = time.perf_counter() - t2 + finish_step(self.buffer, step, rows, where)

        st.hits, st.misses = step.hits, step.misses
        st.replaced_rows = int(step.extra_ids.numel())
        st.admitted_rows = int(step.newcomers.numel())
        st.fetched_rows = st.misses + st.replaced_rows
        st.fetched_bytes = st.fetched_rows * self.row_bytes
        st.t_buffer = t_book + t_apply
        return out, st
