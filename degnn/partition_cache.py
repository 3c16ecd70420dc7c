"""The partitions a run trains on: cached per dataset and partition config, built when missing.

``cache_dir`` names the folder of a (dataset config, partition config) pair; ``ensure_partitions``
reuses a complete folder written with the same settings or loads the dataset and partitions it
(partitioners.partition_graph's folder protocol: under a file lock, renamed into place whole);
``planned_partitions`` answers from the folder alone, for a dry run. A cached folder whose files
do not match its checksums (partitioners.folder.damage: sizes, and with partition.verify=true
every file's sha256) is partitioned again, with one line saying why. The partitioners themselves
take a graph and know nothing of datasets or configs; this module is where the two meet.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

from partitioners.assign import RANDOM_STREAM
from partitioners.folder import damage, folder_lock, is_complete, read_partition_meta, validate, write_partition
from partitioners.writer import LINK_SPLIT

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
    digest = hashlib.sha1(json.dumps(partition_settings(dataset_cfg, partition_cfg), sort_keys=True)
                          .encode()).hexdigest()[:8]
    return root / str(dataset_cfg.name) / (f"{partition_cfg.method}-k{int(partition_cfg.num_parts)}"
                                           f"-s{int(partition_cfg.seed)}-{digest}")


def partition_settings(dataset_cfg, partition_cfg) -> Dict[str, Any]:
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


def _cached(out: Path, settings: Dict[str, Any], verify: bool = False, say: bool = False) -> Optional[Path]:
    if not is_complete(out):
        return None
    meta = read_partition_meta(out)
    if meta is None or meta.get("degnn", {}).get("settings") != settings:
        return None
    why = damage(out, full=verify)
    if why is not None:  # a server would die on it (a truncated file: SIGSEGV), run after run
        if say:
            print(f"degnn: the cached partition {out} is damaged ({why}): partitioning it again",
                  file=sys.stderr, flush=True)
        return None
    return Path(meta["_path"])


def _verify(partition_cfg) -> bool:
    return bool(getattr(partition_cfg, "verify", False))


def planned_partitions(dataset_cfg, partition_cfg):
    """(the partition JSON `ensure_partitions` returns, whether it is already built), reading
    only the cache folder: what a dry run prints without loading the dataset."""
    validate(str(partition_cfg.method), partition_cfg.num_parts, None, str(dataset_cfg.name))
    out = cache_dir(dataset_cfg, partition_cfg)
    hit = _cached(out, partition_settings(dataset_cfg, partition_cfg), _verify(partition_cfg), say=True)
    return (hit, True) if hit is not None else (out / f"{dataset_cfg.name}.json", False)


def ensure_partitions(dataset_cfg, partition_cfg) -> Path:
    """The partition JSON of `dataset_cfg` cut by `partition_cfg`, partitioning only if needed.

    Cached at ``cache_dir(dataset_cfg, partition_cfg)``; a complete folder written with the same
    settings (dataset config, method, K, seed, num_supernodes, balance_edges) is reused untouched;
    a missing, incomplete, damaged or differently-configured one is (re)written under a file lock.
    """
    method = str(partition_cfg.method)
    validate(method, partition_cfg.num_parts, None, str(dataset_cfg.name))
    out = cache_dir(dataset_cfg, partition_cfg)
    settings = partition_settings(dataset_cfg, partition_cfg)
    verify = _verify(partition_cfg)
    hit = _cached(out, settings, verify, say=True)
    if hit is not None:
        return hit
    with folder_lock(out):
        hit = _cached(out, settings, verify)  # another process may have written it meanwhile
        if hit is not None:
            return hit
        from degnn.data import CHUNKED_KINDS, load_dataset

        if method == "random" and str(dataset_cfg.kind) in CHUNKED_KINDS:
            # never loaded whole: partitioned in passes over its chunks
            from degnn.chunked import ChunkedError, open_chunked
            from partitioners.assign import PartitionError
            from degnn.data.chunked_dataset import chunked_folder
            from partitioners.stream_random import write_chunked_partition

            try:
                g = open_chunked(chunked_folder(dataset_cfg))
            except ChunkedError as e:
                raise PartitionError(str(e)) from None
            validate(method, int(partition_cfg.num_parts), g.num_nodes, str(dataset_cfg.name))
            print(f"degnn: partitioning {dataset_cfg.name} ({g.num_nodes} nodes, {g.num_edges} edges) randomly "
                  f"into {partition_cfg.num_parts} parts in passes over its chunks, within "
                  f"{partition_cfg.stream_budget_mb} MiB, into {out}", file=sys.stderr, flush=True)
            return write_chunked_partition(g, int(partition_cfg.num_parts), out, str(dataset_cfg.name),
                                           int(partition_cfg.seed), int(partition_cfg.stream_budget_mb) << 20,
                                           settings)
        t0 = time.time()
        data = load_dataset(dataset_cfg)
        graph = data.graph
        load_s = time.time() - t0
        validate(method, int(partition_cfg.num_parts), graph.num_nodes(), str(dataset_cfg.name))
        return write_partition(
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
