"""OGB's on-disk layout: a writer for graphs we build ourselves, and the one reader for every folder.

Everything that reaches the rest of degnn went through ogb's own `DglNodePropPredDataset` /
`DglLinkPropPredDataset`, so a generated graph and a downloaded OGB graph take the same code path.

Layout written (homogeneous, csv, no header, gzip):
    <dir>/RELEASE_v1.txt
    <dir>/raw/{edge,num-node-list,num-edge-list,node-feat[,node-label][,node_year]}.csv.gz
    <dir>/split/<split_name>/{train,valid,test}.csv.gz      (node task)
    <dir>/split/<split_name>/split_dict.pt                  (link task, OGB-citation2 style dict)
    <dir>/processed/dgl_data_processed                      (ogb's own cache, built on first read)
"""
from __future__ import annotations

import gzip
import json
import os
import os.path as osp
import shutil
import urllib.error
import zlib
from typing import Dict, Optional

import numpy as np
import pandas as pd
import torch
from dgl import DGLError

from degnn.compat import WEIGHTS_ONLY_REFUSED, WEIGHTS_ONLY_TAKES_NUMPY, safe_globals

from .graph import DatasetError

RELEASE = "RELEASE_v1.txt"
PROCESSED = osp.join("processed", "dgl_data_processed")
# a fast gzip level: level 9 made writing synthetic-arxiv's features several times slower
_GZ = {"method": "gzip", "compresslevel": 1}


# ---------------------------------------------------------------- writing

def _write_csv(path: str, arr: np.ndarray, float_fmt: Optional[str] = None) -> None:
    arr = np.asarray(arr)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if float_fmt is None:
        pd.DataFrame(arr).to_csv(path, header=False, index=False, compression=_GZ)
    else:
        # np.savetxt formats a whole row with one C-level `%`: 3-4x faster than pandas for
        # synthetic-arxiv's 169k x 128 floats (9 s against 30 s)
        with gzip.open(path, "wt", compresslevel=1) as fh:
            np.savetxt(fh, arr, fmt=float_fmt, delimiter=",")


def write_raw(
    dir_path: str,
    *,
    edges: np.ndarray,
    num_nodes: int,
    feat: np.ndarray,
    label: Optional[np.ndarray] = None,
    extra_node: Optional[Dict[str, np.ndarray]] = None,
) -> None:
    """raw/ files of one homogeneous graph. `edges` is [2, E]; `extra_node` keys start with 'node_'."""
    raw = osp.join(dir_path, "raw")
    os.makedirs(raw, exist_ok=True)
    _write_csv(osp.join(raw, "edge.csv.gz"), np.ascontiguousarray(edges.T).astype(np.int64))
    _write_csv(osp.join(raw, "num-node-list.csv.gz"), np.array([num_nodes], dtype=np.int64))
    _write_csv(osp.join(raw, "num-edge-list.csv.gz"), np.array([edges.shape[1]], dtype=np.int64))
    # 4 significant digits: plenty for noisy features and 3x smaller/faster than full precision
    _write_csv(osp.join(raw, "node-feat.csv.gz"), feat.astype(np.float32), float_fmt="%.4g")
    if label is not None:
        _write_csv(osp.join(raw, "node-label.csv.gz"), label.astype(np.int64))
    for key, arr in (extra_node or {}).items():
        assert key.startswith("node_"), key  # ogb asserts the same
        _write_csv(osp.join(raw, key + ".csv.gz"), arr.astype(np.int64))


def write_node_split(dir_path: str, split_name: str, split: Dict[str, np.ndarray]) -> None:
    sdir = osp.join(dir_path, "split", split_name)
    os.makedirs(sdir, exist_ok=True)
    for part in ("train", "valid", "test"):
        _write_csv(osp.join(sdir, part + ".csv.gz"), np.sort(split[part]).astype(np.int64))


def write_link_split(dir_path: str, split_name: str, split: Dict[str, Dict[str, np.ndarray]]) -> None:
    # split_dict.pt is ogb's short-cut format; tensors only, so torch.load(weights_only=True) reads it
    sdir = osp.join(dir_path, "split", split_name)
    os.makedirs(sdir, exist_ok=True)
    tsplit = {p: {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in d.items()} for p, d in split.items()}
    torch.save(tsplit, osp.join(sdir, "split_dict.pt"))


def mark_release(dir_path: str, params: Optional[dict] = None) -> None:
    """Mark a built folder complete; `params` (what it was generated from) go to params.json."""
    if params is not None:
        with open(osp.join(dir_path, "params.json"), "w") as fh:
            json.dump(params, fh, indent=1)
    with open(osp.join(dir_path, RELEASE), "w") as f:
        f.write("written by degnn.data\n")


def is_complete(dir_path: str) -> bool:
    return osp.isfile(osp.join(dir_path, RELEASE)) and osp.isfile(osp.join(dir_path, PROCESSED))


def build_atomically(final_dir: str, build) -> None:
    """Run build(tmp_dir) (write raw, split, RELEASE, processed) and rename tmp_dir to final_dir.

    An interrupted run leaves only a `.tmp-*` folder, never something that looks complete.
    If another process finished the same folder first, its copy wins and ours is dropped.
    """
    parent = osp.dirname(osp.abspath(final_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{final_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build(tmp)
        if osp.isdir(final_dir) and not is_complete(final_dir):
            shutil.rmtree(final_dir)  # a leftover of ours without RELEASE/processed: not valid
        try:
            os.rename(tmp, final_dir)
        except OSError:
            if not is_complete(final_dir):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- meta dicts (ogb's master.csv columns)

def node_meta(dir_path: str, name: str, num_classes: int, split_name: str,
              extra_node_files=(), add_inverse_edge: bool = False) -> Dict[str, object]:
    return {
        "dir_path": dir_path, "version": 1, "download_name": name,
        "num tasks": 1, "num classes": num_classes,
        "task type": "multiclass classification", "eval metric": "acc",
        # never used: we check that raw/edge.csv.gz exists before calling ogb
        "url": "",
        "add_inverse_edge": str(bool(add_inverse_edge)),
        "has_node_attr": "True", "has_edge_attr": "False",
        "split": split_name,
        "additional node files": ",".join(extra_node_files) or "None",
        "additional edge files": "None",
        "is hetero": "False", "binary": "False",
    }


def link_meta(dir_path: str, name: str, split_name: str, add_inverse_edge: bool) -> Dict[str, object]:
    return {
        "dir_path": dir_path, "version": 1, "download_name": name,
        "task type": "link prediction", "eval metric": "mrr", "url": "",
        "add_inverse_edge": str(bool(add_inverse_edge)),
        "has_node_attr": "True", "has_edge_attr": "False",
        "split": split_name,
        "additional node files": "None", "additional edge files": "None",
        "is hetero": "False", "binary": "False",
    }


# ---------------------------------------------------------------- reading

def _find_corrupt(dir_path: str) -> Optional[str]:
    """The first raw/split gzip file that does not decompress to the end, if any."""
    for sub in ("raw", "split"):
        for root, _, files in os.walk(osp.join(dir_path, sub)):
            for fn in sorted(files):
                if not fn.endswith(".gz"):
                    continue
                p = osp.join(root, fn)
                try:
                    with gzip.open(p, "rb") as f:
                        while f.read(1 << 22):
                            pass
                except (OSError, EOFError, zlib.error):
                    return p
    return None


def _raise_read_error(dir_path: str, exc: BaseException, what: str) -> None:
    bad = _find_corrupt(dir_path)
    if bad is not None:
        raise DatasetError(
            f"{what}: file {bad} is corrupted or truncated; delete the folder {dir_path} "
            f"to regenerate / re-download it") from exc
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    raise DatasetError(
        f"{what}: cannot read the OGB-layout folder {dir_path} ({type(exc).__name__}: {msg}); "
        f"delete its processed/ folder to rebuild from raw/, or the whole folder to regenerate / re-download it") from exc


def check_release(dir_path: str, version: int = 1) -> None:
    """ogb calls input() when the folder exists but RELEASE_v<version>.txt does not; say it ourselves."""
    rel = osp.join(dir_path, f"RELEASE_v{version}.txt")
    if osp.isdir(dir_path) and not osp.exists(rel):
        raise DatasetError(
            f"{dir_path} exists but has no RELEASE_v{version}.txt (an incomplete download or a hand-made "
            f"folder); delete the folder to re-download/regenerate, or create that file if the contents are complete")


def _has_local(dir_path: str) -> bool:
    return any(osp.isfile(osp.join(dir_path, p)) for p in (osp.join("raw", "edge.csv.gz"), osp.join("raw", "data.npz"), PROCESSED))


def _reraise(dir_path: str, exc: BaseException, what: str) -> None:
    # with nothing on disk ogb was downloading: network errors and its input() prompt are the
    # caller's to explain (ogb_real), not a corrupted folder
    if isinstance(exc, urllib.error.URLError) or not _has_local(dir_path):
        raise exc
    _raise_read_error(dir_path, exc, what)


_READ_ERRORS = (OSError, EOFError, zlib.error, ValueError, RuntimeError, KeyError, IndexError,
                pd.errors.ParserError, pd.errors.EmptyDataError, DGLError)


def read_node(name: str, dir_path: str, meta: Optional[Dict[str, object]] = None, root: Optional[str] = None):
    """(ogb dataset, graph, labels [N,1], split idx dict) through DglNodePropPredDataset."""
    from ogb.nodeproppred import DglNodePropPredDataset

    check_release(dir_path, int(meta["version"]) if meta else 1)
    try:
        if meta is not None:
            ds = DglNodePropPredDataset(name, meta_dict=meta)
        else:
            ds = DglNodePropPredDataset(name, root=root)
        graph, labels = ds[0]
        split = ds.get_idx_split()
    except DatasetError:
        raise
    except _READ_ERRORS as exc:
        _reraise(dir_path, exc, name)
    return ds, graph, labels, split


def read_link(name: str, dir_path: str, meta: Optional[Dict[str, object]] = None, root: Optional[str] = None):
    """(ogb dataset, graph, edge split dict) through DglLinkPropPredDataset."""
    from ogb.linkproppred import DglLinkPropPredDataset

    check_release(dir_path, int(meta["version"]) if meta else 1)
    try:
        if meta is not None:
            ds = DglLinkPropPredDataset(name, meta_dict=meta)
        else:
            ds = DglLinkPropPredDataset(name, root=root)
        graph = ds[0]
        split = read_edge_split(ds.root, ds.meta_info["split"])
    except DatasetError:
        raise
    except _READ_ERRORS as exc:
        _reraise(dir_path, exc, name)
    return ds, graph, split


def _numpy_safe_globals() -> list:
    """What a pickled numeric numpy array refers to, for torch.load(weights_only=True).

    Both spellings of numpy's array reconstructor: files written with numpy 1.x (OGB's own) name
    `numpy.core.multiarray._reconstruct`, numpy 2.x names `numpy._core...`. Arrays of Python
    objects still go through the weights-only unpickler element by element."""
    rec = np.empty(0).__reduce__()[0]  # the reconstructor pickle names, under either numpy
    out = [np.ndarray, np.dtype, (rec, "numpy.core.multiarray._reconstruct"),
           (rec, "numpy._core.multiarray._reconstruct")]
    for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
              np.uint64, np.float16, np.float32, np.float64):
        out.append(type(np.dtype(t)))
    return out


def load_split_file(path: str):
    """A split file (tensors or numeric numpy arrays in dicts) with torch.load(weights_only=True):
    a file from someone else cannot run code when loaded."""
    import pickle

    try:
        with safe_globals(_numpy_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        m = WEIGHTS_ONLY_REFUSED.search(str(exc))
        if m and m.group(1).startswith("numpy") and not WEIGHTS_ONLY_TAKES_NUMPY:
            raise DatasetError(f"split file {path} holds numpy arrays, which torch {torch.__version__} cannot "
                               f"load without letting the file run code; use torch>=2.4, or re-save the "
                               f"splits as tensors") from None
        what = f"refers to {m.group(1)}" if m else "is not a plain pickle of tensors or arrays"
        raise DatasetError(f"split file {path} {what} (refused: loading it could run code); "
                           f"replace it with OGB's original file or re-create the dataset") from None
    except (RuntimeError, EOFError, ValueError) as exc:
        raise DatasetError(f"split file {path} is truncated or damaged ({type(exc).__name__}); "
                           f"replace it with OGB's original file or re-create the dataset") from None


def read_edge_split(dir_path: str, split_name: str) -> Dict[str, Dict[str, torch.Tensor]]:
    """Like ogb's get_edge_split, with torch.load(weights_only=True) for every file.

    OGB's own citation2 files (train/valid/test.pt) are pickled dicts of numpy arrays; numeric
    numpy arrays are allowed (load_split_file), nothing else. Our own split_dict.pt holds tensors.
    """
    sdir = osp.join(dir_path, "split", split_name)
    sd = osp.join(sdir, "split_dict.pt")
    if osp.isfile(sd):
        split = load_split_file(sd)
    else:
        split = {}
        for part in ("train", "valid", "test"):
            p = osp.join(sdir, part + ".pt")
            if not osp.isfile(p):
                raise DatasetError(f"edge split file {p} missing; put OGB's split/{split_name}/ folder there "
                                   f"or delete {dir_path} to re-download")
            split[part] = load_split_file(p)
    return {part: {k: (torch.from_numpy(np.asarray(v)) if not torch.is_tensor(v) else v) for k, v in d.items()}
            for part, d in split.items()}
