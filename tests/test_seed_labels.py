"""SeedLabels: a trainer's seed labels read once, then served locally, equal to a direct read."""
from __future__ import annotations

import torch

from rudder.prefetch.labels import SeedLabels


class CountingLabels:
    """A tensor-like label store that counts its reads (a DistTensor's are RPCs)."""

    def __init__(self, t: torch.Tensor):
        self.t, self.reads, self.shape = t, 0, t.shape

    def __getitem__(self, ids):
        self.reads += 1
        return self.t[ids]


def test_seed_labels_equal_a_direct_read_with_one_read_of_the_source():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 47, (1000,), generator=g)
    src = CountingLabels(labels)
    seeds = torch.randperm(1000, generator=g)[:300]
    cached = SeedLabels(src, seeds)
    assert src.reads == 1
    for batch in seeds.split(64):  # shuffled minibatches of the seed set
        got = cached[batch]
        assert got.dtype == labels.dtype and torch.equal(got, labels[batch])
    assert src.reads == 1  # no read per minibatch


def test_ids_outside_the_seed_set_are_read_from_the_source():
    labels = torch.arange(100) * 3
    src = CountingLabels(labels)
    cached = SeedLabels(src, torch.tensor([5, 7, 9]))
    ids = torch.tensor([9, 99, 0, 5, 8])
    assert torch.equal(cached[ids], labels[ids])
    assert src.reads == 2
    empty = SeedLabels(CountingLabels(labels), torch.empty(0, dtype=torch.int64))
    assert torch.equal(empty[ids], labels[ids])
