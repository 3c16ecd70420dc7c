"""One part of a streamed random partition, built from its spill files within a memory budget.

partitioners.stream_random's edge pass leaves, per part p, its inner edges (in_src, in_dst: new
ids, in order) and its outgoing halo edges (out_src, out_dst, and each one's destination part and
rank among that part's inner edges). This writes the part as DGL's partition_graph_with_halo lays
it out: own nodes (new ids lo..hi-1) then halo nodes in id order; inner edges, then outgoing ones
ordered by their new edge ids. It holds the part's COO in local ids, the global edge ids and one
flag an edge (25 bytes an edge: what DGL's save_graphs needs whole; saving copies one column more,
8), about 48 bytes a node of the part (own and halo), and blocks of `block` edges; graph_csc.dgl is
sorted from those arrays a range of destinations at a time (write_csc_from_coo), not
by DGL's conversion, which held another 40-50 bytes an edge.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, Sequence, Tuple

import numpy as np

from degnn.part_csc import EDATA, EIDS, INDICES, INDPTR, NDATA, reserved_dtypes
from degnn.tensor_dict import TensorDictWriter

from .assign import PartitionError

# bytes an edge and a node (own or halo) of a part cost while it is built (measured: docs/limitations.md)
PART_EDGE_BYTES = 34
PART_NODE_BYTES = 48
# besides those, the blocks: a block of edges costs about this many bytes an edge
BLOCK_EDGE_BYTES = 128


def block_edges(budget: int) -> int:
    """Edges a block holds: a sixteenth of the budget goes to the blocks' temporaries."""
    return max(1024, budget // (16 * BLOCK_EDGE_BYTES))


def part_bytes(edges: int, nodes: int, budget: int) -> int:
    return edges * PART_EDGE_BYTES + nodes * PART_NODE_BYTES + block_edges(budget) * BLOCK_EDGE_BYTES


def _blocks(paths: Sequence[Path], block: int) -> Iterator[Tuple[np.ndarray, ...]]:
    """The int64 files `paths` (all of one length) read together, `block` values at a time."""
    files = [open(p, "rb") for p in paths]
    try:
        while True:
            cols = tuple(np.fromfile(f, dtype=np.int64, count=block) for f in files)
            if not len(cols[0]):
                return
            yield cols
    finally:
        for f in files:
            f.close()


def write_part(spill: Path, p: int, bounds: np.ndarray, edge_bounds: np.ndarray, out_to: np.ndarray,
               halo_ids: np.ndarray, part_dir: Path, block: int) -> None:
    """Write part p's graph.dgl and graph_csc.dgl into `part_dir` from its spill files (removed).
    `bounds`/`edge_bounds`: the parts' node and edge ranges in new ids; `out_to[q]`: part p's
    outgoing halo edges into part q (counted in the edge pass); `halo_ids`: the new ids of its halo
    nodes, sorted."""
    import dgl
    import torch
    from dgl.data.utils import save_graphs

    from degnn.part_csc import CSC_FILE

    def col(c: str) -> Path:
        return spill / f"{c}{p}"

    lo, hi = int(bounds[p]), int(bounds[p + 1])
    own = hi - lo
    n_in = col("in_dst").stat().st_size // 8
    m = n_in + int(out_to.sum())

    used = np.zeros(len(halo_ids), dtype=bool)  # every flagged halo node must be an edge's end

    def local(x: np.ndarray) -> np.ndarray:
        """Part-local ids: own nodes first (new id - lo), then halo nodes in id order."""
        out = x - lo
        far = np.flatnonzero((x < lo) | (x >= hi))
        if len(far):
            pos = np.searchsorted(halo_ids, x[far])
            if len(halo_ids) == 0 or int(pos.max()) >= len(halo_ids) or not np.array_equal(halo_ids[pos], x[far]):
                raise PartitionError(f"internal: part {p} has an edge to a node not flagged as its halo")
            out[far] = own + pos
            used[pos] = True
        return out

    lsrc = np.empty(m, dtype=np.int64)
    ldst = np.empty(m, dtype=np.int64)
    gid = np.empty(m, dtype=np.int64)  # new (global) edge ids
    a = 0
    for s, d in _blocks([col("in_src"), col("in_dst")], block):
        lsrc[a:a + len(s)] = local(s)
        ldst[a:a + len(s)] = d - lo
        gid[a:a + len(s)] = np.arange(edge_bounds[p] + a, edge_bounds[p] + a + len(s))
        a += len(s)
    # outgoing halo edges by new edge id: by destination part, then rank. The spill holds each
    # destination part's edges in rank order, so a stable counting sort by part does it
    at = n_in + np.concatenate([[0], np.cumsum(out_to)[:-1]])
    for q, r, s, d in _blocks([col("out_part"), col("out_rank"), col("out_src"), col("out_dst")], block):
        for t in np.unique(q):
            idx = np.flatnonzero(q == t)
            dest = np.arange(at[t], at[t] + len(idx))
            at[t] += len(idx)
            lsrc[dest] = local(s[idx])
            ldst[dest] = local(d[idx])
            gid[dest] = edge_bounds[t] + r[idx]
    if not used.all():
        raise PartitionError(f"internal: part {p} has {int((~used).sum())} halo nodes flagged but in none of its edges")
    for c in ("in_src", "in_dst", "out_part", "out_rank", "out_src", "out_dst"):
        col(c).unlink()

    nid = np.concatenate([np.arange(lo, hi, dtype=np.int64), halo_ids])
    ndata = {"part_id": np.searchsorted(bounds, nid, side="right") - 1,
             "inner_node": (np.arange(len(nid)) < own).astype(np.uint8), dgl.NID: nid}
    inner_edge = np.zeros(m, dtype=np.uint8)
    inner_edge[:n_in] = 1
    edata = {"inner_edge": inner_edge, dgl.EID: gid}
    pg = dgl.graph((torch.from_numpy(lsrc), torch.from_numpy(ldst)), num_nodes=len(nid))
    for k, v in ndata.items():
        pg.ndata[k] = torch.from_numpy(v)
    for k, v in edata.items():
        pg.edata[k] = torch.from_numpy(v)
    part_dir.mkdir()
    save_graphs(str(part_dir / "graph.dgl"), [pg])
    del pg
    write_csc_from_coo(part_dir / CSC_FILE, lsrc, ldst, len(nid), ndata, edata, block)


def write_csc_from_coo(path: Path, src: np.ndarray, dst: np.ndarray, num_nodes: int, ndata: Dict[str, np.ndarray],
                       edata: Dict[str, np.ndarray], bucket_edges: int) -> None:
    """Write a part graph given as COO numpy arrays (edge i runs src[i] -> dst[i]; its local id is i)
    with its ndata and edata (numpy arrays) as CSC arrays, without DGL's conversion: the in-edges
    are sorted by destination a range of destinations at a time, each range holding at most
    `bucket_edges` edges (more only where one node has more in-edges), so besides the arrays it
    holds about 48 bytes a bucket edge and 16 bytes a node. The streaming partitioner's parts are
    written this way; an in-memory part goes through degnn.part_csc.write_part_csc."""
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
