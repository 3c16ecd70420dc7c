"""The GraphData every dataset source gives, and what the sources share to build it.

The sources (degnn/data/<source>.py) import from here, never from the package's __init__ (which
imports them): DatasetError, GraphData, reading a dataset config, node masks, graph statistics, and
`finalize`, the one normalization every loaded graph goes through.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import dgl
import numpy as np
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
    # link task: (scores of true edges [n], scores of their negatives [n, k]) -> MRR
    evaluate: Callable[[torch.Tensor, torch.Tensor], float]
    # link task: {"valid": {"source_node", "target_node", "target_node_neg"}, "test": {...}} (OGB style)
    # plus "train": {"source_node", "target_node"} (the training edges, one direction)
    link_split: Optional[Dict[str, Dict[str, torch.Tensor]]] = None
    info: Dict[str, object] = field(default_factory=dict)


def config_value(cfg, key, default=None):
    # works for the DatasetConfig dataclass, an OmegaConf node and a plain dict; an unset `???`
    # value reads as `default`, so the caller's DatasetError (naming the fix) is what the user sees
    from omegaconf.errors import MissingMandatoryValue

    try:
        if isinstance(cfg, dict):
            return cfg.get(key, default)
        return getattr(cfg, key, default)
    except MissingMandatoryValue:
        return default


def resolve_root(cfg) -> str:
    root = config_value(cfg, "root") or "data"
    return os.path.abspath(os.path.expanduser(str(root)))


def node_masks(num_nodes: int, split: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    out = {}
    for part, key in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
        m = torch.zeros(num_nodes, dtype=torch.bool)
        m[torch.as_tensor(split[part]).long()] = True
        out[key] = m
    return out


def edge_homophily(g: dgl.DGLGraph, label: torch.Tensor) -> float:
    src, dst = g.edges()
    keep = src != dst
    if int(keep.sum()) == 0:
        return 0.0
    return float((label[src[keep]] == label[dst[keep]]).float().mean())


def graph_stats(src, dst, label, num_nodes: int, num_classes: int) -> Dict[str, object]:
    """Size, degree and homophily of a node-classification graph given with both directions of every edge.

    edge_homophily: the fraction of edges joining two nodes of one class. adjusted_homophily: that
    fraction less what degree-weighted random labels give, scaled so 1 is perfect and 0 is chance
    ("Characterizing Graph Datasets for Node Classification: Homophily-Heterophily Dichotomy and
    Beyond", arXiv 2209.06177). class_homophily: the class-insensitive measure of "Large Scale
    Learning on Non-Homophilous Graphs" (arXiv 2110.14446), the mean over classes of each class's
    same-class edge fraction beyond its share of the nodes.
    """
    import numpy as np

    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    deg = np.bincount(src, minlength=num_nodes)
    out = {"nodes": int(num_nodes), "edges": int(len(src) // 2), "degree_mean": round(float(deg.mean()), 2),
           "degree_median": float(np.median(deg)), "degree_max": int(deg.max()) if num_nodes else 0,
           "isolated": int((deg == 0).sum())}
    # homophily over labelled nodes only (papers100M marks the unlabelled ones -1)
    label = np.asarray(label, dtype=np.int64).reshape(-1)
    known = label >= 0
    both = known[src] & known[dst]
    ls, ld, lab = label[src[both]], label[dst[both]], label[known]
    if not len(lab):
        return out
    c = max(int(num_classes), int(lab.max()) + 1)
    same = ls == ld
    h = float(same.mean()) if len(ls) else 0.0
    ends = np.bincount(ls, minlength=c)
    p = ends / max(len(ls), 1)  # each class's share of the edge ends
    chance = float((p ** 2).sum())
    adj = (h - chance) / (1.0 - chance) if chance < 1.0 else 0.0
    hk = np.bincount(ls[same], minlength=c) / np.maximum(ends, 1)
    share = np.bincount(lab, minlength=c) / len(lab)
    cls = float(np.clip(hk - share, 0, None)[ends > 0].sum() / max(c - 1, 1))
    out.update({"classes": int(len(np.unique(lab))), "majority_class": round(float(share.max()), 4),
                "edge_homophily": round(h, 4), "adjusted_homophily": round(adj, 4),
                "class_homophily": round(cls, 4)})
    return out


_NODE_KEYS = ("feat", "label", "train_mask", "val_mask", "test_mask")


def check_finite(name: str, ndata: Dict[str, torch.Tensor]) -> None:
    """NaN or infinite features/labels make every loss NaN: refuse them when the data loads."""
    for key in ("feat", "label"):
        x = ndata.get(key)
        if x is None or not x.is_floating_point():
            continue
        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            rows = bad.reshape(len(x), -1).any(dim=1)
            first = int(rows.nonzero()[0, 0])
            raise DatasetError(f"dataset {name}: node data '{key}' holds NaN or infinite values in "
                               f"{int(rows.sum())} of {len(x)} rows (first: node {first}); "
                               f"fix or drop those nodes")


# a class count this much beyond the classes the labels use (and at least this large) is a stray
# label or a typo, not a dataset: the model's output layer and every batch's logits have one
# column per class (one label 200000 among 0..2 made a model of 200,001 classes that ran out of
# memory)
SPARSE_CLASSES = (10, 1000)


def check_graph(name: str, g: dgl.DGLGraph) -> None:
    """A graph a GNN can train on: two nodes or more, and an edge between two different nodes
    (DGL's samplers and the partitioners fail on the rest with messages that name neither)."""
    n = g.num_nodes()
    if n < 2:
        raise DatasetError(f"dataset {name}: the graph has {n} node{'s' if n != 1 else ''}; a GNN "
                           f"needs a graph of two nodes or more, joined by edges")
    src, dst = g.edges()
    if g.num_edges() == 0:
        raise DatasetError(f"dataset {name}: the graph has {n} nodes and no edges; a GNN passes "
                           f"messages along edges: give the graph its edges")
    if not bool((src != dst).any()):
        raise DatasetError(f"dataset {name}: the graph's {g.num_edges()} edges are all self-loops "
                           f"(a node to itself); a GNN needs edges between different nodes")


def check_labels(name: str, nd: Dict[str, torch.Tensor], num_classes: int) -> None:
    """Every training, validation and test node's label is a class of the dataset, 0 ..
    num_classes-1, and num_classes is not far beyond the classes the labels use."""
    label = nd["label"].reshape(-1).long()
    for key, what in (("train_mask", "training"), ("val_mask", "validation"), ("test_mask", "test")):
        if key not in nd:
            continue
        mask = nd[key].bool()
        bad = mask & ((label < 0) | (label >= num_classes))
        if bool(bad.any()):
            node = int(bad.nonzero()[0, 0])
            raise DatasetError(f"dataset {name}: {int(bad.sum())} {what} node(s) have a label outside "
                               f"0..{num_classes - 1} (the dataset's {num_classes} classes), e.g. node "
                               f"{node} has {int(label[node])}; fix those labels (or the dataset's "
                               f"class count, dataset.num_classes)")
    # every labelled node (a label outside the splits also sets a class count taken from the labels)
    factor, least = SPARSE_CLASSES
    if num_classes < least:
        return
    known = label[(label >= 0) & (label < num_classes)]
    present = len(torch.unique(known))
    if num_classes > factor * max(present, 1):
        top = int(known.max()) if len(known) else -1
        where = int((label == top).nonzero()[0, 0]) if top >= 0 else None
        raise DatasetError(f"dataset {name}: {num_classes} classes (the model would have an output "
                           f"per class) but the labels use only {present}"
                           + (f"; the largest label is {top}, at node {where}" if where is not None else "")
                           + "; fix that stray label, or set dataset.num_classes to the real count")


def finalize(data: GraphData, to_bidirected: bool) -> GraphData:
    """Check the graph and its labels, normalize dtypes, keep only the standard ndata and
    optionally make the graph bidirected."""
    g = data.graph
    keys = _NODE_KEYS if data.task == "node" else ("feat",)
    nd = {k: g.ndata[k] for k in keys if k in g.ndata}
    check_finite(data.name, nd)
    check_graph(data.name, g)
    nd["feat"] = nd["feat"].float()
    if "label" in nd:
        nd["label"] = nd["label"].reshape(-1).long()
    for k in ("train_mask", "val_mask", "test_mask"):
        if k in nd:
            nd[k] = nd[k].bool()
    if "label" in nd:
        check_labels(data.name, nd, int(data.num_classes))
    if to_bidirected:
        # reverse edges added, duplicates merged; self-loops carry no neighbour information
        g = dgl.remove_self_loop(dgl.to_bidirected(dgl.graph(g.edges(), num_nodes=g.num_nodes())))
    else:
        g = dgl.graph(g.edges(), num_nodes=g.num_nodes())
    for k, v in nd.items():  # copied explicitly: we never rely on which ndata a transform keeps
        g.ndata[k] = v
    data.graph = g
    data.info["num_nodes"] = g.num_nodes()
    data.info["num_edges"] = g.num_edges()
    data.info["bidirected"] = to_bidirected
    if "label" in nd:
        data.info["homophily"] = round(edge_homophily(g, nd["label"]), 4)
        src, dst = g.edges()
        data.info["graph_stats"] = graph_stats(src.numpy(), dst.numpy(), nd["label"].numpy(),
                                               g.num_nodes(), data.num_classes)
    return data
