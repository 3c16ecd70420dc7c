"""GNN encoders (SAGE, GCN, GAT) with DGL's own layers' parameters (`dgl.nn`), over DGL blocks or
graphs, and the link-prediction model (an encoder and an MLP decoder on the endpoints' elementwise
product). `model.backend` (degnn.models.backend) picks what runs a layer: the dgl.nn convolution
itself, or the plain-torch function of degnn.models.torch_layers on the same parameters.

DGL's kernels aggregate without materialising a row per edge, and SAGEConv projects before it
aggregates when that is cheaper: on one wordnet batch a 2-layer SAGE forward+backward takes
about a third of the time of the earlier hand-written torch gather/scatter layers. With a CUDA
build of DGL the same layers run on the GPU; with DGL's CPU wheels the torch backend does.

A model layer sees one message-passing hop: a DGL block (sampled training, layer-wise
inference) or a plain graph (a whole local graph), and the source nodes' features.
"""
from __future__ import annotations

from typing import Sequence

import dgl
import dgl.nn as dglnn
import torch
from torch import nn
import torch.nn.functional as F

from degnn.models import torch_layers
from degnn.models.backend import adjacency_of, check_backend, choose_backend

KINDS = ("sage", "gcn", "gat")


def with_self_loops(block):
    """`block` plus one edge from every destination node to itself.

    GCN and GAT include the node itself in its neighbourhood (Kipf & Welling; Velickovic et al.);
    a sampled block has no such edge, and dgl.add_self_loop does not take blocks. A destination
    node of a block is also its source node of the same index (DGL's block convention).
    """
    if not block.is_block:
        return dgl.add_self_loop(dgl.remove_self_loop(block))
    src, dst = block.edges()
    loops = torch.arange(block.num_dst_nodes(), dtype=src.dtype)
    return dgl.create_block((torch.cat([src, loops]), torch.cat([dst, loops])),
                            num_src_nodes=block.num_src_nodes(), num_dst_nodes=block.num_dst_nodes())


class GNN(nn.Module):
    """A stack of `layers` dgl.nn convolutions with ReLU and dropout between them.

    sage: SAGEConv, mean aggregator.  gcn: GraphConv over the node and its neighbours, mean-normalised.
    gat: GATConv with `heads` heads, concatenated on hidden layers, averaged on the last.
    `backend` (dgl, torch, auto) is chosen per call from the inputs' device; the parameters are
    the same for all.
    """

    def __init__(self, kind: str, in_dim: int, hidden: int, out_dim: int, layers: int,
                 dropout: float = 0.5, heads: int = 4, backend: str = "auto"):
        super().__init__()
        if layers < 1:
            raise ValueError(f"model.layers must be >= 1, got {layers}")
        if kind not in KINDS:
            raise ValueError(f"unknown model '{kind}': choose sage, gcn or gat")
        if hidden < 1 or heads < 1:
            raise ValueError(f"model.hidden={hidden}, model.heads={heads}: both must be >= 1")
        if kind == "gat" and layers > 1 and hidden % heads:
            raise ValueError(f"model.hidden ({hidden}) must be divisible by model.heads ({heads})")
        check_backend(backend)
        self.kind = kind
        self.backend = backend
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.layers = nn.ModuleList()
        for i in range(layers):
            last = i == layers - 1
            if kind == "sage":
                conv = dglnn.SAGEConv(dims[i], dims[i + 1], "mean")
            elif kind == "gcn":
                # right (mean) normalisation: "both" would scale by each source's out-degree
                # inside the block, so a node's output would depend on the batch it is in
                conv = dglnn.GraphConv(dims[i], dims[i + 1], norm="right", allow_zero_in_degree=True)
            else:
                per_head = dims[i + 1] if last else dims[i + 1] // heads
                conv = dglnn.GATConv(dims[i], per_head, heads, allow_zero_in_degree=True)
            self.layers.append(conv)
        self.dropout = dropout

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_forward(self, i: int, block, x_src: torch.Tensor) -> torch.Tensor:
        """Layer i alone, with its activation: the unit of layer-wise (full-graph) inference.
        `block`: a DGL block or graph, or (torch backend) its Adjacency already on the device."""
        if choose_backend(self.backend, x_src.device) == "torch":
            h = torch_layers.LAYERS[self.kind](self.layers[i], adjacency_of(block), x_src)
        else:
            if isinstance(block, torch_layers.Adjacency):
                raise TypeError(f"model.backend={self.backend} runs DGL's layers on {x_src.device}: "
                                f"give it DGL blocks, not an Adjacency")
            if self.kind != "sage":
                block = with_self_loops(block)
            h = self.layers[i](block, x_src)
        if self.kind == "gat":  # [N, heads, per_head]
            h = h.mean(1) if i == self.num_layers - 1 else h.flatten(1)
        if i < self.num_layers - 1:
            h = F.relu(h)
            if self.dropout:
                h = F.dropout(h, self.dropout, self.training)
        return h

    def forward(self, blocks: Sequence, x: torch.Tensor) -> torch.Tensor:
        if len(blocks) != self.num_layers:
            raise ValueError(f"got {len(blocks)} blocks for a {self.num_layers}-layer model")
        # no dropout on the input features (as DGL's GraphSAGE examples): on a batch with 18k
        # input rows it costs about as much as the two layers' forward pass
        h = x
        for i, block in enumerate(blocks):
            h = self.layer_forward(i, block, h)
        return h

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        old = [k for k in state_dict if k.endswith(("linear.weight", "att_src"))]
        if old:
            raise ValueError(
                "this checkpoint holds degnn's earlier hand-written layers (e.g. "
                f"'{old[0]}'); the models are now DGL's own convolutions and cannot load it: "
                "start a new run instead of resume=")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def check_model_config(model_cfg) -> None:
    """Errors a launch can report before it starts anything (ValueError, one line)."""
    if len(model_cfg.fanouts) != model_cfg.layers:
        raise ValueError(
            f"model.fanouts has {len(model_cfg.fanouts)} entries but model.layers={model_cfg.layers}: "
            f"give one fan-out per layer, e.g. model.fanouts=[{','.join(['10'] * model_cfg.layers)}]"
        )
    # the model's own checks (kind, layers, heads), on a throw-away instance with 1-wide in/out
    GNN(model_cfg.name, 1, model_cfg.hidden, 1, model_cfg.layers, model_cfg.dropout, model_cfg.heads,
        backend_of(model_cfg))


def backend_of(model_cfg) -> str:
    """model.backend (auto in a hand-made model config without it)."""
    return getattr(model_cfg, "backend", "auto")


def build_model(model_cfg, in_dim: int, out_dim: int) -> GNN:
    check_model_config(model_cfg)
    return GNN(model_cfg.name, in_dim, model_cfg.hidden, out_dim, model_cfg.layers,
               model_cfg.dropout, model_cfg.heads, backend_of(model_cfg))


class MLPDecoder(nn.Module):
    """The TMA paper's link decoder (docs/background.md, "TMA"): h_u * h_v -> Linear(d, d) -> PReLU ->
    Linear(d, 1), a logit per pair. Works on any leading shape ([E, d], [E, k, d])."""

    def __init__(self, dim: int):
        super().__init__()
        self.hidden = nn.Linear(dim, dim)
        self.act = nn.PReLU()
        self.out = nn.Linear(dim, 1)

    def forward(self, h_src: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.hidden(h_src * h_dst))).squeeze(-1)


class LinkModel(nn.Module):
    """Encoder (GNN, `hidden` wide output) + MLPDecoder.

    `forward(blocks, x, pos_graph, neg_graph)` -> (logits of the positive pairs, of the negative
    pairs), the pair graphs numbered like the top block's destination nodes (DGL's edge loaders
    compact them so). `num_layers` / `layer_forward` are the encoder's, so layer-wise full-neighbour
    inference works unchanged; `decoder` scores pairs of those embeddings.
    """

    def __init__(self, encoder: GNN, dim: int):
        super().__init__()
        self.encoder = encoder
        self.decoder = MLPDecoder(dim)

    @property
    def num_layers(self) -> int:
        return self.encoder.num_layers

    def layer_forward(self, i: int, block, x_src: torch.Tensor) -> torch.Tensor:
        return self.encoder.layer_forward(i, block, x_src)

    def score(self, h: torch.Tensor, pairs) -> torch.Tensor:
        src, dst = pairs.edges()
        return self.decoder(h[src.long()], h[dst.long()])

    def forward(self, blocks: Sequence, x: torch.Tensor, pos_graph, neg_graph):
        h = self.encoder(blocks, x)
        return self.score(h, pos_graph), self.score(h, neg_graph)


def build_link_model(model_cfg, in_dim: int) -> LinkModel:
    """The encoder of `model_cfg` with a `hidden`-wide output, and the MLP decoder."""
    return LinkModel(build_model(model_cfg, in_dim, model_cfg.hidden), model_cfg.hidden)
