"""degnn's SAGE, GCN and GAT layers in plain PyTorch (`model.backend=torch`): no DGL here, so they
run on a GPU where DGL's wheels are CPU-only, and travel alone (benchmarks/compute_speed.py).

A hop's structure is an `Adjacency`: its edges as two index tensors and its sizes, taken from a
DGL block on the CPU (degnn.models.backend) and moved to the device with the batch. The layer
functions (`sage`, `gcn`, `gat`) read their parameters from any module with dgl.nn's parameter
names, so degnn.models.GNN runs them on its dgl.nn convolutions' own parameters, and the modules
here (`SAGELayer`, ...) have the same state-dict keys and shapes: a checkpoint of one backend
loads in the other. Each function computes what its dgl.nn layer computes (DGL 1.1):

    sage: fc_self(h_dst) + fc_neigh(mean of h_src over in-edges)   (SAGEConv, "mean")
    gcn:  (mean of h_src over in-edges) @ weight + bias              (GraphConv, norm="right")
    gat:  per head, softmax over in-edges of leaky_relu(<attn_l, W h_src> + <attn_r, W h_dst>),
          the weighted sum of W h_src, + bias                         (GATConv)

sage and gcn project before they aggregate when the output is narrower than the input (the
aggregation then moves fewer columns), as DGL does; the mean is a CSR sparse product.
"""
from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch
from torch import nn
import torch.nn.functional as F

# torch warns that sparse CSR is "in beta" on every construction
warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")


class Adjacency:
    """One message-passing hop: edge e runs from source row src[e] to destination row dst[e];
    destination i is also source i (DGL's block convention; a whole graph has num_src == num_dst).
    `block` says which: a whole graph's own self loops are dropped before GCN/GAT add theirs
    (as dgl.add_self_loop after dgl.remove_self_loop), a block's sampled edges are kept."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int, block: bool = True):
        if src.shape != dst.shape or src.dim() != 1:
            raise ValueError(f"Adjacency: src {tuple(src.shape)} and dst {tuple(dst.shape)} must be equal 1-d")
        self.src, self.dst = src.long(), dst.long()
        self.num_src, self.num_dst, self.block = int(num_src), int(num_dst), block
        self._mean: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self._looped: Optional[Adjacency] = None

    @property
    def device(self) -> torch.device:
        return self.src.device

    def to(self, device) -> "Adjacency":
        if self.src.device == torch.device(device):
            return self
        return Adjacency(self.src.to(device), self.dst.to(device), self.num_src, self.num_dst, self.block)

    def edges(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(src, dst), as DGLGraph.edges(): a pair graph of a link batch is read so."""
        return self.src, self.dst

    def with_self_loops(self) -> "Adjacency":
        """This hop plus an edge from every destination node to itself (GCN, GAT)."""
        if self._looped is None:
            src, dst = self.src, self.dst
            if not self.block:
                keep = src != dst
                src, dst = src[keep], dst[keep]
            loops = torch.arange(self.num_dst, device=src.device)
            self._looped = Adjacency(torch.cat([src, loops]), torch.cat([dst, loops]), self.num_src,
                                     self.num_dst, self.block)
        return self._looped

    def mean_matrices(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """A = [dst, src] CSR of 1/in-degree (0 for no in-edges, DGL's mean of nothing) and A^T."""
        if self._mean is None:
            deg = torch.bincount(self.dst, minlength=self.num_dst).clamp(min=1)
            vals = 1.0 / deg.float()[self.dst]
            self._mean = (_csr(self.dst, self.src, vals, self.num_dst, self.num_src),
                          _csr(self.src, self.dst, vals, self.num_src, self.num_dst))
        return self._mean


def _csr(rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, n_rows: int, n_cols: int) -> torch.Tensor:
    order = torch.argsort(rows, stable=True)
    crow = torch.zeros(n_rows + 1, dtype=torch.long, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n_rows), 0)
    return torch.sparse_csr_tensor(crow, cols[order], vals[order], (n_rows, n_cols), check_invariants=False)


class _SparseMean(torch.autograd.Function):
    """A @ x, and A^T @ g back (torch's sparse mm has no CSR backward for a constant A)."""

    @staticmethod
    def forward(ctx, a, a_t, x):
        ctx.a_t = a_t
        return torch.sparse.mm(a, x)

    @staticmethod
    def backward(ctx, g):
        return None, None, torch.sparse.mm(ctx.a_t, g.contiguous())


def mean_over_in_edges(adj: Adjacency, x: torch.Tensor) -> torch.Tensor:
    """[num_dst, d]: each destination's mean of its in-neighbours' rows of x (0 with none)."""
    a, a_t = adj.mean_matrices()
    if a.dtype != x.dtype:  # float64 checks
        a, a_t = a.to(x.dtype), a_t.to(x.dtype)
    return _SparseMean.apply(a, a_t, x)


def _check(adj: Adjacency, x: torch.Tensor) -> None:
    if adj.device != x.device:
        raise RuntimeError(f"the hop's structure is on {adj.device}, its inputs on {x.device}: move the batch "
                           f"with degnn.runtime.device.DeviceMover")
    if x.shape[0] != adj.num_src:
        raise ValueError(f"{x.shape[0]} input rows for a hop of {adj.num_src} source nodes")


def sage(conv, adj: Adjacency, x: torch.Tensor) -> torch.Tensor:
    _check(adj, x)
    if conv.fc_neigh.in_features > conv.fc_neigh.out_features:
        neigh = mean_over_in_edges(adj, conv.fc_neigh(x))
    else:
        neigh = conv.fc_neigh(mean_over_in_edges(adj, x))
    return conv.fc_self(x[:adj.num_dst]) + neigh


def gcn(conv, adj: Adjacency, x: torch.Tensor) -> torch.Tensor:
    _check(adj, x)
    adj = adj.with_self_loops()
    weight = conv.weight
    if weight.shape[0] > weight.shape[1]:
        h = mean_over_in_edges(adj, x @ weight)
    else:
        h = mean_over_in_edges(adj, x) @ weight
    return h + conv.bias


def gat(conv, adj: Adjacency, x: torch.Tensor, negative_slope: float = 0.2) -> torch.Tensor:
    """[num_dst, heads, per_head], as GATConv."""
    _check(adj, x)
    adj = adj.with_self_loops()
    heads, per_head = conv.attn_l.shape[1], conv.attn_l.shape[2]
    feat = conv.fc(x).view(-1, heads, per_head)
    el = (feat * conv.attn_l).sum(-1)  # [num_src, heads]
    er = (feat[:adj.num_dst] * conv.attn_r).sum(-1)
    src, dst = adj.src, adj.dst
    e = F.leaky_relu(el[src] + er[dst], negative_slope)  # [E, heads]
    # softmax over each destination's in-edges, shifted by its largest score (a constant per
    # destination: it changes neither the result nor the gradient)
    top = torch.full((adj.num_dst, heads), float("-inf"), dtype=e.dtype, device=e.device)
    top = top.scatter_reduce(0, dst[:, None].expand_as(e), e.detach(), "amax")
    w = torch.exp(e - top[dst])
    total = torch.zeros(adj.num_dst, heads, dtype=e.dtype, device=e.device).index_add_(0, dst, w)
    a = w / total[dst]
    out = torch.zeros(adj.num_dst, heads, per_head, dtype=feat.dtype, device=feat.device)
    out = out.index_add(0, dst, a[..., None] * feat[src])
    return out + conv.bias.view(1, heads, per_head)


# --- the same layers as modules owning their parameters (dgl.nn's names and shapes) ---------------
class SAGELayer(nn.Module):
    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.fc_neigh = nn.Linear(in_dim, out_dim, bias=False)
        self.fc_self = nn.Linear(in_dim, out_dim)

    def forward(self, adj: Adjacency, x: torch.Tensor) -> torch.Tensor:
        return sage(self, adj, x)


class GCNLayer(nn.Module):
    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_dim, out_dim))
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, adj: Adjacency, x: torch.Tensor) -> torch.Tensor:
        return gcn(self, adj, x)


class GATLayer(nn.Module):
    def __init__(self, in_dim: int, per_head: int, heads: int):
        super().__init__()
        self.fc = nn.Linear(in_dim, heads * per_head, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, heads, per_head))
        self.attn_r = nn.Parameter(torch.empty(1, heads, per_head))
        self.bias = nn.Parameter(torch.zeros(heads * per_head))
        gain = nn.init.calculate_gain("relu")
        for p in (self.fc.weight, self.attn_l, self.attn_r):
            nn.init.xavier_normal_(p, gain=gain)

    def forward(self, adj: Adjacency, x: torch.Tensor) -> torch.Tensor:
        return gat(self, adj, x)


LAYERS = {"sage": sage, "gcn": gcn, "gat": gat}
