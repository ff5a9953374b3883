"""BufferedFeatures: every assembled row equals a plain pull, hits are served from the buffer
(not pulled), and only misses and replacement rows count as fetched. Both assemblies run on the
CPU (in place, and the compact one GPUs use); the CUDA cases run where a GPU is present."""
from __future__ import annotations

import pytest
import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.features import BufferedFeatures
from rudder.prefetch.policy import Replace

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
ASSEMBLIES = [("cpu", False), ("cpu", True), pytest.param("cuda", True, marks=CUDA)]


class CountingTable:
    """A feature table that records which ids each pull asked for (a DistTensor stand-in)."""

    def __init__(self, table):
        self.table, self.pulls = table, []
        self.shape, self.dtype = table.shape, table.dtype

    def __getitem__(self, ids):
        self.pulls.append(ids.clone())
        return self.table[ids]


@pytest.mark.parametrize("device,compact", ASSEMBLIES)
@pytest.mark.parametrize("plan", [None, Replace("massivegnn"), Replace("lookahead", 3),
                                  Replace("lookahead", 3, admit="any")])
def test_rows_match_a_plain_pull_and_hits_are_not_pulled(plan, device, compact):
    g = torch.Generator().manual_seed(0)
    N, P = 200, 100  # nodes 0..99 are this partition's, 100..199 another's
    table = CountingTable(torch.randn(N, 8, generator=g))
    halo = torch.arange(100, 160)
    buf = HaloBuffer(halo, 20, 8, alpha=0.3, period=2, device=device)
    buf.fill(halo[:20], table.table[halo[:20]])
    feats = BufferedFeatures(table, lambda ids: (ids >= P).long(), 0, buf, local_id=7)
    assert feats.device.type == buf.device.type == device
    feats.compact = compact
    mbs = [torch.unique(torch.randint(0, 180, (40,), generator=g))[torch.randperm(30, generator=g)]
           for _ in range(12)]
    rem = [feats.remote_ids(m) for m in mbs]  # kept, as the pipeline keeps its sampled-ahead ids
    for i, ids in enumerate(mbs):
        future = rem[i + 1 : i + 4]
        before = set(buf.contents().tolist())
        moved = feats.rows_to_device
        # remote=: the tensor a lookahead round saw ahead (searched once); None: fetch finds it
        x, st = feats.fetch(ids, plan if i % 2 else None, future, remote=rem[i] if i % 3 else None)
        assert x.device == buf.device
        assert torch.equal(x.cpu(), table.table[ids])  # bit-identical to plain DistDGL
        remote = ids[ids >= P]
        hits = [int(v) for v in remote if int(v) in before]
        assert st.hits == len(hits) and st.remote_rows == remote.numel()
        pulled_remote = [int(v) for v in table.pulls[-1] if v >= P]
        assert not set(hits) & set(pulled_remote)  # a hit never crosses the network
        assert len(pulled_remote) == st.fetched_rows == st.misses + st.replaced_rows
        if compact:  # the pull leaves the hits out; only what it pulled crosses to the device
            assert table.pulls[-1].numel() == ids.numel() - st.hits + st.replaced_rows
            assert feats.rows_to_device - moved == table.pulls[-1].numel()
        buf.verify()
        for slot in torch.nonzero(buf.slot_pos >= 0).flatten():  # rows follow their nodes
            assert torch.equal(buf.feats[slot].cpu(), table.table[buf.halo[buf.slot_pos[slot]]])


def test_no_buffer_is_one_plain_pull():
    table = CountingTable(torch.randn(50, 4))
    feats = BufferedFeatures(table, lambda ids: (ids >= 25).long(), 0, None, local_id=0)
    ids = torch.tensor([3, 30, 40, 1])
    x, st = feats.fetch(ids)
    assert torch.equal(x, table.table[ids]) and torch.equal(table.pulls[-1], ids)
    assert (st.remote_rows, st.local_rows, st.fetched_rows, st.hits) == (2, 2, 2, 0)


def test_features_free_pulls_no_remote_row():
    """train.features_free: local rows are the partition's own, every remote row is the local
    row `local_id` (one pull that names no remote id), and nothing counts as fetched."""
    table = CountingTable(torch.randn(50, 4))
    feats = BufferedFeatures(table, lambda ids: (ids >= 25).long(), 0, None, local_id=5, free_remote=True)
    ids = torch.tensor([3, 30, 40, 1, 26])
    x, st = feats.fetch(ids)
    assert len(table.pulls) == 1 and bool((table.pulls[-1] < 25).all())
    local = ids < 25
    assert torch.equal(x[local], table.table[ids[local]])
    assert torch.equal(x[~local], table.table[5].expand(3, 4))
    assert (st.remote_rows, st.local_rows, st.fetched_rows, st.misses, st.hits, st.fetched_bytes) == (3, 2, 0, 0, 0, 0)
    assert torch.equal(ids, torch.tensor([3, 30, 40, 1, 26]))  # the caller's ids untouched
    with pytest.raises(ValueError, match="no buffer"):
        BufferedFeatures(table, lambda ids: (ids >= 25).long(), 0, HaloBuffer(torch.arange(25, 35), 4, 4),
                         local_id=5, free_remote=True)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_no_buffer_output_on_the_device(device):
    table = CountingTable(torch.randn(50, 4))
    feats = BufferedFeatures(table, lambda ids: (ids >= 25).long(), 0, None, local_id=0, device=device)
    ids = torch.tensor([3, 30, 40, 1])
    x, _ = feats.fetch(ids)
    assert x.device.type == device and torch.equal(x.cpu(), table.table[ids])


def test_buffer_and_output_on_different_devices_is_refused():
    buf = HaloBuffer(torch.arange(10, 20), 4, 4, device="meta")  # rows "elsewhere"
    with pytest.raises(ValueError, match="same device"):
        BufferedFeatures(CountingTable(torch.randn(20, 4)), lambda ids: (ids >= 10).long(), 0, buf,
                         local_id=0, device="cpu")
