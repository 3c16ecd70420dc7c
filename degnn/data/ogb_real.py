"""Real OGB datasets through ogb's own DGL loaders, rooted at cfg.root.

ogb downloads only when the key raw file is missing; offline it would then fail deep inside
urllib, and a folder without RELEASE_v1.txt or a >1 GB download makes it call input(). We look
at the disk first and turn each of those cases into a one-line DatasetError naming the folder.
Set DEGNN_OFFLINE=1 to never attempt a download.
"""
from __future__ import annotations

import builtins
import contextlib
import os
import os.path as osp
import socket
import sys
import urllib.error
import urllib.parse

import pandas as pd
import torch

from .graph import DatasetError, GraphData, config_value, node_masks, resolve_root
from . import ogb_layout as L
from .evaluate import accuracy_evaluator, mrr_evaluator

SUPPORTED = {"ogbn-arxiv": "node", "ogbn-products": "node", "ogbn-papers100M": "node", "ogbl-citation2": "link"}


def _master(task: str):
    import ogb

    sub = "nodeproppred" if task == "node" else "linkproppred"
    return pd.read_csv(osp.join(osp.dirname(ogb.__file__), sub, "master.csv"), index_col=0, keep_default_na=False)


def dataset_dir(root: str, name: str) -> str:
    # ogb's own rule: root/<name with - -> _>, or root/<that>_dgl if it exists
    d = osp.join(root, name.replace("-", "_"))
    return d + "_dgl" if osp.exists(d + "_dgl") else d


def _offline() -> bool:
    return os.environ.get("DEGNN_OFFLINE", "").lower() in ("1", "true", "yes")


def _reachable(url: str, timeout_s: float = 10.0) -> bool:
    """A bounded check before ogb's urlopen, which has no timeout and could hang on a dropped route."""
    u = urllib.parse.urlparse(url)
    try:
        socket.create_connection((u.hostname, u.port or 80), timeout=timeout_s).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _no_prompt_without_terminal():
    """ogb asks on stdin before a >1 GB download; with no terminal (a launched trainer, CI) that
    input() would block on an open pipe or raise EOFError, so answer it with EOFError at once."""
    if sys.stdin is not None and sys.stdin.isatty():
        yield
        return
    real = builtins.input

    def refuse(prompt=""):
        raise EOFError(prompt.strip())

    builtins.input = refuse
    try:
        yield
    finally:
        builtins.input = real


def load_ogb(cfg) -> GraphData:
    name = str(config_value(cfg, "name"))
    task = config_value(cfg, "task", "node")
    if name not in SUPPORTED:
        raise DatasetError(f"OGB dataset {name!r} is not supported; use one of {', '.join(SUPPORTED)}")
    if SUPPORTED[name] != task:
        raise DatasetError(f"{name} is a {SUPPORTED[name]} dataset but dataset.task={task}; "
                           f"set dataset.task={SUPPORTED[name]}")
    root = resolve_root(cfg)
    meta = _master(task)[name]
    d = dataset_dir(root, name)
    key = osp.join(d, "raw", "data.npz" if meta["binary"] == "True" else "edge.csv.gz")
    have = osp.isfile(key) or osp.isfile(osp.join(d, L.PROCESSED))
    where = (f"put the unzipped {meta['download_name']} folder from {meta['url']} at {d} "
             f"(with {osp.relpath(key, d)} and RELEASE_v{meta['version']}.txt)")
    if not have and osp.isdir(d):
        # half-downloaded or hand-made: ogb would prompt (no RELEASE) or silently re-download over it
        raise DatasetError(f"{name}: {d} exists but has neither {osp.relpath(key, d)} nor processed/; "
                           f"delete it and retry online, or {where}")
    if not have and _offline():
        raise DatasetError(f"{name} not found on disk and DEGNN_OFFLINE is set; {where}")
    if not have and not _reachable(meta["url"]):
        raise DatasetError(f"{name} not found on disk and {meta['url']} is unreachable (offline?); {where}")
    try:
        with _no_prompt_without_terminal():
            if task == "node":
                ds, g, labels, split = L.read_node(name, d, root=root)
            else:
                ds, g, split = L.read_link(name, d, root=root)
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise DatasetError(f"{name} not found on disk and the download failed ({exc}); {where}") from exc
    except EOFError as exc:  # ogb's input(): a >1 GB download asks for confirmation on stdin
        raise DatasetError(f"{name}: ogb asks to confirm a large download and there is no terminal; "
                           f"run the same command once in a terminal, or {where}") from exc
    except SystemExit as exc:  # ogb exit(-1)s when the download is declined
        raise DatasetError(f"{name}: download declined; {where}") from exc

    if task == "node":
        label = labels.reshape(-1)
        if label.is_floating_point():  # papers100M: NaN for unlabelled nodes (outside every split)
            label = torch.nan_to_num(label, nan=-1.0).long()
        g.ndata["label"] = label
        g.ndata.update(node_masks(g.num_nodes(), split))
        return GraphData(name=name, task="node", graph=g, num_classes=int(ds.num_classes), metric="acc",
                         evaluate=accuracy_evaluator(name), info={"dir": d, "source": "ogb"})
    return GraphData(name=name, task="link", graph=g, num_classes=0, metric="mrr", evaluate=mrr_evaluator(),
                     link_split=split, info={"dir": d, "source": "ogb"})
