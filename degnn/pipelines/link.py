"""Link prediction, shared by pipeline=distdgl and pipeline=tma (docs/background.md, "TMA").

Training (a mini-batch of training edges): one uniform negative per positive (DGL's
`negative_sampler.Uniform(1)`: a random destination node for the same source), the model's
sampled blocks around every endpoint, the MLP decoder on the endpoints' elementwise product
(degnn.models.LinkModel), BCE-with-logits. The graph a pipeline trains on holds the training
edges only (the dataset removed the held-out validation and test edges, in both directions, before
partitioning), so no evaluation edge is ever a supervision edge or a message-passing edge. As in the
paper's code, a batch's own edges are not excluded from its blocks.

Loaders: `dist_edge_loader` (DistEdgeDataLoader on the DistGraph: distdgl, LLCG's correction) and
`local_edge_loader` (DataLoader + as_edge_prediction_sampler on a TMA trainer's own subgraph)
yield `(input_nodes, pos_graph, neg_graph, blocks)`; node loaders yield `(input_nodes, seeds,
blocks)`, and `batch_loss` takes either, so the pipelines' loops are the same for both tasks.

Evaluation: full-neighbour embeddings of every node (layer-wise, once per evaluation), then each
validation/test edge's logit and the logits of its 1000 fixed negatives (`link_scores`), ranked by
OGB's Evaluator (degnn.data.evaluate.reciprocal_ranks). The held-out edges and negatives reach the
trainers with the partition (`load_link_split`: partitioners/writer.py wrote them in the partition's
node ids).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

import dgl
import torch
import torch.nn.functional as F

from degnn.runtime.compat import DistEdgeDataLoader, NeighborSampler

# negatives per training positive (the paper's Uniform(k=1); BCE's pos_weight = k / 1 = 1)
NEG_PER_POS = 1
ID_BYTES = 8
LINK_SPLIT = "link_split.pt"  # partitioners.writer.LINK_SPLIT (not imported: trainers need no partitioner)


def local_edge_loader(graph, eids: torch.Tensor, fanouts, batch_size: int):
    """Mini-batches of `eids` of a plain DGLGraph, one uniform negative per positive."""
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        NeighborSampler(list(fanouts)), negative_sampler=dgl.dataloading.negative_sampler.Uniform(NEG_PER_POS))
    return dgl.dataloading.DataLoader(graph, eids, sampler, batch_size=batch_size, shuffle=True, drop_last=False)


def dist_edge_loader(g, eids: torch.Tensor, fanouts, batch_size: int):
    """Mini-batches of `eids` of a DistGraph (sampling through the graph servers), one uniform
    negative per positive. DGL's distributed edge loader takes the negative sampler itself (its
    EdgeCollator), not as_edge_prediction_sampler."""
    return DistEdgeDataLoader(g, eids, NeighborSampler(list(fanouts)),
                              negative_sampler=dgl.dataloading.negative_sampler.Uniform(NEG_PER_POS),
                              batch_size=batch_size, shuffle=True, drop_last=False)


def link_loss(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """BCE-with-logits over the positive (label 1) and negative (label 0) pairs of a batch."""
    logits = torch.cat([pos, neg])
    labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
    return F.binary_cross_entropy_with_logits(logits, labels)


def batch_inputs(batch, feat, label=None):
    """(x, y) of one mini-batch of either task: the input nodes' features and, for a node batch
    (input_nodes, seeds, blocks), the seeds' labels (None for a link batch). `feat` / `label` are
    indexed by node id (a tensor, or a DistTensor: a KVStore pull, timed as owner wait)."""
    x = feat[batch[0]].float()
    return x, (None if len(batch) == 4 else label[batch[1]].long())


def inputs_loss(model, batch, x, y=None) -> torch.Tensor:
    """The loss of one mini-batch through `model` (a DDP wrapper or the model), given its inputs:
    cross-entropy of the seeds' labels for a node batch; `link_loss` for a link batch
    (input_nodes, pos_graph, neg_graph, blocks)."""
    if len(batch) == 4:
        _, pos_graph, neg_graph, blocks = batch
        return link_loss(*model(blocks, x, pos_graph, neg_graph))
    return F.cross_entropy(model(batch[-1], x), y)


def batch_loss(model, batch, feat, label=None) -> torch.Tensor:
    """`inputs_loss` of a batch whose inputs are read from `feat` / `label` (see batch_inputs)."""
    return inputs_loss(model, batch, *batch_inputs(batch, feat, label))


def edge_lookup_bytes(pb, batch) -> int:
    """Bytes of a distributed link batch's edge lookups: DGL's edge collator finds the endpoints of
    the batch's edges twice (edge_subgraph, and the negative sampler's find_edges); an edge owned
    by another machine costs its id out and (src, dst) back each time. 0 for a node batch."""
    if len(batch) != 4:
        return 0
    eids = batch[1].edata[dgl.EID]
    remote = int((pb.eid2partid(eids) != pb.partid).sum())
    return 2 * 3 * ID_BYTES * remote


def negatives_per_positive(batch) -> float:
    """Measured on a link batch: its negative pairs per positive pair."""
    return batch[2].num_edges() / max(1, batch[1].num_edges())


# --- evaluation ---------------------------------------------------------------------------------
class LinkSplitError(RuntimeError):
    pass


def load_link_split(part_config) -> Dict[str, Dict[str, torch.Tensor]]:
    """The held-out edges and negatives stored with the partition ({"valid"/"test": {source_node,
    target_node, target_node_neg}}, the partition's node ids)."""
    path = Path(part_config).parent / LINK_SPLIT
    if not path.is_file():
        raise LinkSplitError(f"{path} missing: a link dataset's partitions carry its validation and test "
                             f"edges; partition it with degnn's partitioners (python -m partitioners, or let "
                             f"degnn.launch do it), not DGL's partition_graph")
    split = torch.load(path, map_location="cpu", weights_only=True)
    # negatives stay as stored (int32 when the ids fit: citation2 has 2 x 87k x 1000 of them)
    return {p: {k: v if k == "target_node_neg" else v.long() for k, v in split[p].items()}
            for p in ("valid", "test")}


def neg_chunk(k: int, dim: int, budget_bytes: int = 1 << 25) -> int:
    """Held-out edges per chunk so that one chunk's [rows, k, dim] float tensor fits the budget."""
    return max(1, budget_bytes // max(1, 4 * k * dim))


@torch.no_grad()
def link_scores(decoder, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                neg: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Logits of the edges (src[i], dst[i]) [m] and of their negatives (src[i], neg[i, j]) [m, k],
    `h` holding the embeddings by the ids used in src/dst/neg. Chunked over edges: 2,000 edges x
    1000 negatives x 128 dims would be a 1 GB tensor at once."""
    was = decoder.training
    decoder.eval()
    pos = decoder(h[src], h[dst])
    step = neg_chunk(neg.shape[1], h.shape[1])
    negs = [decoder(h[src[s:s + step]].unsqueeze(1), h[neg[s:s + step]]) for s in range(0, len(src), step)]
    decoder.train(was)
    return pos, (torch.cat(negs) if negs else torch.zeros(0, neg.shape[1]))


def gather_rows(h, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(unique ids, their rows of `h`): one pull of every row a set of edges needs (a DistTensor
    read crosses the network for rows another machine owns)."""
    uniq = torch.unique(ids)
    return uniq, h[uniq]


def local_ids(uniq: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Positions of `ids` in the sorted unique ids `uniq`."""
    return torch.searchsorted(uniq, ids)
