"""The one place that knows about DGL, torch and launcher version differences (the versions
tested are in docs/install.md). It imports only dgl and torch, so every layer may use it."""
from __future__ import annotations

import contextlib
import re
from typing import Iterator, List, Optional, Tuple

import torch

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

# what torch.load(weights_only=True) names when it refuses a pickled global: "GLOBAL numpy.x" from
# torch 2.4 on, "Unsupported class numpy.x" before (a builtin: "GLOBAL print", "__builtin__.print")
WEIGHTS_ONLY_REFUSED = re.compile(r"(?:GLOBAL|Unsupported class) (?:__builtin__\.|builtins\.)?([\w.]+)")
# whether weights-only loading can be told to accept numpy arrays (safe_globals below): torch>=2.4
WEIGHTS_ONLY_TAKES_NUMPY = hasattr(torch.serialization, "add_safe_globals")


@contextlib.contextmanager
def safe_globals(allowed: list) -> Iterator[None]:
    """torch.load(weights_only=True) also accepts `allowed` (classes, functions, (object, name)
    pairs) inside the block.

    torch 2.5 has this context manager; 2.4 only the process-wide add_safe_globals (undone here on
    the way out); before 2.4 the weights-only unpickler takes no additions: tensors still load,
    anything in `allowed` is refused like any other global (docs/limitations.md)."""
    ser = torch.serialization
    if hasattr(ser, "safe_globals"):
        with ser.safe_globals(allowed):
            yield
    elif hasattr(ser, "add_safe_globals"):
        before = ser.get_safe_globals()
        ser.add_safe_globals([a[0] if isinstance(a, tuple) else a for a in allowed])
        try:
            yield
        finally:
            ser.clear_safe_globals()
            ser.add_safe_globals(before)
    else:
        yield


def copy_graph_to_shared_mem(g, graph_name: str, graph_format):
    """What DGL's DistGraphServer does to put its part graph into shared memory (a private function
    of DGL's, called by benchmarks/server_memory.py to load a part as a server does): DGL 2.x adds
    a `use_graphbolt` argument (False: the DGLGraph path DistDGL's servers take)."""
    import inspect

    from dgl.distributed import dist_graph

    copy = dist_graph._copy_graph_to_shared_mem
    extra = {"use_graphbolt": False} if "use_graphbolt" in inspect.signature(copy).parameters else {}
    return copy(g, graph_name, graph_format, **extra)
