"""`dataset=` for chunked graphs: a user's own (kind `chunked`, dataset.path=FOLDER) or the
streaming generator's (kind `synthetic_chunked`, written under dataset.root on first use).

`chunked_folder(cfg)` is the folder itself, for the streaming partitioner, which never loads the
graph (degnn.partition_cache); `load_chunked(cfg)` reads it whole into a GraphData, for what needs
the graph in one process (METIS, supernode, the reference runs) and only for graphs that fit.
"""
from __future__ import annotations

import hashlib
import json
import os.path as osp
import shutil
import sys
import time
import uuid
from pathlib import Path

from degnn.chunked import META, ChunkedError, open_chunked, read_whole
from .graph import DatasetError, GraphData, config_value, resolve_root


def _generator_knobs(cfg):
    from .synthetic_stream import knobs

    return knobs(int(config_value(cfg, "num_nodes", 0)), int(config_value(cfg, "num_classes", 0)),
                 int(config_value(cfg, "feat_dim", 128)), float(config_value(cfg, "avg_degree", 20.0)),
                 float(config_value(cfg, "homophily", 0.5)), float(config_value(cfg, "feat_noise", 1.0)),
                 int(config_value(cfg, "seed", 0)))


def chunked_folder(cfg) -> Path:
    """The chunked graph folder of a `chunked` or `synthetic_chunked` dataset config (generated,
    whole or not at all, when missing)."""
    name = str(config_value(cfg, "name"))
    if bool(config_value(cfg, "to_bidirected", False)):
        raise DatasetError(f"dataset {name}: dataset.to_bidirected=true, but a chunked graph is used as "
                           f"stored; store both directions in its chunks and set dataset.to_bidirected=false")
    if config_value(cfg, "kind") == "chunked":
        path = config_value(cfg, "path")
        if not path:
            raise DatasetError(f"dataset {name}: dataset.path is unset; give the folder holding metadata.json")
        return Path(str(path)).expanduser().absolute()
    k = _generator_knobs(cfg)
    if k["num_nodes"] < 10 or not 2 <= k["num_classes"] <= k["num_nodes"]:
        raise DatasetError(f"dataset {name}: num_nodes={k['num_nodes']}, num_classes={k['num_classes']}; "
                           f"set num_nodes >= 10 and 2 <= num_classes <= num_nodes")
    h = hashlib.sha1(json.dumps(k, sort_keys=True).encode()).hexdigest()[:10]
    d = Path(resolve_root(cfg)).absolute() / f"{name.replace('-', '_')}_{h}"
    if not (d / META).is_file():
        from .synthetic_stream import generate_chunked

        tmp = d.parent / f".{d.name}.tmp-{uuid.uuid4().hex[:8]}"
        t0 = time.time()
        # minutes at millions of nodes: say what is happening (progress output, not a hang)
        print(f"degnn: generating dataset {name} ({k['num_nodes']} nodes) into {d}, a block at a time",
              file=sys.stderr, flush=True)
        try:
            generate_chunked({**k, "name": name}, tmp)
            if not (d / META).is_file():
                shutil.rmtree(d, ignore_errors=True)
                tmp.rename(d)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"degnn: dataset {name} generated in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    return d


def load_chunked(cfg) -> GraphData:
    import dgl
    import numpy as np
    import torch

    from .evaluate import accuracy_evaluator

    name = str(config_value(cfg, "name"))
    try:
        g = open_chunked(chunked_folder(cfg))
    except ChunkedError as e:
        raise DatasetError(f"dataset {name}: {e}") from None
    missing = [k for k in ("feat", "label", "train_mask", "val_mask", "test_mask") if k not in g.node_data]
    if missing:
        raise DatasetError(f"dataset {name}: {g.path / META} has no node data {', '.join(missing)}; "
                           f"a node task needs feat, label and the three masks")
    try:
        src, dst, nd = read_whole(g)
    except ChunkedError as e:
        raise DatasetError(f"dataset {name}: {e}") from None
    graph = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=g.num_nodes)
    for k, v in nd.items():
        t = torch.from_numpy(np.ascontiguousarray(v))
        graph.ndata[k] = t.bool() if k.endswith("_mask") else t
    label = nd["label"].reshape(-1)
    num_classes = int(config_value(cfg, "num_classes", 0) or 0) or int(label.max()) + 1
    return GraphData(name=name, task="node", graph=graph, num_classes=num_classes, metric="acc",
                     evaluate=accuracy_evaluator(), info={"dir": str(g.path), "source": "chunked"})


def chunked_version(cfg):
    """What identifies the data (dataset_version): the generator's knobs, or the metadata's time."""
    if config_value(cfg, "kind") == "synthetic_chunked":
        return _generator_knobs(cfg)
    p = Path(str(config_value(cfg, "path") or "")).expanduser().absolute() / META
    return {"path": str(p.parent), "mtime": osp.getmtime(p) if p.is_file() else None}
