"""Calling the models with DGL blocks or graphs (GNN.forward(blocks, x), GNN.layer_forward(i, block, x)).

The models before issue 10 took edge-index hops instead; this shim lets the TMA code be written
against the block API while both exist, and goes away once the block API is on main.
"""
from __future__ import annotations

from degnn import models as _models

_HOPS = getattr(_models, "hops_from_blocks", None)


def _hop(block):
    src, dst = block.edges()
    return src, dst, (block.num_dst_nodes() if block.is_block else block.num_nodes())


def forward(model, blocks, x):
    if _HOPS is not None:
        return model([_hop(b) for b in blocks], x)
    return model(blocks, x)


def layer_forward(model, i, block, x):
    if _HOPS is not None:
        return model.layer_forward(i, x, _hop(block))
    return model.layer_forward(i, block, x)
