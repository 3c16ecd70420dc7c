"""A partition folder: partition_graph (an in-memory graph -> DGL's partition format), written whole or not at all.

A partition folder is written into a hidden sibling temporary folder (``.<name>.tmp-<pid>-<hex>``)
and renamed into place only when every file, ``stats.json`` and finally the ``COMPLETE`` marker
are written: an interrupted run never leaves anything at ``out`` that looks like a partition.
Writers of the same folder serialise on ``fcntl.flock`` of ``.<name>.lock`` next to it, so
several processes asking for one partition at once partition only once.

``checksums.json`` records every file's size and sha256 as written (``file_checksums``);
``damage`` compares the folder with it: sizes only (a stat per file: what a run checks at start),
or the full sha256 as well (``partition.verify=true``: 235 MiB/s here with the page cache warm,
10 s and more for a graph of a few GiB, too slow for every start; docs/design.md, "Fault policy").
"""
from __future__ import annotations

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

from .assign import METHODS, PartitionError, compute_assignment, effective_num_supernodes, structure_graph
from .stats import partition_stats
from .writer import write_partitions

COMPLETE = "COMPLETE"
STATS = "stats.json"
CHECKSUMS = "checksums.json"


# ----------------------------------------------------------------------------- helpers
@contextmanager
def folder_lock(out: Path):
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


def read_partition_meta(out: Path) -> Optional[Dict[str, Any]]:
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


def check_out(out: Path, graph_name: str, method: str, num_parts: int, force: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise PartitionError(f"out {out} is a file; choose a folder path")
    if force or not any(out.iterdir()):
        return
    meta = read_partition_meta(out)
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


def validate(method: str, num_parts: Any, num_nodes: Optional[int], graph_name: str = "g") -> None:
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
    meta = read_partition_meta(out)
    if meta is None:
        return False
    for i in range(int(meta["num_parts"])):
        files = meta.get(f"part-{i}", {})
        for key in ("part_graph", "node_feats", "edge_feats"):
            if key not in files or not (out / files[key]).is_file():
                return False
    link = meta.get("degnn", {}).get("link_split")
    return link is None or (out / link).is_file()


def temp_folder(out: Path) -> Path:
    """A fresh hidden sibling of `out` to write a partition into (caller holds the lock)."""
    _clean_stale_temps(out)
    return out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def install(tmp: Path, out: Path) -> None:
    """Mark the finished partition in `tmp` COMPLETE and rename it to `out` (replacing one there).
    Its checksums.json is written here when the writer did not write it (the streamed partitions)."""
    if not (tmp / CHECKSUMS).exists():
        with open(tmp / CHECKSUMS, "w") as f:
            json.dump(file_checksums(tmp), f, indent=1)
    (tmp / COMPLETE).write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + "\n")
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def file_checksums(folder: Path) -> Dict[str, Dict[str, Any]]:
    """{path relative to `folder`: {"bytes", "sha256"}} of the partition's files (all but the
    folder's own records: stats.json, COMPLETE, checksums.json)."""
    out = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        if rel in (STATS, COMPLETE, CHECKSUMS):
            continue
        with open(f, "rb") as fh:
            out[rel] = {"bytes": f.stat().st_size, "sha256": hashlib.file_digest(fh, "sha256").hexdigest()}
    return out


def damage(out: Path, full: bool = False) -> Optional[str]:
    """What in `out` differs from its checksums.json (a file missing, of another size, or, with
    `full`, of another sha256), or None: it matches, or the folder has no checksums.json (written
    before they were recorded, or elsewhere)."""
    try:
        recorded = json.loads((out / CHECKSUMS).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{CHECKSUMS} unreadable ({e})"
    for rel, want in recorded.items():
        f = out / rel
        try:
            size = f.stat().st_size
        except OSError:
            return f"{rel} is missing"
        if size != want["bytes"]:
            return f"{rel} is {size} bytes, {want['bytes']} when written"
    if full:
        for rel, want in recorded.items():
            with open(out / rel, "rb") as fh:
                if hashlib.file_digest(fh, "sha256").hexdigest() != want["sha256"]:
                    return f"{rel} has another sha256 than when written"
    return None


# ----------------------------------------------------------------------------- partition_graph
def write_partition(
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
    tmp = temp_folder(out)
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
        with open(tmp / CHECKSUMS, "w") as f:
            json.dump(file_checksums(tmp), f, indent=1)
        t3 = time.time()
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
             "checksum_time_s": round(t3 - t2, 4),
             "load_time_s": None if load_time_s is None else round(load_time_s, 4),
             "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)}
        )
        with open(tmp / STATS, "w") as f:
            json.dump(stats, f, indent=2)
        install(tmp, out)
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
    settings: Optional[Dict[str, Any]] = None,
) -> Path:
    """Partition an in-memory homogeneous DGL graph into `out` in DGL's partition format.

    Returns the partition JSON (``<out>/<graph_name>.json``). Writes ``<out>/stats.json`` and
    ``<out>/COMPLETE``; for a link dataset pass its `link_split` (GraphData.link_split): the
    validation and test edges and negatives are written with the partition (writer.LINK_SPLIT).
    `settings` (default: method, K, seed) is stored in the JSON; a cache compares it to decide
    whether the folder still fits its config. Refuses (PartitionError) a folder holding another
    graph's partitions (other graph_name, method or num_parts) or unrelated files unless
    ``force``; a partition of the same graph, method and K is replaced.
    """
    validate(method, num_parts, graph.num_nodes(), graph_name)
    out = Path(out).absolute()
    check_out(out, graph_name, method, int(num_parts), force)
    if settings is None:
        settings = {"method": method, "num_parts": int(num_parts), "seed": int(seed)}
    with folder_lock(out):
        check_out(out, graph_name, method, int(num_parts), force)
        return write_partition(graph, method, int(num_parts), out, graph_name, int(seed), int(num_supernodes),
                               bool(balance_edges), settings, link_split=link_split)
