"""Whole-graph evaluation on a DistGraph, shared by the pipelines.

Layer-wise, full-neighbour inference as DistDGL does it: for each layer, every trainer computes
that layer's output for its share of all nodes and writes it into a DistTensor; after a barrier
the next layer reads those rows. Node task: rank 0 scores validation and test predictions with
the dataset's evaluator (OGB's `Evaluator`). Link task: every trainer scores its share of the
held-out edges against their negatives with the model's decoder (embeddings computed once for
all of them) and ranks them with OGB's Evaluator; rank 0 averages the reciprocal ranks of all.
"""
from __future__ import annotations

from typing import List, Tuple

import dgl
import torch
import torch.distributed as dist

from degnn.data import config_value as _get
from degnn.data.evaluate import accuracy_evaluator, mrr_evaluator
from degnn.runtime.compat import DistNodeDataLoader, MultiLayerFullNeighborSampler


def dataset_evaluator(dataset):
    """The metric of a dataset config (OGB's `Evaluator`; see degnn/data/evaluate.py), by task.

    node: accuracy; OGB's own evaluator for a real OGB dataset, plain multiclass accuracy for the
    others. link: MRR of each positive among its negatives (ogbl-citation2's evaluator, for
    every link dataset). Anything else is refused (ValueError). Trainers only see partitions,
    not the loaded dataset, so they build it from the config.
    """
    name, kind, task = _get(dataset, "name"), _get(dataset, "kind"), _get(dataset, "task", "node")
    if task == "node":
        return accuracy_evaluator(str(name)) if kind == "ogb" else accuracy_evaluator()
    if task == "link":
        if kind == "ogb" and name != "ogbl-citation2":
            raise ValueError(f"dataset {name}: degnn evaluates OGB link datasets by MRR against their "
                             f"negatives (ogbl-citation2); {name} has another metric")
        return mrr_evaluator()
    raise ValueError(f"dataset {name}: dataset.task={task!r} has no evaluator; use node or link")


def remote_rows(pb, nids: torch.Tensor) -> int:
    """How many of `nids` live on another machine (their reads cross the network)."""
    return int((pb.nid2partid(nids) != pb.partid).sum())


class DistEvaluator:
    """`link_split` (link task): the held-out edges and negatives (degnn.pipelines.link.load_link_split);
    `model` then is a LinkModel."""

    def __init__(self, ctx, model, out_dims: List[int], evaluate_fn, batch_size: int, link_split=None):
        g = ctx.graph
        self.ctx, self.g, self.model, self.evaluate_fn = ctx, g, model, evaluate_fn
        self.pb = g.get_partition_book()
        self.batch_size = batch_size
        n = g.num_nodes()
        self.all_nids = dgl.distributed.node_split(torch.ones(n, dtype=torch.bool), self.pb, force_even=True)
        self.links = None
        if link_split is not None:
            # this trainer's share of each split's edges (contiguous rows)
            r, w = ctx.rank, ctx.world_size
            self.links = {}
            for p, d in link_split.items():
                m = len(d["source_node"])
                rows = slice(r * m // w, (r + 1) * m // w)
                self.links[p] = (d["source_node"][rows], d["target_node"][rows], d["target_node_neg"][rows].long())
        else:
            self.val_nids = dgl.distributed.node_split(g.ndata["val_mask"], self.pb, force_even=True)
            self.test_nids = dgl.distributed.node_split(g.ndata["test_mask"], self.pb, force_even=True)
        policy = g.get_node_partition_policy("_N")
        self.outputs = [
            dgl.distributed.DistTensor((n, d), torch.float32, name=f"degnn_eval_h{i}",
                                       part_policy=policy, persistent=True)
            for i, d in enumerate(out_dims)
        ]

    def inference(self) -> List:
        """Every layer's output for every node (one DistTensor a layer, input layer first), from one
        layer-wise whole-graph pass; every trainer calls it (collective)."""
        self._inference()
        return self.outputs

    @torch.no_grad()
    def _inference(self):
        feat_bytes = self.g.ndata["feat"].shape[1] * 4
        x = self.g.ndata["feat"]
        self.model.eval()
        sampler = MultiLayerFullNeighborSampler(1)
        for i, out in enumerate(self.outputs):
            loader = DistNodeDataLoader(self.g, self.all_nids, sampler, batch_size=self.batch_size,
                                        shuffle=False, drop_last=False)
            row_bytes = (feat_bytes if i == 0 else x.shape[1] * 4)
            for input_nodes, output_nodes, blocks in loader:
                self.ctx.counter.add("eval", remote_rows(self.pb, input_nodes) * row_bytes)
                h = self.model.layer_forward(i, blocks[0], x[input_nodes])
                out[output_nodes] = h
                self.ctx.heartbeat.beat()
            self.g.barrier()
            x = out
        self.model.train()
        return x

    def _score(self, logits, nids) -> float:
        pred = logits[nids].argmax(1)
        label = self.g.ndata["label"][nids].long()
        gathered = [None] * self.ctx.world_size
        dist.all_gather_object(gathered, (label, pred))
        score = None
        if self.ctx.is_rank0:
            y_true = torch.cat([t for t, _ in gathered])
            y_pred = torch.cat([p for _, p in gathered])
            score = self.evaluate_fn(y_true, y_pred)
        return score

    def _score_links(self, h) -> Tuple[float, float]:
        """MRR of the validation and test edges: this trainer ranks its share of each (one pull of
        the embeddings they need), rank 0 averages everyone's reciprocal ranks."""
        from degnn.data.evaluate import reciprocal_ranks
        from degnn.pipelines.link import gather_rows, link_scores, local_ids

        ids = torch.cat([t.reshape(-1) for edges in self.links.values() for t in edges])
        uniq, rows = gather_rows(h, ids)
        self.ctx.counter.add("eval", remote_rows(self.pb, uniq) * (h.shape[1] * 4 + 8))
        out = []
        for part in ("valid", "test"):
            src, dst, neg = (local_ids(uniq, t) for t in self.links[part])
            rr = reciprocal_ranks(*link_scores(self.model.decoder, rows, src, dst, neg))
            self.ctx.heartbeat.beat()
            gathered = [None] * self.ctx.world_size
            dist.all_gather_object(gathered, rr)
            out.append(float(torch.cat(gathered).mean()) if self.ctx.is_rank0 else None)
        return out[0], out[1]

    def __call__(self) -> Tuple[float, float]:
        h = self._inference()
        if self.links is not None:
            val, test = self._score_links(h)
        else:
            val, test = self._score(h, self.val_nids), self._score(h, self.test_nids)
        box = [val, test]
        dist.broadcast_object_list(box, src=0)
        return box[0], box[1]
