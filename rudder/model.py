"""GraphSAGE over sampled blocks, in plain torch: the same code on CUDA and on the CPU.

DistDGL samples on the CPU and DGL's PyPI wheels have no CUDA build, so DGL blocks never move to
a GPU. Each block becomes a `Block` of plain tensors (its edges grouped by dst and by src, the
src/dst counts, the dst nodes' in-degrees) on the training device, and the layers aggregate with
embedding_bag sums. `SAGEConv` is DGL's SAGEConv(aggregator_type="mean") with the same parameter
names and initialisation, so weights (state dicts) copy across in both directions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Block:
    """One sampled layer as plain tensors, in local ids (as in a DGL block the dst nodes are the
    first num_dst src nodes). Both directions of the adjacency are kept: in-edges per dst node
    (CSC) for the forward pass, out-edges per src node (CSR) for the backward pass."""

    num_src: int
    num_dst: int
    in_ptr: torch.Tensor  # [num_dst + 1] CSC offsets
    in_src: torch.Tensor  # [E] src of each in-edge, grouped by dst
    out_ptr: torch.Tensor  # [num_src + 1] CSR offsets
    out_dst: torch.Tensor  # [E] dst of each out-edge, grouped by src
    deg: torch.Tensor  # [num_dst, 1] float in-degree, at least 1 (the sum of none is 0 anyway)

    @classmethod
    def from_adj(cls, num_src: int, num_dst: int, csc: tuple, csr: tuple,
                 device: torch.device | str = "cpu") -> "Block":
        in_ptr, in_src, out_ptr, out_dst = (t.to(device=device, dtype=torch.int64)
                                            for t in (*csc[:2], *csr[:2]))
        deg = (in_ptr[1:] - in_ptr[:-1]).clamp(min=1).to(torch.float32).unsqueeze(1)
        return cls(int(num_src), int(num_dst), in_ptr, in_src, out_ptr, out_dst, deg)

    @classmethod
    def from_edges(cls, src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int,
                   device: torch.device | str = "cpu") -> "Block":
        """From COO (edge j: src[j] -> dst[j])."""
        def grouped(key, other, n):
            order = torch.argsort(key, stable=True)
            ptr = torch.zeros(n + 1, dtype=torch.int64)
            ptr[1:] = torch.cumsum(torch.bincount(key, minlength=n)[:n], 0)
            return ptr, other[order]

        src, dst = src.to(torch.int64), dst.to(torch.int64)
        return cls.from_adj(num_src, num_dst, grouped(dst, src, num_dst), grouped(src, dst, num_src), device)

    @classmethod
    def from_dgl(cls, block, device: torch.device | str = "cpu") -> "Block":
        # DGL builds both formats from the sampler's COO in C (~1 ms and ~5 ms for a
        # 10,25-fanout minibatch of 1000 seeds; its own SAGEConv builds them as well)
        return cls.from_adj(block.num_src_nodes(), block.num_dst_nodes(),
                            block.adj_tensors("csc"), block.adj_tensors("csr"), device)


def as_blocks(blocks, device: torch.device | str) -> list[Block]:
    """DGL blocks (or Blocks already) -> Blocks on `device`: only the edge lists cross to it."""
    return [b if isinstance(b, Block) else Block.from_dgl(b, device) for b in blocks]


class _SumIn(torch.autograd.Function):
    """out[v] = sum of h[u] over the in-edges u -> v; its gradient is the same sum over the
    out-edges. Both are an embedding_bag over the grouped edge lists: one kernel on CUDA, and on
    the CPU as fast as DGL's kernels where index_add_ and torch.sparse are not (BENCHMARKS.md)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, block: Block) -> torch.Tensor:
        ctx.block = block
        return F.embedding_bag(block.in_src, h, block.in_ptr, mode="sum", include_last_offset=True)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        b = ctx.block
        return F.embedding_bag(b.out_dst, g.contiguous(), b.out_ptr, mode="sum", include_last_offset=True), None


def mean_aggregate(block: Block, h: torch.Tensor) -> torch.Tensor:
    """Mean of each dst node's in-neighbours' rows of h ([num_src, D] -> [num_dst, D]); a dst node
    without in-edges gets zeros (as DGL's fn.mean)."""
    return _SumIn.apply(h, block) / block.deg.to(h.dtype)  # a division, as DGL's fn.mean


class SAGEConv(nn.Module):
    """DGL 2.1's SAGEConv(aggregator_type="mean") (feat_drop 0, no norm/activation): the same
    parameters (fc_neigh.weight, fc_self.weight, fc_self.bias), created and initialised in the
    same order, so a seed gives both the same weights."""

    def __init__(self, in_feats: int, out_feats: int):
        super().__init__()
        self.in_feats, self.out_feats = in_feats, out_feats
        self.fc_neigh = nn.Linear(in_feats, out_feats, bias=False)
        self.fc_self = nn.Linear(in_feats, out_feats, bias=True)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        gain = nn.init.calculate_gain("relu")  # DGL's: Glorot weights, fc_self.bias as nn.Linear's
        nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)

    def forward(self, block: Block, h: torch.Tensor) -> torch.Tensor:
        h_dst = h[: block.num_dst]
        # project first when that shrinks the rows to aggregate (DGL's lin_before_mp)
        if self.in_feats > self.out_feats:
            neigh = mean_aggregate(block, self.fc_neigh(h))
        else:
            neigh = self.fc_neigh(mean_aggregate(block, h))
        return self.fc_self(h_dst) + neigh


class SAGE(nn.Module):
    """DGL's distributed GraphSAGE example model; forward takes DGL blocks or Blocks and runs on
    the device its parameters are on."""

    def __init__(self, in_feats: int, hidden: int, classes: int, layers: int, dropout: float = 0.5):
        super().__init__()
        dims = [in_feats] + [hidden] * (layers - 1) + [classes]
        self.layers = nn.ModuleList(self.conv(dims[i], dims[i + 1]) for i in range(layers))
        self.dropout = nn.Dropout(dropout)

    def conv(self, in_feats: int, out_feats: int) -> nn.Module:
        return SAGEConv(in_feats, out_feats)

    def blocks(self, blocks, device: torch.device):
        return as_blocks(blocks, device)

    def forward(self, blocks, x: torch.Tensor) -> torch.Tensor:
        blocks = self.blocks(blocks, x.device)
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h
