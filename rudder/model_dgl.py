"""DGL's distributed GraphSAGE example model (what rudder.train ran before the pure-torch
`rudder.model.SAGE`), kept as the reference the pure-torch model is checked and benchmarked
against. Needs DGL's blocks, so it runs on the CPU here (DGL's PyPI wheels have no CUDA)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class DGLSAGE(torch.nn.Module):
    def __init__(self, in_feats, hidden, classes, layers, dropout=0.5):
        super().__init__()
        from dgl.nn import SAGEConv

        dims = [in_feats] + [hidden] * (layers - 1) + [classes]
        self.layers = torch.nn.ModuleList(SAGEConv(dims[i], dims[i + 1], "mean") for i in range(layers))
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h
