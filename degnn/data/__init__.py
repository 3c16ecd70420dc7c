"""Datasets: every source (real OGB, synthetic, WordNet, a user's own graph) gives the same GraphData.

`load_dataset(cfg.dataset)` is the one entry point the rest of degnn uses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import dgl
import torch


class DatasetError(RuntimeError):
    """A dataset that cannot be loaded; the message names the problem and the fix."""


@dataclass
class GraphData:
    name: str
    # "node" | "link"
    task: str
    # node task: ndata feat (float32 [N,F]), label (int64 [N]), train_mask/val_mask/test_mask (bool [N])
    # link task: ndata feat; the graph holds the training edges only
    graph: dgl.DGLGraph
    num_classes: int
    # "acc" | "mrr"
    metric: str
    # (y_true, y_pred) -> metric value; node task: labels [n] and predicted classes [n]
    evaluate: Callable[[torch.Tensor, torch.Tensor], float]
    # link task: {"valid": {"source_node", "target_node", "target_node_neg"}, "test": {...}} (OGB style)
    link_split: Optional[Dict[str, Dict[str, torch.Tensor]]] = None
    info: Dict[str, object] = field(default_factory=dict)


def load_dataset(cfg) -> GraphData:
    """Load the dataset described by a DatasetConfig (see degnn/config.py)."""
    raise NotImplementedError("filled in by degnn/data")
