"""A machine's own rows of a DistTensor, read in place from its KVStore's shared memory.

DGL's partitions number a machine's inner nodes first, in the order its KVStore server stores
their rows, so local id i of the partition graph is row i of the store's `local_partition`. Where
that holds, a trainer reads its own nodes' features (and labels) from those shared rows without a
copy; a pulled copy of a machine's features is 0.5 GB on bench=scale's 4M graph.
"""
from __future__ import annotations

from typing import Optional

import torch


def own_rows(tensor, pb, gids: torch.Tensor) -> Optional[torch.Tensor]:
    """DistTensor `tensor`'s shared-memory rows of this machine's own nodes `gids` (global ids, in
    local-id order), when they are exactly the store's rows in its order; None when they are not,
    or when this trainer has no local server."""
    try:
        rows = tensor.local_partition
    except (AttributeError, KeyError):  # no local store (a trainer without a server)
        return None
    if rows is None or len(rows) != len(gids):
        return None
    if not torch.equal(pb.nid2localnid(gids, pb.partid).long(), torch.arange(len(gids))):
        return None
    return rows
