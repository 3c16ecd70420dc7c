"""Locality-aware computation graphs (LAMP's "aggregation skeleton").

A machine's DGL partition holds its own ("inner") nodes with all their in-edges, plus halo nodes
(other machines' nodes adjacent to inner ones) with no in-edges stored. The builder expands a
computation graph from some roots downward, one layer at a time, through inner nodes only:

* the destination nodes of every block are inner nodes (the roots at the top);
* each is given up to `fanout` of its in-neighbours, sampled without replacement (all of them
  when it has fewer), as DGL's NeighborSampler does;
* a sampled neighbour that is inner becomes a destination of the block below (computed);
  one that is a halo node is a *leaf* of that block: its input there is read from elsewhere
  (the caller decides: raw features at block 0, the history of layer k at block k >= 1, or, for a
  trainer's top block, the hidden state its owner prepared).

Block k computes layer k (0 = input layer), DGL's convention. Its source nodes are ordered
[destination nodes, other inner nodes, halo leaves], so the inner sources of block k are exactly
the destinations of block k-1 (their computed rows come first) and the leaves' rows are appended.

Sampling runs DGL's sampler on a private copy of the partition's CSC arrays, not on the
shared-memory partition itself (that aborted with std::bad_alloc on a trainer in DGL 1.1.3,
DESIGN.md), so the same code runs in servers, trainers and tests on a hand-made partition.
"""
from __future__ import annotations

from typing import List, NamedTuple, Sequence

import dgl
import torch


class CompGraph(NamedTuple):
    blocks: list                 # DGL blocks, block k computes layer k
    dst: List[torch.Tensor]      # local ids of block k's destination nodes (inner)
    inner_src: List[torch.Tensor]  # local ids of block k's inner sources (dst[k] first) = dst[k-1]
    leaves: List[torch.Tensor]   # local ids of block k's halo sources, after the inner ones

    @property
    def num_nodes(self) -> int:
        return sum(len(s) + len(h) for s, h in zip(self.inner_src, self.leaves))


class LocalGraph:
    """One machine's partition: CSC over local ids, which local ids are inner, their global ids."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, inner: torch.Tensor, nid: torch.Tensor):
        self.indptr, self.indices = indptr.long(), indices.long()
        self.inner = inner.bool()
        self.nid = nid.long()
        self.num_nodes = len(self.inner)
        self._pos = torch.full((self.num_nodes,), -1, dtype=torch.int64)  # scratch, kept all -1
        # a private copy for DGL's C++ sampler (never the shared-memory partition itself)
        self._g = dgl.graph(("csc", (self.indptr, self.indices, torch.arange(len(self.indices)))),
                            num_nodes=self.num_nodes)

    @classmethod
    def from_partition(cls, g) -> "LocalGraph":
        """From a DGL partition graph (a server's `server_state.graph`, a trainer's
        `DistGraph.local_partition`) with ndata `inner_node` and dgl.NID."""
        indptr, indices, _ = g.adj_tensors("csc")
        return cls(indptr, indices, g.ndata["inner_node"].bool(), g.ndata[dgl.NID])

    def sample(self, dst: torch.Tensor, fanout: int):
        """Up to `fanout` in-neighbours of each node of `dst` (all when fanout < 0), without
        replacement (DGL's sampler, as NeighborSampler). Returns (source local ids, position of
        the edge's destination in `dst`); `dst` must be unique."""
        if fanout >= 0:
            src, d = dgl.sampling.sample_neighbors(self._g, dst, fanout).edges()
            pos = self._pos
            pos[dst] = torch.arange(len(dst))
            seg = pos[d]
            pos[dst] = -1
            return src, seg
        start, end = self.indptr[dst], self.indptr[dst + 1]
        deg = end - start
        seg = torch.repeat_interleave(torch.arange(len(dst)), deg)
        first = torch.cumsum(deg, 0) - deg
        eidx = torch.repeat_interleave(start - first, deg) + torch.arange(int(deg.sum()))
        return self.indices[eidx], seg

    def build(self, roots: torch.Tensor, fanouts: Sequence[int]) -> CompGraph:
        """Computation graph of len(fanouts) layers above `roots` (inner local ids, unique);
        fanouts[k] is block k's fan-out, input layer first."""
        if len(roots) and not bool(self.inner[roots].all()):
            raise ValueError("computation-graph roots must be nodes this partition owns")
        n = len(fanouts)
        blocks, dsts, inners, leaves = [None] * n, [None] * n, [None] * n, [None] * n
        dst = roots.long()
        pos = self._pos
        for k in range(n - 1, -1, -1):
            src, seg = self.sample(dst, fanouts[k])
            pos[dst] = torch.arange(len(dst))
            try:
                new = torch.unique(src[pos[src] < 0])
                new_inner, new_halo = new[self.inner[new]], new[~self.inner[new]]
                inner_src = torch.cat([dst, new_inner])
                pos[new_inner] = torch.arange(len(dst), len(inner_src))
                pos[new_halo] = torch.arange(len(inner_src), len(inner_src) + len(new_halo))
                src_idx = pos[src]
            finally:
                pos[dst] = -1
                pos[src] = -1
            blocks[k] = dgl.create_block((src_idx, seg), num_src_nodes=len(inner_src) + len(new_halo),
                                         num_dst_nodes=len(dst))
            dsts[k], inners[k], leaves[k] = dst, inner_src, new_halo
            dst = inner_src
        return CompGraph(blocks, dsts, inners, leaves)
