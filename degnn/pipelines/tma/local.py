"""A TMA trainer's data: the subgraph induced by the nodes its machine owns, and nothing else.

TMA (docs/background.md, "TMA") trains each model on an induced subgraph: every edge whose endpoints
sit on different partitions is dropped, halo nodes included, and no feature ever crosses
machines. The machine's partition is already in the local graph server's shared memory
(`DistGraph.local_partition`: inner nodes plus 1-hop halo); we take its inner-to-inner edges and
build a fresh, plain DGLGraph from them. (Sampling directly on the shared-memory partition
aborted with std::bad_alloc in DGL 1.1.3, docs/background.md, and it would see the halo.) Features, labels
and the train mask of the owned nodes are read once from the local KVStore server, through
shared memory: no byte on the wire.

The task picks the supervision ids (degnn/tasks): the owned training nodes, or (link task, as in
the TMA paper, docs/background.md, "TMA") every edge of the subgraph, so cross-partition edges are dropped for training too;
the graph holds no held-out edge.
"""
from __future__ import annotations

from dataclasses import dataclass

import dgl
import torch

from degnn.runtime.own_rows import own_rows


@dataclass
class LocalData:
    graph: dgl.DGLGraph  # inner nodes only, relabelled 0..n-1, ndata feat (and label: node task)
    # the task's supervision ids of the local graph (train nodes, or every local edge)
    train_ids: torch.Tensor
    edges_total: int  # edges of the local partition before dropping the cut ones (inner dst)


def _csc_edges(part: dgl.DGLGraph):
    """(src, dst) of a graph that may only hold the CSC format (the servers' shared memory)."""
    if "csc" in part.formats()["created"] or "coo" not in part.formats()["created"]:
        indptr, indices, _ = part.adj_tensors("csc")
        dst = torch.repeat_interleave(torch.arange(len(indptr) - 1, dtype=indices.dtype),
                                      indptr[1:] - indptr[:-1])
        return indices, dst
    return part.edges()


def _own_features(g, gids: torch.Tensor) -> torch.Tensor:
    """The features of this machine's own nodes `gids`, in that order: the KVStore's shared rows
    when they are in its order (degnn/runtime/own_rows.py), otherwise a copy pulled through it."""
    feat = g.ndata["feat"]
    own = own_rows(feat, g.get_partition_book(), gids)
    return own if own is not None and own.dtype == torch.float32 else feat[gids].float()


def build_local_data(g, part_config: str, log, task) -> LocalData:
    part = g.local_partition
    if part is None:
        # trainers on machines without a graph server (not how degnn launches): read this
        # machine's partition file instead; features are still pulled through the KVStore
        pb = g.get_partition_book()
        log.warning("tma: no local partition in shared memory; reading part %d from %s", pb.partid,
                    part_config)
        part = dgl.distributed.load_partition(part_config, pb.partid)[0]
    inner = part.ndata["inner_node"].bool()
    inner_local = inner.nonzero().squeeze(1)
    n = len(inner_local)
    gids = part.ndata[dgl.NID][inner_local].long()
    src, dst = _csc_edges(part)
    src, dst = src.long(), dst.long()
    into_inner = inner[dst]
    keep = into_inner & inner[src]
    remap = torch.full((part.num_nodes(),), -1, dtype=torch.long)
    remap[inner_local] = torch.arange(n)
    local = dgl.graph((remap[src[keep]], remap[dst[keep]]), num_nodes=n)
    edges_total = int(into_inner.sum())
    del src, dst, keep, into_inner, remap  # the edge lists' temporaries, before the features
    local.ndata["feat"] = _own_features(g, gids)
    train_ids = task.local_ids(local, {k: g.ndata[k][gids] for k in task.node_fields()})
    return LocalData(graph=local, train_ids=train_ids, edges_total=edges_total)
