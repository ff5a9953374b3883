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
    # what the buffer adds: lookup + bookkeeping + replacement + assembling the output from its
    # two sources (the local/remote split is not counted: DistDGL's own pull does it too)
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
    ):
        self.dist_feat = dist_feat
        self.owner_of = owner_of
        self.part_id = part_id
        self.buffer = buffer
        self.row_bytes = int(dist_feat.shape[1]) * torch.empty(0, dtype=dist_feat.dtype).element_size()

    def __getitem__(self, input_nodes: torch.Tensor) -> torch.Tensor:
        """Plain DistTensor interface: lookup without replacement."""
        return self.fetch(input_nodes)[0]

    def remote_ids(self, input_nodes: torch.Tensor) -> torch.Tensor:
        return input_nodes[self.owner_of(input_nodes) != self.part_id]

    def fetch(
        self, input_nodes: torch.Tensor, plan: Replace | None = None, future: list[torch.Tensor] = ()
    ) -> tuple[torch.Tensor, FetchStats]:
        st = FetchStats(input_rows=int(input_nodes.numel()))
        is_local = self.owner_of(input_nodes) == self.part_id
        local_idx = torch.nonzero(is_local).flatten()
        remote_idx = torch.nonzero(~is_local).flatten()
        st.local_rows, st.remote_rows = int(local_idx.numel()), int(remote_idx.numel())
        if self.buffer is None:  # plain DistDGL
            t1 = time.perf_counter()
            out = self.dist_feat[input_nodes]
            st.t_fetch = time.perf_counter() - t1
            st.misses = st.fetched_rows = st.remote_rows
            st.fetched_bytes = st.fetched_rows * self.row_bytes
            return out, st

        t0 = time.perf_counter()
        remote = input_nodes[remote_idx]
        step = begin_step(self.buffer, remote, plan, future)
        out = torch.empty((input_nodes.numel(), self.dist_feat.shape[1]), dtype=self.dist_feat.dtype)
        out[remote_idx[step.hit_mask]] = self.buffer.gather(step.hit_slots)
        t_book = time.perf_counter() - t0

        pull_ids = torch.cat([input_nodes[local_idx], step.pull_ids])
        t1 = time.perf_counter()
        rows = self.dist_feat[pull_ids]
        st.t_fetch = time.perf_counter() - t1

        t2 = time.perf_counter()
        L = local_idx.numel()
        out[local_idx] = rows[:L]
        out[remote_idx[~step.hit_mask]] = rows[L : L + step.misses]
        t_apply = time.perf_counter() - t2 + finish_step(self.buffer, step, rows[L:])

        st.hits, st.misses = step.hits, step.misses
        st.replaced_rows = int(step.extra_ids.numel())
        st.admitted_rows = int(step.newcomers.numel())
        st.fetched_rows = st.misses + st.replaced_rows
        st.fetched_bytes = st.fetched_rows * self.row_bytes
        st.t_buffer = t_book + t_apply
        return out, st
