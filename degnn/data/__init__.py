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
from typing import Dict

from .graph import (DatasetError, GraphData, check_finite, config_value, edge_homophily, finalize, graph_stats,
                    node_masks, resolve_root)


KINDS = ("synthetic", "ogb", "wordnet", "debian", "custom", "chunked", "synthetic_chunked")
# kinds stored as chunked graphs (degnn/chunked.py): partitioned randomly without loading them whole
CHUNKED_KINDS = ("chunked", "synthetic_chunked")


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
    elif kind in CHUNKED_KINDS:
        from .chunked_dataset import load_chunked as fn
    else:
        from .custom import load_custom as fn
    data = fn(cfg)
    # a chunked graph is used as stored (chunked_dataset.chunked_folder refuses to_bidirected)
    data = finalize(data, kind not in CHUNKED_KINDS and bool(config_value(cfg, "to_bidirected", True)))
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
    elif kind in CHUNKED_KINDS:
        from .chunked_dataset import chunked_version

        return {"kind": kind, **chunked_version(cfg)}
    else:
        # real OGB data and custom files: where they are, and when they last changed
        if kind == "custom":
            path = config_value(cfg, "path")
        else:
            path = os.path.join(resolve_root(cfg), str(config_value(cfg, "name", "")))
        path = os.path.abspath(os.path.expanduser(str(path))) if path else ""
        return {"kind": kind, "path": path, "mtime": os.path.getmtime(path) if path and os.path.exists(path) else None}
    return {"kind": kind, **_knobs(cfg)}


__all__ = ["CHUNKED_KINDS", "DatasetError", "GraphData", "KINDS", "check_finite", "config_value", "dataset_version", "edge_homophily",
           "finalize", "graph_stats", "load_dataset", "node_masks", "on_disk", "resolve_root"]
