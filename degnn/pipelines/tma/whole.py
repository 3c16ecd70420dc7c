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
  degnn/tasks/evaluation.py's DistEvaluator (barriers, all_gather), which would hang on a dead peer.
* `Corrector` (LLCG) keeps its own model and Adam state across rounds and samples through the
  DistGraph with DistNodeDataLoader (link task: DistEdgeDataLoader over every edge), like the
  distdgl baseline; its traffic is counted under `correction`.

The task says which node data the fetch needs besides the features (node task: labels and
masks; link task: none, the held-out edges come with the partition) and scores the last layer.
"""
from __future__ import annotations

import time
from typing import Callable

import dgl
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from degnn.metrics import ID_BYTES, sampling_bytes


class WholeGraph:
    def __init__(self, g, counter, beat: Callable[[], None], task, chunk: int = 16384):
        t0 = time.time()
        pb = g.get_partition_book()
        n = g.num_nodes()
        srcs, dsts, feat = [], [], []
        fields = {k: [] for k in task.whole_fields()}
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
            row = x.shape[1] * x.element_size()
            for k, got in fields.items():
                t = g.ndata[k][nids]
                got.append(t)
                row += t.element_size()
            # seeds out, (src, dst, eid) back for remote seeds; the feature row and the task's fields
            counter.add("eval", int(remote.sum()) * (ID_BYTES + row) + 3 * ID_BYTES * int(remote_dst.sum()))
            beat()
        self.graph = dgl.graph((torch.cat(srcs), torch.cat(dsts)), num_nodes=n)
        self.feat = torch.cat(feat)
        self.data = {k: torch.cat(v) for k, v in fields.items()}
        self.fetch_s = time.time() - t0

    @torch.no_grad()
    def evaluate(self, model, task):
        """(validation, test) metric of `model` with full neighbourhoods, layer by layer."""
        was_training = model.training
        model.eval()
        h = self.feat
        for i in range(model.num_layers):
            h = model.layer_forward(i, self.graph, h)
        model.train(was_training)
        return task.score_whole(h, self.data, model)


class Corrector:
    """LLCG's server correction: Adam steps on mini-batches sampled from the whole graph (node task:
    its train nodes; link task: every edge, one uniform negative each)."""

    def __init__(self, g, cfg, in_dim: int, task, whole: WholeGraph, counter):
        self.g, self.counter, self.task = g, counter, task
        self.pb = g.get_partition_book()
        self.model = task.build_model(in_dim)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.loader = task.dist_loader(g, task.whole_train_ids(g, whole.data), cfg.train.batch_size)
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
            self.counter.add("correction", sampling_bytes(remote, blocks) + self.task.lookup_bytes(self.pb, batch)
                             + int(remote.sum()) * (self.feat_row_bytes + ID_BYTES))
            loss = self.task.batch_loss(self.model, batch, g.ndata["feat"])
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            beat()
        return parameters_to_vector(self.model.parameters()).detach().clone()
