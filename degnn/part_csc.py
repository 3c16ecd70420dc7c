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


def write_csc_from_coo(path: Path, src, dst, num_nodes: int, ndata: Dict[str, "object"],
                       edata: Dict[str, "object"], bucket_edges: int) -> None:
    """Write a part graph given as COO numpy arrays (edge i runs src[i] -> dst[i]; its local id is i)
    with its ndata and edata (numpy arrays) as CSC arrays, without DGL's conversion: the in-edges
    are sorted by destination a range of destinations at a time, each range holding at most
    `bucket_edges` edges (more only where one node has more in-edges), so besides the arrays it
    holds about 48 bytes a bucket edge and 16 bytes a node. The streaming partitioner's parts are
    written this way (partitioners/stream_part.py); an in-memory part goes through write_part_csc."""
    import numpy as np

    from degnn.tensor_dict import TensorDictWriter

    reserved = {k: np.dtype(str(v).replace("torch.", "")) for k, v in reserved_dtypes().items()}
    m, bucket_edges = len(src), max(1, int(bucket_edges))
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    for a in range(0, m, bucket_edges):
        indptr[1:] += np.bincount(dst[a:a + bucket_edges], minlength=num_nodes)
    np.cumsum(indptr, out=indptr)
    fields = [(NDATA + k, v) for k, v in ndata.items()] + [(EDATA + k, v) for k, v in edata.items()]
    fields = [(name, np.asarray(v).astype(reserved.get(name.split("/", 1)[1], v.dtype), copy=False))
              for name, v in fields]
    specs = [(INDPTR, np.int64, (num_nodes + 1,)), (INDICES, np.int64, (m,)), (EIDS, np.int64, (m,))]
    specs += [(name, v.dtype, v.shape) for name, v in fields]
    eid_spill = Path(str(path) + ".eids")
    with open(path, "wb") as f, open(eid_spill, "w+b") as ef:
        w = TensorDictWriter(f, specs)
        w.append(indptr)
        lo = 0
        while lo < num_nodes and m:
            # the destinations lo..hi-1 hold at most bucket_edges in-edges (at least one node)
            hi = int(np.searchsorted(indptr, indptr[lo] + bucket_edges, side="right")) - 1
            hi = min(max(hi, lo + 1), num_nodes)
            sel = np.concatenate([np.flatnonzero((dst[a:a + bucket_edges] >= lo) & (dst[a:a + bucket_edges] < hi)) + a
                                  for a in range(0, m, bucket_edges)])
            perm = sel[np.argsort(dst[sel], kind="stable")]  # stable: in-edges in edge-id order
            del sel
            w.append(src[perm])
            perm.tofile(ef)
            lo = hi
        ef.seek(0)
        while True:
            e = np.fromfile(ef, dtype=np.int64, count=bucket_edges)
            if not len(e):
                break
            w.append(e)
        for _, v in fields:
            for a in range(0, len(v), bucket_edges):
                w.append(v[a:a + bucket_edges])
        if not w.done():
            raise RuntimeError(f"internal: {path} is incomplete")
    eid_spill.unlink()
