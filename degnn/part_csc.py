"""A part's graph as its in-edge (CSC) arrays, for a graph server that maps it instead of loading it.

DGL's graph server loads `graph.dgl` whole into its heap (the COO the writer saved), builds the CSC
it serves beside it, and copies that into shared memory: loading part 0 of a 1M-node graph in 2
parts its heap peaked at 1.7 times the part's structure besides the shared copy (docs/benchmarks.md,
"A graph server's own memory"). degnn's partition writers also write the part's CSC beside
`graph.dgl`, as a DGL tensor-dict file (DGL's save_tensors; degnn/tensor_dict.py describes it):

    csc/indptr   int64 [num_nodes + 1]    in-edges of local node v: positions indptr[v]:indptr[v+1]
    csc/indices  int64 [num_edges]        their source nodes (local ids)
    csc/eids     int64 [num_edges]        their edge ids (local: rows of the edata arrays)
    ndata/<name>, edata/<name>            every field of the part graph, in the dtype DGL's server
                                          casts it to (RESERVED_FIELD_DTYPE)

The server (degnn.runtime.mapped_feats) builds its graph over a memory map of that file (DGL takes
the arrays without a copy), so the copy into shared memory reads page cache, which the kernel can
reclaim, and the part stays once, in shared memory. `graph.dgl` is still written: DGL's own tools,
TMA's trainers and a server without degnn read it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

CSC_FILE = "graph_csc.dgl"
INDPTR, INDICES, EIDS = "csc/indptr", "csc/indices", "csc/eids"
NDATA, EDATA = "ndata/", "edata/"


def reserved_dtypes():
    """The dtypes DGL's graph server casts its reserved fields to (RESERVED_FIELD_DTYPE)."""
    import torch

    try:
        from dgl.distributed.partition import RESERVED_FIELD_DTYPE

        return RESERVED_FIELD_DTYPE
    except ImportError:  # pragma: no cover
        return {"inner_node": torch.uint8, "inner_edge": torch.uint8, "_ID": torch.int64, "_TYPE": torch.int32}


def write_part_csc(path: Path, g) -> None:
    """Write the part graph `g` (a homogeneous DGLGraph with its ndata and edata) as CSC arrays."""
    from dgl.data.utils import save_tensors

    reserved = reserved_dtypes()

    def field(k, v):  # the server casts these; stored cast, its cast copies nothing
        return v.to(reserved[k]) if k in reserved else v

    indptr, indices, eids = g.adj_tensors("csc")
    arrays = {INDPTR: indptr, INDICES: indices, EIDS: eids}
    arrays.update({NDATA + k: field(k, v) for k, v in g.ndata.items()})
    arrays.update({EDATA + k: field(k, v) for k, v in g.edata.items()})
    save_tensors(str(path), arrays)


def inner_edges_only(tensors: Dict[str, "object"]) -> Optional[Dict[str, "object"]]:
    """A CSC file's arrays cut to the in-edges of the part's own nodes, or None where the part is not
    laid out so that they are a prefix (degnn's writers and DGL's reshuffled partitions are).

    A part is its own nodes' in-edges (its inner edges: edges are assigned to their destination's
    part) and its own nodes' out-edges to other parts (outgoing halo edges: 47% of a random part of
    bench=scale's 8M graph). Every sampler degnn runs walks in-edges of its own nodes, so a server
    need not hold the rest. With own nodes first and inner edges first, they are a slice: CSC
    positions [0, indptr[own]), edge rows [0, indptr[own]). Halo nodes stay (sampled sources are
    halo nodes), without in-edges. The edge rows are put in CSC order, so a server needs no edge-id
    array beside the structure (DGL reads an empty one as "edge id = CSC position"): 8 bytes an edge
    less in shared memory."""
    import torch

    indptr, eids = tensors[INDPTR], tensors[EIDS]
    inner_node, inner_edge = tensors.get(NDATA + "inner_node"), tensors.get(EDATA + "inner_edge")
    if inner_node is None or inner_edge is None:
        return None
    own = int(inner_node.sum())
    n_in = int(indptr[own])
    if (not bool(inner_node[:own].all()) or int(inner_edge.sum()) != n_in or not bool(inner_edge[:n_in].all())
            or (n_in and int(eids[:n_in].max()) >= n_in)):
        return None
    out = dict(tensors)
    out[INDPTR] = torch.cat([indptr[:own + 1], indptr[own:own + 1].expand(len(indptr) - own - 1)])
    order = eids[:n_in]
    out[INDICES], out[EIDS] = tensors[INDICES][:n_in], torch.empty(0, dtype=eids.dtype)
    for name, t in tensors.items():
        if name.startswith(EDATA):
            out[name] = t[:n_in][order]
    return out


def graph_from_csc(tensors: Dict[str, "object"]) -> Optional["object"]:
    """The DGLGraph over `tensors` (a CSC file's arrays, e.g. memory-mapped): DGL keeps the arrays it
    is given, so the graph costs no heap of its own. None where the arrays are not a CSC file's."""
    import dgl

    if not {INDPTR, INDICES, EIDS} <= set(tensors):
        return None
    indptr = tensors[INDPTR]
    g = dgl.graph(("csc", (indptr, tensors[INDICES], tensors[EIDS])), num_nodes=len(indptr) - 1)
    for name, t in tensors.items():
        if name.startswith(NDATA):
            g.ndata[name[len(NDATA):]] = t
        elif name.startswith(EDATA):
            g.edata[name[len(EDATA):]] = t
    return g
