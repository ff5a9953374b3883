"""GraphSAGE over sampled blocks, in plain torch: the same code on CUDA and on the CPU.

DistDGL samples on the CPU and DGL's PyPI wheels have no CUDA build, so DGL blocks never move to
a GPU. Each block becomes a `Block` of plain tensors (its edges as COO in local ids, the src/dst
counts and the dst nodes' inverse in-degrees) on the training device, and the layers aggregate
with `index_add_`. `SAGEConv` is DGL's SAGEConv(aggregator_type="mean") with the same parameter
names and initialisation, so weights (state dicts) copy across in both directions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Block:
    """One sampled layer: edge j runs from src node src[j] to dst node dst[j] (local ids; as in
    a DGL block the dst nodes are the first num_dst src nodes)."""

    src: torch.Tensor  # [E] int64
    dst: torch.Tensor  # [E] int64
    num_src: int
    num_dst: int
    inv_deg: torch.Tensor  # [num_dst, 1] 1/in-degree (0 for a dst node without in-edges)

    @classmethod
    def from_edges(cls, src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int,
                   device: torch.device | str = "cpu") -> "Block":
        src = src.to(device=device, dtype=torch.int64)
        dst = dst.to(device=device, dtype=torch.int64)
        deg = torch.bincount(dst, minlength=num_dst)[:num_dst]
        inv = torch.where(deg > 0, 1.0 / deg.clamp(min=1), 0.0).to(torch.float32)
        return cls(src, dst, int(num_src), int(num_dst), inv.unsqueeze(1))

    @classmethod
    def from_dgl(cls, block, device: torch.device | str = "cpu") -> "Block":
        src, dst = block.edges()  # COO in local ids: what the sampler built, no conversion
        return cls.from_edges(src, dst, block.num_src_nodes(), block.num_dst_nodes(), device)


def as_blocks(blocks, device: torch.device | str) -> list[Block]:
    """DGL blocks (or Blocks already) -> Blocks on `device`: only the edge lists cross to it."""
    return [b if isinstance(b, Block) else Block.from_dgl(b, device) for b in blocks]


def mean_aggregate(block: Block, h: torch.Tensor) -> torch.Tensor:
    """Mean of each dst node's in-neighbours' rows of h ([num_src, D] -> [num_dst, D]); a dst node
    without in-edges gets zeros (as DGL's fn.mean). index_add_ is one kernel on CUDA and on the
    CPU, and its backward is a gather (see BENCHMARKS.md for the CPU comparison with DGL)."""
    out = h.new_zeros((block.num_dst, h.shape[1]))
    out.index_add_(0, block.dst, h.index_select(0, block.src))
    return out * block.inv_deg.to(h.dtype)


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
        self.layers = nn.ModuleList(SAGEConv(dims[i], dims[i + 1]) for i in range(layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x: torch.Tensor) -> torch.Tensor:
        blocks = as_blocks(blocks, x.device)
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h
