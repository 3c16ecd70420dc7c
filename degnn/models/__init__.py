"""GNN encoders (SAGE, GCN, GAT) over edge-index hops; see layers.py for why no DGL kernels."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import nn
import torch.nn.functional as F

from .layers import GATLayer, GCNLayer, SAGELayer

# one message-passing hop: (src, dst, num_dst), local indices as in a DGL block
Hop = Tuple[torch.Tensor, torch.Tensor, int]


def hops_from_blocks(blocks) -> List[Hop]:
    """DGL blocks -> edge-index hops (the only place models meet DGL graph objects)."""
    hops = []
    for block in blocks:
        src, dst = block.edges()
        hops.append((src, dst, block.num_dst_nodes()))
    return hops


class GNN(nn.Module):
    """A stack of `layers` message-passing layers with ReLU and dropout between them."""

    def __init__(self, kind: str, in_dim: int, hidden: int, out_dim: int, layers: int,
                 dropout: float = 0.5, heads: int = 4):
        super().__init__()
        if layers < 1:
            raise ValueError(f"model.layers must be >= 1, got {layers}")
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.layers = nn.ModuleList()
        for i in range(layers):
            last = i == layers - 1
            if kind == "sage":
                layer = SAGELayer(dims[i], dims[i + 1])
            elif kind == "gcn":
                layer = GCNLayer(dims[i], dims[i + 1])
            elif kind == "gat":
                if not last and hidden % heads:
                    raise ValueError(f"model.hidden ({hidden}) must be divisible by model.heads ({heads})")
                layer = GATLayer(dims[i], dims[i + 1], heads, concat=not last)
            else:
                raise ValueError(f"unknown model '{kind}': choose sage, gcn or gat")
            self.layers.append(layer)
        self.dropout = dropout

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_forward(self, i: int, x_src: torch.Tensor, hop: Hop) -> torch.Tensor:
        """Layer i alone, with its activation: the unit of layer-wise (full-graph) inference."""
        h = self.layers[i](x_src, *hop)
        if i < self.num_layers - 1:
            h = F.dropout(F.relu(h), self.dropout, self.training)
        return h

    def forward(self, hops: Sequence[Hop], x: torch.Tensor) -> torch.Tensor:
        if len(hops) != self.num_layers:
            raise ValueError(f"got {len(hops)} hops for a {self.num_layers}-layer model")
        h = F.dropout(x, self.dropout, self.training) if self.dropout else x
        for i, hop in enumerate(hops):
            h = self.layer_forward(i, h, hop)
        return h


def check_model_config(model_cfg) -> None:
    """Errors a launch can report before it starts anything (ValueError, one line)."""
    if len(model_cfg.fanouts) != model_cfg.layers:
        raise ValueError(
            f"model.fanouts has {len(model_cfg.fanouts)} entries but model.layers={model_cfg.layers}: "
            f"give one fan-out per layer, e.g. model.fanouts=[{','.join(['10'] * model_cfg.layers)}]"
        )
    # the model's own checks (kind, layers, heads), on a throw-away instance with 1-wide in/out
    GNN(model_cfg.name, 1, model_cfg.hidden, 1, model_cfg.layers, model_cfg.dropout, model_cfg.heads)


def build_model(model_cfg, in_dim: int, out_dim: int) -> GNN:
    check_model_config(model_cfg)
    return GNN(model_cfg.name, in_dim, model_cfg.hidden, out_dim, model_cfg.layers,
               model_cfg.dropout, model_cfg.heads)
