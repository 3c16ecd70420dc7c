"""Link prediction (the task of the TMA paper; docs/background.md, "TMA").

Training (a mini-batch of training edges): one uniform negative per positive (DGL's
`negative_sampler.Uniform(1)`: a random destination node for the same source), the model's
sampled blocks around every endpoint, the MLP decoder on the endpoints' elementwise product
(degnn.models.LinkModel), BCE-with-logits. The graph a pipeline trains on holds the training
edges only (the dataset removed the held-out validation and test edges, in both directions, before
partitioning), so no evaluation edge is ever a supervision edge or a message-passing edge. As in the
paper's code, a batch's own edges are not excluded from its blocks.

Loaders: `dist_edge_loader` (DistEdgeDataLoader on the DistGraph: distdgl, LLCG's correction) and
`local_edge_loader` (DataLoader + as_edge_prediction_sampler on a TMA trainer's own subgraph)
yield `(input_nodes, pos_graph, neg_graph, blocks)`; `LinkTask` gives the pipelines the same
methods as the node task (degnn/tasks/node.py), so their loops are the same for both tasks.

Evaluation: full-neighbour embeddings of every node (layer-wise, once per evaluation), then each
validation/test edge's logit and the logits of its 1000 fixed negatives (`link_scores`), ranked by
OGB's Evaluator (degnn.data.evaluate.reciprocal_ranks). The held-out edges and negatives reach the
trainers with the partition (`load_link_split`: partitioners/writer.py wrote them in the partition's
node ids).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import dgl
import torch
import torch.nn.functional as F

from degnn.data.evaluate import mrr_evaluator, reciprocal_ranks
from degnn.metrics import ID_BYTES
from degnn.models import build_link_model
from degnn.compat import DistEdgeDataLoader, NeighborSampler
from degnn.tasks.base import OwnIds, Task
from degnn.tasks.evaluation import gather_to_rank0, remote_rows

# negatives per training positive (the paper's Uniform(k=1); BCE's pos_weight = k / 1 = 1)
NEG_PER_POS = 1
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


def share_of(split, share: int, shares: int) -> Dict[str, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Share `share` of `shares` of every split's held-out edges (contiguous rows): {part: (src,
    dst, negatives)}."""
    out = {}
    for p, d in split.items():
        m = len(d["source_node"])
        rows = slice(share * m // shares, (share + 1) * m // shares)
        out[p] = (d["source_node"][rows], d["target_node"][rows], d["target_node_neg"][rows].long())
    return out


def share_ranks(h, links, pb, counter, decoder, beat=lambda: None) -> Dict[str, torch.Tensor]:
    """The reciprocal ranks of `links` ({part: (src, dst, negatives)}) from the embeddings `h`
    (a DistTensor of every node: one pull of the rows they need, remote ones counted under `eval`)."""
    ids = torch.cat([t.reshape(-1) for edges in links.values() for t in edges])
    uniq, rows = gather_rows(h, ids)
    counter.add("eval", remote_rows(pb, uniq) * (h.shape[1] * 4 + 8))
    out = {}
    for part, edges in links.items():
        src, dst, neg = (local_ids(uniq, t) for t in edges)
        out[part] = reciprocal_ranks(*link_scores(decoder, rows, src, dst, neg))
        beat()
    return out


class LinkScorer:
    """MRR of the validation and test edges: this trainer ranks its share of each (one pull of the
    embeddings they need), rank 0 averages everyone's reciprocal ranks."""

    def __init__(self, ctx, split):
        self.ctx = ctx
        self.pb = ctx.graph.get_partition_book()
        self.links = share_of(split, ctx.rank, ctx.world_size)

    def __call__(self, h, model, evaluate_fn):
        rr = share_ranks(h, self.links, self.pb, self.ctx.counter, model.decoder, self.ctx.heartbeat.beat)
        out = []
        for part in ("valid", "test"):
            gathered = gather_to_rank0(self.ctx, rr[part])
            out.append(float(torch.cat(gathered).mean()) if gathered is not None else None)
        return out[0], out[1]


class LinkTask(Task):
    """Training edges supervise (the graph holds no held-out edge); the held-out validation and
    test edges with their fixed negatives come with the partition (load_link_split)."""

    name = "link"
    metric = "mrr"
    unit = "edges"

    def __init__(self, cfg):
        super().__init__(cfg)
        ds = cfg.dataset
        if ds.kind == "ogb" and ds.name != "ogbl-citation2":
            raise ValueError(f"dataset {ds.name}: degnn evaluates OGB link datasets by MRR against their "
                             f"negatives (ogbl-citation2); {ds.name} has another metric")
        self.part_config = None
        self.pb = None
        self._split = None
        self.info: Dict[str, object] = {}

    def prepare(self, ctx, collective: bool = True) -> None:
        self.part_config = ctx.part_config
        self.pb = ctx.graph.get_partition_book()

    @property
    def split(self):
        """The held-out edges, read from the partition when first needed (they can be large)."""
        if self._split is None and self.part_config is not None:
            self._split = load_link_split(self.part_config)
        return self._split

    def dist_ids(self, g, pb) -> torch.Tensor:
        # every edge of the training graph (both directions) supervises
        return dgl.distributed.edge_split(torch.ones(g.num_edges(), dtype=torch.bool), pb, force_even=True)

    def dist_loader(self, g, ids, batch_size: int):
        return dist_edge_loader(g, ids, self.cfg.model.fanouts, batch_size)

    def local_ids(self, graph, owned: Dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.arange(graph.num_edges())

    def local_loader(self, graph, ids, batch_size: int):
        return local_edge_loader(graph, ids, self.cfg.model.fanouts, batch_size)

    def all_train_ids(self, g, counter, category: str) -> torch.Tensor:
        return torch.arange(g.num_edges())

    def score_share(self, h, nids, share: int, shares: int, model, counter):
        """The reciprocal ranks of share `share` of the held-out edges, summed."""
        rr = share_ranks(h, share_of(self.split, share, shares), self.pb, counter, model.decoder)
        return {key: [float(rr[part].sum()), len(rr[part])] for key, part in (("val", "valid"), ("test", "test"))}

    def own_ids(self, g, pb, trainer: int, trainers: int) -> OwnIds:
        """The training edges of this machine's partition whose two endpoints it owns (every
        endpoint of a batch, negatives too, is then a node the machine owns), split among the
        machine's trainers in contiguous shares: [2, n] (src, dst). An edge to a halo node (a cut
        edge) carries messages but supervises no batch; `pool` says how many edges a share was
        taken from."""
        part = g.local_partition
        indptr, indices, _ = part.adj_tensors("csc")
        inner = part.ndata["inner_node"].bool()
        dst = torch.repeat_interleave(torch.arange(len(indptr) - 1), indptr[1:] - indptr[:-1])
        src = indices.long()
        keep = inner[src] & inner[dst]
        pairs = torch.stack([src[keep], dst[keep]])
        n = pairs.shape[1]
        # the pool: the part's inner edges (into its own nodes), whatever else the server keeps
        return OwnIds(pairs[:, trainer * n // trainers:(trainer + 1) * n // trainers], int(inner[dst].sum()) / trainers)

    def own_batch(self, ids, owned, labels):
        """Seeds: the endpoints of the batch's edges (`ids`, [2, b]) and of their negatives
        (NEG_PER_POS each: the same source, a uniform destination among `owned`), unique; target:
        the positive and the negative pairs as positions among the seeds, ((src, dst), (src, dst))."""
        b = ids.shape[1]
        neg = owned[torch.randint(len(owned), (b * NEG_PER_POS,))]
        seeds, at = torch.unique(torch.cat([ids[0], ids[1], neg]), return_inverse=True)
        self.info["train_neg_per_pos"] = len(neg) / max(1, b)
        return seeds, ((at[:b], at[b:2 * b]), (at[:b].repeat_interleave(NEG_PER_POS), at[2 * b:]))

    def seed_loss(self, model, h, target) -> torch.Tensor:
        """The decoder's logits of the target's positive and negative pairs of seeds, link_loss."""
        (ps, pd), (ns, nd) = target
        return link_loss(model.decoder(h[ps], h[pd]), model.decoder(h[ns], h[nd]))

    def encoder(self, model) -> torch.nn.Module:
        """The GNN under the decoder (models.LinkModel.encoder)."""
        return model.encoder

    def inputs(self, batch, feat, label=None):
        """Batch (input_nodes, pos_graph, neg_graph, blocks): features only, the pairs are the targets."""
        return feat[batch[0]].float(), None

    def loss(self, model, batch, x, y) -> torch.Tensor:
        _, pos_graph, neg_graph, blocks = batch
        return link_loss(*model(blocks, x, pos_graph, neg_graph))

    def lookup_bytes(self, pb, batch) -> int:
        """DGL's edge collator finds the endpoints of the batch's edges twice (edge_subgraph, and
        the negative sampler's find_edges); an edge owned by another machine costs its id out and
        (src, dst) back each time."""
        eids = batch[1].edata[dgl.EID]
        return 2 * 3 * ID_BYTES * int((pb.eid2partid(eids) != pb.partid).sum())

    def observe(self, batch) -> None:
        if "train_neg_per_pos" not in self.info:  # measured: negative pairs per positive pair
            self.info["train_neg_per_pos"] = batch[2].num_edges() / max(1, batch[1].num_edges())

    def build_model(self, in_dim: int) -> torch.nn.Module:
        return build_link_model(self.cfg.model, in_dim)

    def out_dims(self) -> List[int]:
        return [self.cfg.model.hidden] * self.cfg.model.layers

    def scorer(self, ctx):
        return LinkScorer(ctx, self.split)

    def evaluate_fn(self):
        return mrr_evaluator()

    def describe(self) -> str:
        return "MRR"

    def summary(self) -> dict:
        out = dict(self.info)
        if self._split is not None:
            out.update(eval_num_neg=int(self.split["valid"]["target_node_neg"].shape[1]),
                       eval_edges={p: len(d["source_node"]) for p, d in self.split.items()})
        return out
