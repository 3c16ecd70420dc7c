"""Datasets: every source (real OGB, synthetic, WordNet, a user's own graph) gives the same GraphData.

`load_dataset(cfg.dataset)` is the one entry point the rest of degnn uses.

Sources, one module each: `ogb_real` (ogbn-arxiv/products/papers100M, ogbl-citation2 through ogb's
loaders), `synthetic` (planted-community graphs), `wordnet` (WordNet 3.0 synsets), `debian` (the
APT index's package graph), `custom` (a dgl.save_graphs file or an OGB-layout folder). `ogb_layout` writes/reads OGB's on-disk layout;
every generated graph is written there and read back through ogb's real loader.
"""
from __future__ import annotations

import os
import time
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
    # link task: (scores of true edges [n], scores of their negatives [n, k]) -> MRR
    evaluate: Callable[[torch.Tensor, torch.Tensor], float]
    # link task: {"valid": {"source_node", "target_node", "target_node_neg"}, "test": {...}} (OGB style)
    # plus "train": {"source_node", "target_node"} (the training edges, one direction)
    link_split: Optional[Dict[str, Dict[str, torch.Tensor]]] = None
    info: Dict[str, object] = field(default_factory=dict)


KINDS = ("synthetic", "ogb", "wordnet", "debian", "custom")


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


def load_dataset(cfg) -> GraphData:
    """Load the dataset described by a DatasetConfig (see degnn/config.py)."""
    name = config_value(cfg, "name")
    kind = config_value(cfg, "kind")
    task = config_value(cfg, "task", "node") or "node"
    if not name:
        raise DatasetError("dataset.name is empty; pick a dataset, e.g. dataset=synthetic-tiny")
    if kind not in KINDS:
        raise DatasetError(f"dataset {name}: unknown dataset.kind {kind!r}; use one of {', '.join(KINDS)}")
    if task not in ("node", "link"):
        raise DatasetError(f"dataset {name}: unknown dataset.task {task!r}; use node or link")
    t0 = time.time()
    if kind == "synthetic":
        from .synthetic import load_synthetic as fn
    elif kind == "ogb":
        from .ogb_real import load_ogb as fn
    elif kind == "wordnet":
        from .wordnet import load_wordnet as fn
    elif kind == "debian":
        from .debian import load_debian as fn
    else:
        from .custom import load_custom as fn
    data = fn(cfg)
    data = finalize(data, bool(config_value(cfg, "to_bidirected", True)))
    data.info.setdefault("load_s", round(time.time() - t0, 3))
    return data


def on_disk(cfg) -> bool:
    """Whether loading needs no download: real OGB data must already be under dataset.root;
    every other kind is built offline (synthetic, WordNet, the APT index) or is the user's own file."""
    if config_value(cfg, "kind") != "ogb":
        return True
    from .ogb_layout import _has_local
    from .ogb_real import dataset_dir

    return _has_local(dataset_dir(resolve_root(cfg), str(config_value(cfg, "name"))))


def dataset_version(cfg) -> Dict[str, object]:
    """What identifies the data a config produces, without loading it.

    Caches built from a dataset (the partitioners') key on this, so that a changed generator or a
    replaced file never reuses partitions of the old data.
    """
    kind = config_value(cfg, "kind")
    if kind == "synthetic":
        from .synthetic import _knobs
    elif kind == "wordnet":
        from .wordnet import _knobs
    elif kind == "debian":
        from .debian import _knobs
    else:
        # real OGB data and custom files: where they are, and when they last changed
        if kind == "custom":
            path = config_value(cfg, "path")
        else:
            path = os.path.join(resolve_root(cfg), str(config_value(cfg, "name", "")))
        path = os.path.abspath(os.path.expanduser(str(path))) if path else ""
        return {"kind": kind, "path": path, "mtime": os.path.getmtime(path) if path and os.path.exists(path) else None}
    return {"kind": kind, **_knobs(cfg)}


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


def finalize(data: GraphData, to_bidirected: bool) -> GraphData:
    """Normalize dtypes, keep only the standard ndata and optionally make the graph bidirected."""
    g = data.graph
    keys = _NODE_KEYS if data.task == "node" else ("feat",)
    nd = {k: g.ndata[k] for k in keys if k in g.ndata}
    check_finite(data.name, nd)
    nd["feat"] = nd["feat"].float()
    if "label" in nd:
        nd["label"] = nd["label"].reshape(-1).long()
    for k in ("train_mask", "val_mask", "test_mask"):
        if k in nd:
            nd[k] = nd[k].bool()
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
