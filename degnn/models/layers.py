"""GNN layers written with plain torch ops over an edge index.

A layer sees one bipartite hop: source features ``x_src`` [num_src, F], edges ``src -> dst`` as
local indices, and ``num_dst`` destination nodes, which (as in DGL's blocks) are the first
``num_dst`` source nodes. No DGL kernels, so the same model runs on CUDA tensors while DGL keeps
sampling and graph storage on the CPU (DGL's PyPI wheels are CPU-only).
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F


def scatter_sum(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    out = values.new_zeros((size,) + values.shape[1:])
    return out.index_add_(0, index, values)


def in_degree(dst: torch.Tensor, num_dst: int, dtype) -> torch.Tensor:
    return torch.bincount(dst, minlength=num_dst).to(dtype)


class SAGELayer(nn.Module):
    """GraphSAGE with the mean aggregator: W_self x_i + W_neigh mean_j x_j."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.self_linear = nn.Linear(in_dim, out_dim)
        self.neigh_linear = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, x_src, src, dst, num_dst):
        deg = in_degree(dst, num_dst, x_src.dtype).clamp(min=1).unsqueeze(-1)
        mean = scatter_sum(x_src[src], dst, num_dst) / deg
        return self.self_linear(x_src[:num_dst]) + self.neigh_linear(mean)


class GCNLayer(nn.Module):
    """GCN with self-loops and symmetric normalisation over the (sampled) hop."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)

    def forward(self, x_src, src, dst, num_dst):
        num_src = x_src.shape[0]
        # +1 for the self-loop every destination gets
        deg_dst = in_degree(dst, num_dst, x_src.dtype) + 1
        deg_src = torch.bincount(src, minlength=num_src).to(x_src.dtype) + 1
        deg_src[:num_dst] = deg_dst  # a destination is also a source: one degree per node
        norm = (deg_src[src] * deg_dst[dst]).rsqrt().unsqueeze(-1)
        agg = scatter_sum(x_src[src] * norm, dst, num_dst) + x_src[:num_dst] / deg_dst.unsqueeze(-1)
        return self.linear(agg)


class GATLayer(nn.Module):
    """Multi-head graph attention; heads are concatenated (averaged by the caller on the last layer)."""

    def __init__(self, in_dim: int, out_dim: int, heads: int, concat: bool = True):
        super().__init__()
        self.heads, self.concat = heads, concat
        self.head_dim = out_dim // heads if concat else out_dim
        self.linear = nn.Linear(in_dim, self.heads * self.head_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(heads, self.head_dim))
        self.att_dst = nn.Parameter(torch.empty(heads, self.head_dim))
        self.bias = nn.Parameter(torch.zeros(heads * self.head_dim if concat else out_dim))
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)

    def forward(self, x_src, src, dst, num_dst):
        h = self.linear(x_src).view(-1, self.heads, self.head_dim)
        # self-loops so a node with no sampled neighbour still attends to itself
        loops = torch.arange(num_dst, device=src.device)
        src = torch.cat([src, loops])
        dst = torch.cat([dst, loops])
        score = F.leaky_relu(
            (h[src] * self.att_src).sum(-1) + (h[dst] * self.att_dst).sum(-1), 0.2
        )  # [E, heads]
        # softmax over each destination's incoming edges
        top = score.new_full((num_dst, self.heads), float("-inf"))
        top = top.scatter_reduce(0, dst.unsqueeze(-1).expand_as(score), score, "amax")
        weight = (score - top[dst]).exp()
        weight = weight / scatter_sum(weight, dst, num_dst)[dst]
        out = scatter_sum(h[src] * weight.unsqueeze(-1), dst, num_dst)
        out = out.flatten(1) if self.concat else out.mean(1)
        return out + self.bias
