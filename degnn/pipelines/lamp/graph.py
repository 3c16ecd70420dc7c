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

Sampling runs DGL's sampler on a private graph built from the partition's CSC arrays, not on the
shared-memory partition itself (that aborted with std::bad_alloc on a trainer in DGL 1.1.3,
docs/background.md, "DGL, OGB and Hydra facts"), so the same code runs in servers, trainers and
tests on a hand-made partition.
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
        # a private graph for DGL's C++ sampler (never the shared-memory partition itself) over the
        # same arrays; no edge-id array (empty: edges in CSC order), which would be 8 bytes an edge
        # (160 MB a machine on bench=scale's 4M graph)
        self._g = dgl.graph(("csc", (self.indptr, self.indices, torch.empty(0, dtype=torch.int64))),
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


# --- fusion (DEGNN's "two-level computation graph fusion") ----------------------------------------
# Level 2, inside one computation graph: `build` makes a layered DAG, so each (node, layer) pair
# is computed once however many paths reach it (DGL's blocks for distdgl dedupe per layer too).
# Level 1, across requests: an owner merges the requests queued for it into one `build` (service.py).
# `fusion_counts` says what each level saves; `unfold` is the graph without either (pipeline.fusion=
# false): every path from a root computed on its own, the same sampled edges.

def fusion_counts(cg: CompGraph, groups=None):
    """(computed, separate, unfolded) (node, layer) computations of `cg`: as built; had each
    group of roots (`groups`: positions among cg.dst[-1] of each merged request's roots, one
    group when None) been built on its own over the same sampled edges (level-1 fusion off); had
    every path been computed on its own, roots counted once per group (both levels off)."""
    top = len(cg.dst[-1])
    groups = [torch.arange(top)] if groups is None else list(groups)
    mult = torch.zeros(top, dtype=torch.float64)  # paths from the roots to each node
    mask = torch.zeros(top, len(groups), dtype=torch.float64)  # which groups reach each node
    for j, g in enumerate(groups):
        mult.index_add_(0, g, torch.ones(len(g), dtype=torch.float64))
        mask[g, j] = 1.0
    computed = separate = unfolded = 0.0
    for k in range(len(cg.blocks) - 1, -1, -1):
        computed += len(cg.dst[k])
        separate += float((mask > 0).sum())
        unfolded += float(mult.sum())
        if k == 0:
            break
        src, dst = cg.blocks[k].edges()
        n_inner = len(cg.inner_src[k])
        m = torch.zeros(n_inner + len(cg.leaves[k]), dtype=torch.float64)
        m[:len(mult)] += mult  # a destination's own value one layer down (dst first among sources)
        m.index_add_(0, src.long(), mult[dst.long()])
        r = torch.zeros(len(m), len(groups), dtype=torch.float64)
        r[:len(mask)] += mask
        r.index_add_(0, src.long(), mask[dst.long()])
        mult, mask = m[:n_inner], r[:n_inner]  # the inner sources are the next block's destinations
    return int(computed), int(separate), int(unfolded)


def unfold(cg: CompGraph) -> CompGraph:
    """The computation graph without fusion: a tree over the same sampled edges, in which a node
    reached by several paths is computed once per path (its ids repeat among a block's
    destinations). Same outputs as `cg`, in the same order."""
    n = len(cg.blocks)
    blocks, dsts, inners, leaves = [None] * n, [None] * n, [None] * n, [None] * n
    inst = torch.arange(len(cg.dst[-1]))  # positions among cg.dst[k] of this block's destinations
    for k in range(n - 1, -1, -1):
        src, dst = (t.long() for t in cg.blocks[k].edges())
        order = torch.argsort(dst, stable=True)
        src, dst = src[order], dst[order]
        deg = torch.bincount(dst, minlength=len(cg.dst[k]))
        start = torch.cumsum(deg, 0) - deg
        d = deg[inst]
        seg = torch.repeat_interleave(torch.arange(len(inst)), d)  # edge -> destination instance
        first = torch.cumsum(d, 0) - d
        e = torch.repeat_interleave(start[inst] - first, d) + torch.arange(int(d.sum()))
        s = src[e]  # source of each edge instance (position among cg's sources of block k)
        n_inner = len(cg.inner_src[k])
        is_inner = s < n_inner
        inner_inst = torch.cat([inst, s[is_inner]])  # destinations first (their own value), then sources
        leaf_inst = s[~is_inner] - n_inner
        pos = torch.empty(len(s), dtype=torch.int64)
        pos[is_inner] = len(inst) + torch.arange(int(is_inner.sum()))
        pos[~is_inner] = len(inner_inst) + torch.arange(len(leaf_inst))
        blocks[k] = dgl.create_block((pos, seg), num_src_nodes=len(inner_inst) + len(leaf_inst),
                                     num_dst_nodes=len(inst))
        dsts[k], inners[k], leaves[k] = cg.dst[k][inst], cg.inner_src[k][inner_inst], cg.leaves[k][leaf_inst]
        inst = inner_inst  # cg.inner_src[k] == cg.dst[k-1]: the same positions one block down
    return CompGraph(blocks, dsts, inners, leaves)
