"""partition_graph (an in-memory graph -> a DGL partition folder) and ensure_partitions (cached).

A partition folder is written into a hidden sibling temporary folder (``.<name>.tmp-<pid>-<hex>``)
and renamed into place only when every file, ``stats.json`` and finally the ``COMPLETE`` marker
are written: an interrupted run never leaves anything at ``out`` that looks like a partition.
Writers of the same folder serialise on ``fcntl.flock`` of ``.<name>.lock`` next to it, so
several processes calling `ensure_partitions` at once partition only once.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import resource
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np

from degnn.proc import pid_alive

from .assign import METHODS, RANDOM_STREAM, PartitionError, compute_assignment, effective_num_supernodes, structure_graph
from .stats import partition_stats
from .writer import LINK_SPLIT, write_partitions

COMPLETE = "COMPLETE"
STATS = "stats.json"


# ----------------------------------------------------------------------------- helpers
@contextmanager
def _folder_lock(out: Path):
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = out.parent / f".{out.name}.lock"
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _clean_stale_temps(out: Path) -> None:
    """Remove temporary folders left by killed writers of `out` (called under the lock)."""
    for p in out.parent.glob(f".{out.name}.tmp-*"):
        try:
            pid = int(p.name.rsplit(".tmp-", 1)[1].split("-")[0])
        except (IndexError, ValueError):
            continue
        if pid == os.getpid() or not pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)
    for p in out.parent.glob(f".{out.name}.old-*"):
        shutil.rmtree(p, ignore_errors=True)


def _read_partition_meta(out: Path) -> Optional[Dict[str, Any]]:
    """The partition JSON found in `out` (ours or DGL's), or None."""
    for j in sorted(out.glob("*.json")):
        if j.name == STATS:
            continue
        try:
            with open(j) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and "num_parts" in meta and "graph_name" in meta:
            meta["_path"] = str(j)
            return meta
    return None


def _identity(meta: Dict[str, Any]):
    method = meta.get("degnn", {}).get("method", meta.get("part_method"))
    return meta.get("graph_name"), method, meta.get("num_parts")


def _check_out(out: Path, graph_name: str, method: str, num_parts: int, force: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise PartitionError(f"out {out} is a file; choose a folder path")
    if force or not any(out.iterdir()):
        return
    meta = _read_partition_meta(out)
    if meta is None:
        raise PartitionError(
            f"out {out} is not empty and holds no partition; choose an empty or new folder, "
            "or pass force=true to replace it"
        )
    g, m, k = _identity(meta)
    if (g, m, k) != (graph_name, method, num_parts):
        raise PartitionError(
            f"out {out} already holds partitions of graph '{g}' (method {m}, {k} parts), not "
            f"'{graph_name}' ({method}, {num_parts} parts); choose another out or pass force=true"
        )


def _validate(method: str, num_parts: Any, num_nodes: Optional[int], graph_name: str = "g") -> None:
    if method not in METHODS:
        raise PartitionError(f"unknown partition method '{method}'; use one of {', '.join(METHODS)}")
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise PartitionError(f"partition.num_parts must be an integer (got {num_parts!r})")
    if num_parts < 1:
        raise PartitionError(f"partition.num_parts must be at least 1 (got {num_parts}); set partition.num_parts=K with K >= 1")
    if num_nodes is not None and num_parts > num_nodes:
        raise PartitionError(
            f"partition.num_parts={num_parts} exceeds the graph's {num_nodes} nodes; "
            f"set partition.num_parts to at most {num_nodes}"
        )
    if not graph_name or "/" in graph_name or graph_name.startswith("."):
        raise PartitionError(f"graph name {graph_name!r} is not a plain file name; pick e.g. the dataset name")


def is_complete(out: Union[str, Path]) -> bool:
    """True when `out` holds a finished partition (COMPLETE marker, JSON and every part file)."""
    out = Path(out)
    if not (out / COMPLETE).is_file():
        return False
    meta = _read_partition_meta(out)
    if meta is None:
        return False
    for i in range(int(meta["num_parts"])):
        files = meta.get(f"part-{i}", {})
        for key in ("part_graph", "node_feats", "edge_feats"):
            if key not in files or not (out / files[key]).is_file():
                return False
    link = meta.get("degnn", {}).get("link_split")
    return link is None or (out / link).is_file()


# ----------------------------------------------------------------------------- partition_graph
def _write(
    graph,
    method: str,
    num_parts: int,
    out: Path,
    graph_name: str,
    seed: int,
    num_supernodes: int,
    balance_edges: bool,
    settings: Dict[str, Any],
    link_split=None,
    load_time_s: Optional[float] = None,
) -> Path:
    """Partition into a temporary sibling folder, then rename it to `out` (caller holds the lock).
    stats.json records the seconds (`load_time_s`: the dataset's load or build, when the caller
    timed it) and the partitioning process's peak RSS (`peak_rss_mb`, the whole graph included)."""
    _clean_stale_temps(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        t0 = time.time()
        sg = structure_graph(graph) if method != "random" else None
        part = compute_assignment(graph, method, num_parts, seed, num_supernodes, balance_edges, sg)
        t1 = time.time()
        extra = {
            "method": method,
            "seed": int(seed),
            "balance_edges": bool(balance_edges),
            "settings": settings,
        }
        if method == "supernode":
            extra["num_supernodes"] = effective_num_supernodes(graph.num_nodes(), num_parts, num_supernodes)
        res = write_partitions(graph, part, num_parts, tmp, graph_name, method, extra, sim_g=sg,
                               link_split=link_split)
        del sg
        t2 = time.time()
        stats = {"graph_name": graph_name, "method": method, "seed": int(seed)}
        if method != "random":
            stats["balance_edges"] = bool(balance_edges)
        if method == "supernode":
            stats["num_supernodes"] = extra["num_supernodes"]
        # halo as stored in the part graphs (tests check it equals partition_stats' own count)
        stats.update(partition_stats(graph, part, num_parts, halo=res["halo"]))
        if link_split is not None:
            stats["link_eval_edges"] = {p: int(len(link_split[p]["source_node"])) for p in ("valid", "test")}
            stats["link_num_neg"] = int(link_split["valid"]["target_node_neg"].shape[1])
        stats.update(
            {"wall_time_s": round(t2 - t0, 4), "assign_time_s": round(t1 - t0, 4), "write_time_s": round(t2 - t1, 4),
             "load_time_s": None if load_time_s is None else round(load_time_s, 4),
             "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)}
        )
        with open(tmp / STATS, "w") as f:
            json.dump(stats, f, indent=2)
        (tmp / COMPLETE).write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + "\n")
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / f"{graph_name}.json"


def partition_graph(
    graph,
    method: str,
    num_parts: int,
    out: Union[str, Path],
    graph_name: str,
    seed: int = 0,
    num_supernodes: int = 15000,
    balance_edges: bool = True,
    force: bool = False,
    link_split=None,
) -> Path:
    """Partition an in-memory homogeneous DGL graph into `out` in DGL's partition format.

    Returns the partition JSON (``<out>/<graph_name>.json``). Writes ``<out>/stats.json`` and
    ``<out>/COMPLETE``; for a link dataset pass its `link_split` (GraphData.link_split): the
    validation and test edges and negatives are written with the partition (writer.LINK_SPLIT). Refuses (PartitionError) a folder holding another graph's partitions (other
    graph_name, method or num_parts) or unrelated files unless ``force``; a partition of the same
    graph, method and K is replaced.
    """
    return _partition_graph(graph, method, num_parts, out, graph_name, seed, num_supernodes, balance_edges, force,
                            link_split=link_split)


def _partition_graph(
    graph, method, num_parts, out, graph_name, seed=0, num_supernodes=15000, balance_edges=True,
    force=False, settings: Optional[Dict[str, Any]] = None, link_split=None,
) -> Path:
    _validate(method, num_parts, graph.num_nodes(), graph_name)
    out = Path(out).absolute()
    _check_out(out, graph_name, method, int(num_parts), force)
    if settings is None:
        settings = {"method": method, "num_parts": int(num_parts), "seed": int(seed)}
    with _folder_lock(out):
        _check_out(out, graph_name, method, int(num_parts), force)
        return _write(graph, method, int(num_parts), out, graph_name, int(seed), int(num_supernodes),
                      bool(balance_edges), settings, link_split=link_split)


# ----------------------------------------------------------------------------- ensure_partitions
def _cfg_dict(cfg) -> Dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, dict):
        return dict(cfg)
    return dict(vars(cfg))


def cache_dir(dataset_cfg, partition_cfg) -> Path:
    """``<root>/<dataset>/<method>-k<K>-s<seed>-<settings hash>`` (a relative root is resolved
    against the cwd). The hash of every setting (dataset knobs, data version, method options) keeps
    partitions of different data in different folders: one folder rewritten for another config
    while a run reads it made that run train on the other config's graph and labels."""
    root_s = str(partition_cfg.root)
    if "${" in root_s:  # a plain dataclass PartitionConfig carries the unresolved default
        from omegaconf import OmegaConf

        root_s = str(OmegaConf.create({"root": root_s}).root)
    root = Path(root_s).expanduser()
    if not root.is_absolute():
        root = Path.cwd() / root
    digest = hashlib.sha1(json.dumps(_settings(dataset_cfg, partition_cfg), sort_keys=True)
                          .encode()).hexdigest()[:8]
    return root / str(dataset_cfg.name) / (f"{partition_cfg.method}-k{int(partition_cfg.num_parts)}"
                                           f"-s{int(partition_cfg.seed)}-{digest}")


def _settings(dataset_cfg, partition_cfg) -> Dict[str, Any]:
    from degnn.data import dataset_version

    ds = {k: v for k, v in _cfg_dict(dataset_cfg).items() if k != "root"}
    s: Dict[str, Any] = {
        "dataset": json.loads(json.dumps(ds, default=str)),
        # the data itself (generator version, file times): new data is never served old partitions
        "dataset_version": json.loads(json.dumps(dataset_version(dataset_cfg), default=str)),
        "method": str(partition_cfg.method),
        "num_parts": int(partition_cfg.num_parts),
        "seed": int(partition_cfg.seed),
    }
    if s["method"] == "supernode":
        s["num_supernodes"] = int(partition_cfg.num_supernodes)
    if s["method"] != "random":
        s["balance_edges"] = bool(partition_cfg.balance_edges)
    else:
        s["stream"] = RANDOM_STREAM
    if s["dataset"].get("task") == "link":  # partitions of link data carry its split (writer.LINK_SPLIT)
        s["link_split"] = LINK_SPLIT
    return s


def _cached(out: Path, settings: Dict[str, Any]) -> Optional[Path]:
    if not is_complete(out):
        return None
    meta = _read_partition_meta(out)
    if meta is None or meta.get("degnn", {}).get("settings") != settings:
        return None
    return Path(meta["_path"])


def planned_partitions(dataset_cfg, partition_cfg):
    """(the partition JSON `ensure_partitions` returns, whether it is already built), reading
    only the cache folder: what a dry run prints without loading the dataset."""
    _validate(str(partition_cfg.method), partition_cfg.num_parts, None, str(dataset_cfg.name))
    out = cache_dir(dataset_cfg, partition_cfg)
    hit = _cached(out, _settings(dataset_cfg, partition_cfg))
    return (hit, True) if hit is not None else (out / f"{dataset_cfg.name}.json", False)


def ensure_partitions(dataset_cfg, partition_cfg) -> Path:
    """The partition JSON of `dataset_cfg` cut by `partition_cfg`, partitioning only if needed.

    Cached at ``cache_dir(dataset_cfg, partition_cfg)``; a complete folder written with the same
    settings (dataset config, method, K, seed, num_supernodes, balance_edges) is reused untouched;
    a missing, incomplete or differently-configured one is (re)written under a file lock.
    """
    method = str(partition_cfg.method)
    _validate(method, partition_cfg.num_parts, None, str(dataset_cfg.name))
    out = cache_dir(dataset_cfg, partition_cfg)
    settings = _settings(dataset_cfg, partition_cfg)
    hit = _cached(out, settings)
    if hit is not None:
        return hit
    with _folder_lock(out):
        hit = _cached(out, settings)  # another process may have written it meanwhile
        if hit is not None:
            return hit
        from degnn.data import load_dataset

        t0 = time.time()
        data = load_dataset(dataset_cfg)
        graph = data.graph
        load_s = time.time() - t0
        _validate(method, int(partition_cfg.num_parts), graph.num_nodes(), str(dataset_cfg.name))
        return _write(
            graph,
            method,
            int(partition_cfg.num_parts),
            out,
            str(dataset_cfg.name),
            int(partition_cfg.seed),
            int(partition_cfg.num_supernodes),
            bool(partition_cfg.balance_edges),
            settings,
            link_split=getattr(data, "link_split", None),  # None for a node task
            load_time_s=load_s,
        )
