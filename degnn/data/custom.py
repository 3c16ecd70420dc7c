"""A user's own graph: `dataset=custom dataset.path=<file>` or `dataset.path=<folder>`.

- file: written by `dgl.save_graphs`, holding one homogeneous graph with node data
  feat (float [N,F]), label (int [N] or [N,1]), train_mask/val_mask/test_mask (bool or 0/1 [N]);
- folder: OGB's layout (raw/*.csv.gz, split/<name>/..., RELEASE_v1.txt), read by ogb's loader
  with a meta_dict built from what the folder holds (node task: node-label + split csvs;
  link task: split/<name>/split_dict.pt or {train,valid,test}.pt, each of valid/test with
  source_node, target_node and optionally target_node_neg [m, k]; without it every held-out
  edge gets 1000 negatives drawn with dataset.seed (linksplit.py), the same on every load).
"""
from __future__ import annotations

import os
import os.path as osp

import torch

from .graph import DatasetError, GraphData, config_value
from . import ogb_layout as L
from .evaluate import accuracy_evaluator, mrr_evaluator

EXPECTED = ("expected feat (float [N,F]), label (int [N]), "
            "train_mask/val_mask/test_mask (bool [N])")


def load_custom(cfg) -> GraphData:
    path = config_value(cfg, "path")
    if not path or str(path) == "???":
        raise DatasetError("dataset=custom needs dataset.path=<dgl.save_graphs file or OGB-layout folder>")
    path = osp.abspath(osp.expanduser(str(path)))
    name = config_value(cfg, "name") or "custom"
    task = config_value(cfg, "task", "node")
    if osp.isdir(path):
        return _load_folder(name, path, task, cfg)
    if not osp.isfile(path):
        raise DatasetError(f"custom dataset path {path} does not exist; "
                           f"pass a dgl.save_graphs file or an OGB-layout folder as dataset.path")
    if task != "node":
        raise DatasetError(f"custom graph {path}: a dgl.save_graphs file serves dataset.task=node only; "
                           f"for link prediction pass an OGB-layout folder with split/<name>/split_dict.pt")
    return _load_file(name, path, cfg)


def _load_file(name: str, path: str, cfg) -> GraphData:
    import dgl

    try:
        graphs, _ = dgl.load_graphs(path)
    except Exception as exc:  # DGL raises plain DGLError/RuntimeError on a non-graph or damaged file
        raise DatasetError(f"custom graph {path} cannot be read by dgl.load_graphs ({type(exc).__name__}); "
                           f"write it with dgl.save_graphs([g], path)") from exc
    if len(graphs) != 1:
        raise DatasetError(f"custom graph {path}: holds {len(graphs)} graphs; save exactly one ([g])")
    g = graphs[0]
    if len(g.ntypes) != 1 or len(g.etypes) != 1:
        raise DatasetError(f"custom graph {path}: heterogeneous graphs are not supported; "
                           f"save a homogeneous graph (dgl.to_homogeneous)")
    n = g.num_nodes()
    for key in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        if key not in g.ndata:
            raise DatasetError(f"custom graph {path}: node data '{key}' missing; {EXPECTED}")
    feat, label = g.ndata["feat"], g.ndata["label"]
    if feat.dim() != 2 or not feat.is_floating_point():
        raise DatasetError(f"custom graph {path}: node data 'feat' is {feat.dtype} {list(feat.shape)}; {EXPECTED}")
    if label.dim() == 2 and label.shape[1] == 1:
        label = label.reshape(-1)
    if label.dim() != 1 or label.is_floating_point() or label.dtype == torch.bool:
        raise DatasetError(f"custom graph {path}: node data 'label' is {label.dtype} {list(label.shape)}; {EXPECTED}")
    if n and int(label.min()) < 0:
        raise DatasetError(f"custom graph {path}: node data 'label' has negative values; "
                           f"use class ids 0..C-1 for every node")
    for key in ("train_mask", "val_mask", "test_mask"):
        m = g.ndata[key]
        if m.shape != (n,) or not (m.dtype == torch.bool or (not m.is_floating_point() and int(m.max()) <= 1)):
            raise DatasetError(f"custom graph {path}: node data '{key}' is {m.dtype} {list(m.shape)}; {EXPECTED}")
        g.ndata[key] = m.bool()
    _check_masks(g, path)
    g.ndata["label"] = label.long()
    num_classes = _num_classes(cfg, label, path)
    return GraphData(name=name, task="node", graph=g, num_classes=num_classes, metric="acc",
                     evaluate=accuracy_evaluator(), info={"path": path, "source": "custom"})


def _check_masks(g, path: str) -> None:
    """Every split selects at least one node: training needs train_mask, and evaluation (the best
    model, early stop, the test metric) needs val_mask and test_mask."""
    for key, what in (("train_mask", "training"), ("val_mask", "validation"), ("test_mask", "test")):
        if int(g.ndata[key].sum()) == 0:
            raise DatasetError(f"custom graph {path}: node data '{key}' selects no node; mark "
                               f"{what} nodes True")


def _num_classes(cfg, label: torch.Tensor, path: str) -> int:
    """dataset.num_classes when set (0 = count from the labels); it must cover every label."""
    seen = int(label.max()) + 1 if label.numel() else 1
    want = int(config_value(cfg, "num_classes", 0) or 0)
    if want and want < seen:
        raise DatasetError(f"custom graph {path}: labels go up to {seen - 1} but dataset.num_classes={want}; "
                           f"set dataset.num_classes={seen} or 0 (count from the labels)")
    return want or seen


def _load_folder(name: str, path: str, task: str, cfg) -> GraphData:
    raw = osp.join(path, "raw")
    if not osp.isfile(osp.join(raw, "edge.csv.gz")):
        raise DatasetError(f"custom folder {path}: raw/edge.csv.gz missing; expected OGB's csv layout "
                           f"(raw/edge.csv.gz, raw/num-node-list.csv.gz, raw/num-edge-list.csv.gz, "
                           f"raw/node-feat.csv.gz, split/<name>/, RELEASE_v1.txt)")
    if not osp.isfile(osp.join(raw, "node-feat.csv.gz")):
        raise DatasetError(f"custom folder {path}: raw/node-feat.csv.gz missing; degnn needs node features")
    splits = sorted(os.listdir(osp.join(path, "split"))) if osp.isdir(osp.join(path, "split")) else []
    if len(splits) != 1:
        raise DatasetError(f"custom folder {path}: expected exactly one split/<name>/ folder, found {splits or 'none'}")
    extra = sorted(f[:-7] for f in os.listdir(raw) if f.startswith("node_") and f.endswith(".csv.gz"))
    if task == "link":
        meta = L.link_meta(path, name, splits[0], add_inverse_edge=False)
        _, g, split = L.read_link(name, path, meta)
        split = _with_negatives(split, g, int(config_value(cfg, "seed", 0) or 0), path)
        return GraphData(name=name, task="link", graph=g, num_classes=0, metric="mrr", evaluate=mrr_evaluator(),
                         link_split=split, info={"path": path, "source": "custom"})
    if not osp.isfile(osp.join(raw, "node-label.csv.gz")):
        raise DatasetError(f"custom folder {path}: raw/node-label.csv.gz missing; node classification needs labels")
    num_classes = int(config_value(cfg, "num_classes", 0) or 0)
    # ogb only uses num_classes as metadata; our own count comes from the labels when not configured
    meta = L.node_meta(path, name, max(num_classes, 1), splits[0], extra_node_files=extra)
    _, g, labels, split = L.read_node(name, path, meta)
    from .graph import node_masks

    label = labels.reshape(-1)
    if label.is_floating_point():
        raise DatasetError(f"custom folder {path}: raw/node-label.csv.gz has empty/NaN labels; give every node a class id")
    g.ndata["label"] = label.long()
    g.ndata.update(node_masks(g.num_nodes(), split))
    _check_masks(g, path)
    return GraphData(name=name, task="node", graph=g, num_classes=_num_classes(cfg, label, path),
                     metric="acc", evaluate=accuracy_evaluator(), info={"path": path, "source": "custom"})


def _with_negatives(split, g, seed: int, path: str):
    """valid/test without `target_node_neg` get NUM_NEG seeded negatives (the same on every load)."""
    import numpy as np

    from .linksplit import NUM_NEG, edge_keys, sample_negatives

    for part in ("valid", "test"):
        if part not in split or "source_node" not in split[part] or "target_node" not in split[part]:
            raise DatasetError(f"custom folder {path}: the edge split has no {part} source_node/target_node; "
                               f"give valid and test edges (OGB's split_dict.pt layout)")
        if len(split[part]["source_node"]) == 0:
            raise DatasetError(f"custom folder {path}: the edge split's {part} edges are empty; give at "
                               f"least one {part} edge (OGB's split_dict.pt layout)")
    if all("target_node_neg" in split[p] for p in ("valid", "test")):
        return split
    n = g.num_nodes()
    src, dst = (t.numpy() for t in g.edges())
    held = [np.stack([split[p]["source_node"].numpy(), split[p]["target_node"].numpy()]) for p in ("valid", "test")]
    keys = edge_keys(np.concatenate([np.stack([src, dst])] + held, axis=1), n)
    rng = np.random.default_rng(seed)
    for p in ("valid", "test"):
        if "target_node_neg" not in split[p]:
            split[p]["target_node_neg"] = torch.from_numpy(
                sample_negatives(split[p]["source_node"].numpy(), keys, n, NUM_NEG, rng))
    return split
