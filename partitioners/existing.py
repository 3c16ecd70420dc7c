"""A partition made elsewhere (`partition.path=<DGL partition config JSON>`): DGL's own
`dgl.distributed.partition_graph`, or DGL's distributed partitioning pipeline for a graph that does
not fit one host. It is used as it is, never rebuilt; these checks run in the launcher before
anything starts, each failure one line naming the mismatch and the fix. (The node data a task needs
is checked by every trainer once its DistGraph is up: reading it here would load a whole part.)
"""
from __future__ import annotations

import json
from pathlib import Path

from .assign import PartitionError


def existing_partition(path: str, machines: int, method: str | None = None) -> Path:
    """The partition JSON at `path`, checked against the cluster (`machines` parts) and, where the
    pipeline needs one, the partition `method` (e.g. TMA's random parts for RandomTMA)."""
    p = Path(path).expanduser().resolve()
    fix = "give the JSON that DGL's partition_graph (or its dispatch_data step) wrote"
    if p.is_dir():
        found = sorted(p.glob("*.json"))
        found = [f for f in found if f.name != "stats.json"]
        raise PartitionError(f"partition.path={path} is a folder; {fix}"
                             + (f" (there: {found[0].name})" if found else ""))
    if not p.is_file():
        raise PartitionError(f"partition.path={path} does not exist; {fix}")
    try:
        meta = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise PartitionError(f"partition.path={path} is not a readable JSON file ({e}); {fix}") from None
    missing = [k for k in ("graph_name", "num_parts") if k not in meta]
    if missing:
        raise PartitionError(f"partition.path={path} has no {', '.join(missing)}: not a DGL partition config; {fix}")
    parts = int(meta["num_parts"])
    if parts != machines:
        raise PartitionError(f"partition.path={path} has {parts} parts but the cluster has {machines} "
                             f"machines (one part each): set cluster.machines={parts}, or partition "
                             f"the graph into {machines} parts")
    if len(meta.get("ntypes", ["_N"])) != 1 or len(meta.get("etypes", ["_E"])) != 1:
        raise PartitionError(f"partition.path={path} is heterogeneous ({meta.get('ntypes')}, "
                             f"{meta.get('etypes')}); degnn trains homogeneous graphs (dgl.to_homogeneous)")
    for i in range(parts):
        files = meta.get(f"part-{i}")
        if not isinstance(files, dict):
            raise PartitionError(f"partition.path={path} lists no files for part {i}; {fix}")
        for key in ("node_feats", "part_graph"):
            f = files.get(key)
            if not f or not (p.parent / f).is_file() and not Path(f).is_file():
                raise PartitionError(f"partition.path={path}: part {i}'s {key} file {f} is missing; "
                                     f"copy the whole partition folder")
    made = str(meta.get("part_method", "an unrecorded method"))
    if method is not None and made != method:
        raise PartitionError(f"partition.path={path} was made with part_method={made}, but this pipeline "
                             f"trains on {method} partitions: partition the graph with {method}, or "
                             f"choose a pipeline (variant) that uses {made} parts")
    return p
