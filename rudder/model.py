"""GraphSAGE over sampled blocks (DGL's distributed example model)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class SAGE(nn.Module):
    def __init__(self, in_feats: int, hidden: int, classes: int, layers: int, dropout: float = 0.5):
        super().__init__()
        from dgl.nn import SAGEConv

        dims = [in_feats] + [hidden] * (layers - 1) + [classes]
        self.layers = nn.ModuleList(SAGEConv(dims[i], dims[i + 1], "mean") for i in range(layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h
