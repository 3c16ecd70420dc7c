"""The one place that knows about DGL and launcher version differences."""
from __future__ import annotations

import re
from typing import List, Optional, Tuple

# DGL 1.1.x keeps DistNodeDataLoader and DistEdgeDataLoader in dgl.dataloading; 2.4 moved them (and
# left a shim there).
from dgl.dataloading import (DistEdgeDataLoader, DistNodeDataLoader, MultiLayerFullNeighborSampler,  # noqa: F401
                             NeighborSampler)

_LOCAL_RANK_ARG = re.compile(r"^--local[-_]rank(=(\d+))?$")


def strip_local_rank(argv: List[str]) -> Tuple[List[str], Optional[int]]:
    """Remove the `--local-rank=N` / `--local_rank N` that torch.distributed.launch appends.

    DGL 1.1.x's launch.py wraps trainers in torch.distributed.launch, and Hydra rejects any
    argument it does not know; torchrun (DGL 2.x) passes LOCAL_RANK in the environment instead.
    """
    out, local_rank, skip = [], None, False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        m = _LOCAL_RANK_ARG.match(arg)
        if m:
            if m.group(2) is not None:
                local_rank = int(m.group(2))
            elif i + 1 < len(argv) and argv[i + 1].isdigit():
                local_rank, skip = int(argv[i + 1]), True
            continue
        out.append(arg)
    return out, local_rank
