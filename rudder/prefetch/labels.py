"""A trainer's seed labels, read once: where DGL's example does `g.ndata["labels"][seeds]` per
minibatch, the pipeline reads SeedLabels[seeds], a local gather.

Labels never change, and a trainer's seeds are a fixed set (its `node_split`). The DistTensor
read is a local shared-memory gather for seeds its partition owns, but an RPC to the owner for
the others, and node_split(..., force_even=True) gives a rank some seeds another partition owns
(synth-bench, 2 machines: rank 1's minibatches waited 35 ms each for it, rank 0's 2 ms;
BENCHMARKS.md §2). Reading the whole set once at start makes that one pull per run.
"""
from __future__ import annotations

import torch


class SeedLabels:
    def __init__(self, source, seeds: torch.Tensor):
        """source: the labels (a DistTensor, or any tensor-like with __getitem__ over ids);
        seeds: the ids this trainer will ask for (others still work: read from `source`)."""
        self.source = source
        self.ids = torch.unique(seeds.to(torch.int64))  # sorted
        self.values = source[self.ids]  # one read (an RPC only for the seeds owned elsewhere)
        self.shape = source.shape
        self.dtype = self.values.dtype

    def __getitem__(self, seeds: torch.Tensor) -> torch.Tensor:
        if not self.ids.numel():
            return self.source[seeds]
        i = torch.searchsorted(self.ids, seeds).clamp_(max=self.ids.numel() - 1)
        out = self.values.index_select(0, i)
        found = self.ids.index_select(0, i) == seeds
        if not bool(found.all()):  # an id outside the set: read from the source
            out[~found] = self.source[seeds[~found]]
        return out
