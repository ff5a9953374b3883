"""DGL's distributed GraphSAGE example model (what rudder.train ran before the pure-torch
`rudder.model.SAGE`), kept as the reference the pure-torch model is checked and benchmarked
against: the same model with DGL's SAGEConv layers on DGL's own blocks. Needs DGL's blocks, so it
runs on the CPU here (DGL's PyPI wheels have no CUDA)."""
from __future__ import annotations

from rudder.model import SAGE


class DGLSAGE(SAGE):
    def conv(self, in_feats, out_feats):
        from dgl.nn import SAGEConv

        return SAGEConv(in_feats, out_feats, "mean")

    def blocks(self, blocks, device):
        return blocks  # DGL's layers take DGL's blocks as they are
