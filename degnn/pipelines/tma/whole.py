"""What the evaluating trainer does with the whole graph: evaluation, and LLCG's correction.

In the paper's code a separate server process holds the full training graph, evaluates every
averaged model on it (full neighbourhoods, layer-wise) and, for LLCG, takes `corr_steps` Adam
steps on whole-graph mini-batches (docs/background.md, "TMA"). Here the lowest live trainer plays
that role (the coordinator names it), so nothing depends on one trainer staying alive:

* `WholeGraph` fetches the whole graph once through the DistGraph (every node's in-edges by
  `dgl.distributed.sample_neighbors(fanout=-1)`, features, labels, masks by KVStore pulls), then
  evaluates every round locally with full-neighbour, layer-wise inference. The fetch is counted
  under `eval` and happens outside the training clock; a trainer that takes over evaluation
  after the evaluator died fetches it again. No collective is involved, unlike
  pipelines/evaluation.py's DistEvaluator (barriers, all_gather), which would hang on a dead peer.
* `Corrector` (LLCG) keeps its own model and Adam state across rounds and samples through the
  DistGraph with DistNodeDataLoader (link task: DistEdgeDataLoader over every edge), like the
  distdgl baseline; its traffic is counted under `correction`.

Link task: the whole graph is the training graph (features only), evaluation is the MRR of the
held-out edges carried with the partition against their negatives (degnn/pipelines/link.py).
"""
from __future__ import annotations

import time
from typing import Callable

import dgl
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from degnn.models import build_link_model, build_model
from degnn.pipelines.distdgl import sampling_bytes
from degnn.pipelines.link import batch_loss, dist_edge_loader, edge_lookup_bytes, link_scores
from degnn.runtime.compat import DistNodeDataLoader, NeighborSampler


ID_BYTES = 8


class WholeGraph:
    def __init__(self, g, counter, beat: Callable[[], None], chunk: int = 16384, link: bool = False):
        t0 = time.time()
        self.link = link
        pb = g.get_partition_book()
        n = g.num_nodes()
        srcs, dsts = [], []
        feat, label, val, test, train = [], [], [], [], []
        for start in range(0, n, chunk):
            nids = torch.arange(start, min(n, start + chunk))
            frontier = dgl.distributed.sample_neighbors(g, nids, -1)
            s, d = frontier.edges()
            srcs.append(s)
            dsts.append(d)
            remote = pb.nid2partid(nids) != pb.partid
            remote_dst = pb.nid2partid(d) != pb.partid if len(d) else d.bool()
            x = g.ndata["feat"][nids]
            feat.append(x.float())
            if not link:
                label.append(g.ndata["label"][nids].long())
                val.append(g.ndata["val_mask"][nids].bool())
                test.append(g.ndata["test_mask"][nids].bool())
                train.append(g.ndata["train_mask"][nids].bool())
            # seeds out, (src, dst, eid) back for remote seeds; feature row (+ label + 3 masks)
            row = x.shape[1] * x.element_size() + (0 if link else 8 + 3)
            self_bytes = int(remote.sum()) * (ID_BYTES + row) + 3 * ID_BYTES * int(remote_dst.sum())
            counter.add("eval", self_bytes)
            beat()
        self.graph = dgl.graph((torch.cat(srcs), torch.cat(dsts)), num_nodes=n)
        self.feat = torch.cat(feat)
        if not link:
            self.label = torch.cat(label)
            self.val_nids = torch.cat(val).nonzero().squeeze(1)
            self.test_nids = torch.cat(test).nonzero().squeeze(1)
            self.train_nids = torch.cat(train).nonzero().squeeze(1)
        self.fetch_s = time.time() - t0

    @torch.no_grad()
    def evaluate(self, model, evaluate_fn, link_split=None):
        """(validation, test) metric of `model` with full neighbourhoods, layer by layer. Link task
        (`link_split`): MRR of each split's edges against their negatives, one embedding pass."""
        was_training = model.training
        model.eval()
        h = self.feat
        for i in range(model.num_layers):
            h = model.layer_forward(i, self.graph, h)
        model.train(was_training)
        if link_split is not None:
            return tuple(evaluate_fn(*link_scores(model.decoder, h, d["source_node"], d["target_node"],
                                                  d["target_node_neg"]))
                         for d in (link_split["valid"], link_split["test"]))
        pred = h.argmax(1)
        return (evaluate_fn(self.label[self.val_nids], pred[self.val_nids]),
                evaluate_fn(self.label[self.test_nids], pred[self.test_nids]))


class Corrector:
    """LLCG's server correction: Adam steps on mini-batches sampled from the whole graph (node task:
    its train nodes; link task: every edge, one uniform negative each)."""

    def __init__(self, g, cfg, in_dim: int, num_classes: int, train_nids: torch.Tensor, counter,
                 link: bool = False):
        self.g, self.counter = g, counter
        self.pb = g.get_partition_book()
        self.model = build_link_model(cfg.model, in_dim) if link else build_model(cfg.model, in_dim, num_classes)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        if link:
            self.loader = dist_edge_loader(g, torch.arange(g.num_edges()), cfg.model.fanouts, cfg.train.batch_size)
            self.label = None
        else:
            self.loader = DistNodeDataLoader(g, train_nids, NeighborSampler(list(cfg.model.fanouts)),
                                             batch_size=cfg.train.batch_size, shuffle=True, drop_last=False)
            self.label = g.ndata["label"]
        self.it = None
        self.feat_row_bytes = in_dim * 4

    def _batch(self):
        for _ in range(2):
            if self.it is None:
                self.it = iter(self.loader)
            try:
                return next(self.it)
            except StopIteration:
                self.it = None
        raise RuntimeError("llcg: the whole graph has nothing to train on")

    def correct(self, flat: torch.Tensor, steps: int, beat: Callable[[], None]) -> torch.Tensor:
        vector_to_parameters(flat, self.model.parameters())
        self.model.train()
        g = self.g
        for _ in range(steps):
            batch = self._batch()
            input_nodes, blocks = batch[0], batch[-1]
            remote = self.pb.nid2partid(input_nodes) != self.pb.partid
            self.counter.add("correction", sampling_bytes(remote, blocks) + edge_lookup_bytes(self.pb, batch)
                             + int(remote.sum()) * (self.feat_row_bytes + ID_BYTES))
            loss = batch_loss(self.model, batch, g.ndata["feat"], self.label)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            beat()
        return parameters_to_vector(self.model.parameters()).detach().clone()
