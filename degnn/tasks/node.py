"""Node classification: supervision by the training nodes' labels, cross-entropy, accuracy."""
from __future__ import annotations

from typing import Dict, List, Optional

import dgl
import torch
import torch.distributed as dist
import torch.nn.functional as F

from degnn.data.evaluate import accuracy_evaluator
from degnn.metrics import ID_BYTES
from degnn.models import build_model
from degnn.compat import DistNodeDataLoader, NeighborSampler
from degnn.runtime.own_rows import own_rows
from degnn.tasks.base import OwnIds, Task
from degnn.tasks.evaluation import gather_to_rank0, remote_rows


def num_classes_of(g, pb, counter=None, collective: bool = True) -> int:
    """Classes among the whole graph's training labels (as every pipeline counts them).

    With torch.distributed: each trainer takes the largest label of its own training nodes and
    one all-reduce takes the maximum. Without it (a pipeline that must not block on a dead
    peer): the labels are scanned through the KVStore, remote rows counted under `setup`."""
    if collective:
        own = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
        top = torch.tensor([int(g.ndata["label"][own].max()) if len(own) else 0])
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return int(top) + 1
    n, top = g.num_nodes(), 0
    for start in range(0, n, 65536):
        nids = torch.arange(start, min(n, start + 65536))
        mask = g.ndata["train_mask"][nids].bool()
        if mask.any():
            top = max(top, int(g.ndata["label"][nids][mask].max()))
        if counter is not None:
            counter.add("setup", int((pb.nid2partid(nids) != pb.partid).sum()) * (8 + 8 + 1))
    return top + 1


class NodeScorer:
    """Accuracy of the validation and test nodes: each trainer predicts its share, rank 0 scores."""

    def __init__(self, ctx):
        g = self.g = ctx.graph
        pb = g.get_partition_book()
        self.ctx = ctx
        self.val_nids = dgl.distributed.node_split(g.ndata["val_mask"], pb, force_even=True)
        self.test_nids = dgl.distributed.node_split(g.ndata["test_mask"], pb, force_even=True)
        self._sampled = None  # sample_splits' nodes, drawn at the first sampled evaluation

    def _one(self, logits, nids, evaluate_fn):
        return self._scored(nids, logits[nids], evaluate_fn)

    def _scored(self, nids, logits, evaluate_fn):
        """The metric of this trainer's `nids` (one split's share) from their logits, in that order,
        and every other trainer's (collective; the value on rank 0, None elsewhere)."""
        pairs = gather_to_rank0(self.ctx, (self.g.ndata["label"][nids].long(), logits.argmax(1)))
        if pairs is None:
            return None
        return evaluate_fn(torch.cat([t for t, _ in pairs]), torch.cat([p for _, p in pairs]))

    def __call__(self, logits, model, evaluate_fn):
        return self._one(logits, self.val_nids, evaluate_fn), self._one(logits, self.test_nids, evaluate_fn)

    def sampled(self, predict, evaluate_fn):
        """(validation, test) metric from `predict(nids)`: the logits of this trainer's share of a
        split's nodes, in that order (train.eval_fanouts: no whole-graph table)."""
        return tuple(self._scored(nids, predict(nids), evaluate_fn) for nids in self.sample_splits())

    def sample_splits(self):
        """This trainer's validation and test nodes, at most its share of train.eval_max_nodes of
        each, drawn uniformly once (the same nodes every evaluation)."""
        if self._sampled is None:
            cfg = self.ctx.cfg.train
            limit = -(-int(cfg.get("eval_max_nodes", 0)) // self.ctx.world_size)
            g = torch.Generator().manual_seed(int(cfg.seed) + self.ctx.rank)
            self._sampled = tuple(nids if not limit or len(nids) <= limit
                                  else nids[torch.randperm(len(nids), generator=g)[:limit].sort().values]
                                  for nids in (self.val_nids, self.test_nids))
        return self._sampled


class NodeTask(Task):
    name = "node"
    metric = "acc"
    unit = "nodes"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.num_classes = None
        self.g = None
        self.label = None
        self._evaluate_fn = None

    def prepare(self, ctx, collective: bool = True) -> None:
        g = self.g = ctx.graph
        self.num_classes = num_classes_of(g, g.get_partition_book(), ctx.counter, collective)
        self.label = g.ndata["label"]

    def dist_ids(self, g, pb) -> torch.Tensor:
        return dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)

    def dist_loader(self, g, ids, batch_size: int):
        return DistNodeDataLoader(g, ids, NeighborSampler(list(self.cfg.model.fanouts)),
                                  batch_size=batch_size, shuffle=True, drop_last=False)

    def node_fields(self) -> List[str]:
        return ["label", "train_mask"]

    def partition_fields(self) -> List[str]:
        return ["feat", "label", "train_mask", "val_mask", "test_mask"]

    def local_ids(self, graph, owned: Dict[str, torch.Tensor]) -> torch.Tensor:
        graph.ndata["label"] = owned["label"].long()
        return owned["train_mask"].bool().nonzero().squeeze(1)

    def local_loader(self, graph, ids, batch_size: int):
        return dgl.dataloading.DataLoader(graph, ids, NeighborSampler(list(self.cfg.model.fanouts)),
                                          batch_size=batch_size, shuffle=True, drop_last=False)

    def local_labels(self, graph) -> torch.Tensor:
        return graph.ndata["label"]

    def all_train_ids(self, g, counter, category: str) -> torch.Tensor:
        pb, n, ids = g.get_partition_book(), g.num_nodes(), []
        for start in range(0, n, 65536):
            nids = torch.arange(start, min(n, start + 65536))
            ids.append(nids[g.ndata["train_mask"][nids].bool()])
            counter.add(category, int((pb.nid2partid(nids) != pb.partid).sum()) * (ID_BYTES + 1))
        return torch.cat(ids)

    def score_share(self, h, nids, share: int, shares: int, model, counter):
        """Accuracy (the dataset's evaluator) of the validation and test nodes among `nids`,
        times their number."""
        g, fn = self.g, self.evaluate_fn()
        pb = g.get_partition_book()
        out = {}
        for key, mask in (("val", "val_mask"), ("test", "test_mask")):
            ids = nids[g.ndata[mask][nids].bool()]
            out[key] = [fn(self.label[ids].long(), h[ids].argmax(1)) * len(ids), len(ids)] if len(ids) else [0.0, 0]
            # the mask of every node, then the label and the output row of each scored one
            counter.add("eval", remote_rows(pb, nids) * (ID_BYTES + 1)
                        + remote_rows(pb, ids) * (3 * ID_BYTES + h.shape[1] * 4))
        return out

    def inputs(self, batch, feat, label=None):
        """Batch (input_nodes, seeds, blocks): the input nodes' features, the seeds' labels
        (`label` by node id: a DistTensor pull, or the local graph's labels)."""
        label = self.label if label is None else label
        return feat[batch[0]].float(), label[batch[1]].long()

    def loss(self, model, batch, x, y) -> torch.Tensor:
        return F.cross_entropy(model(batch[-1], x), y)

    def own_ids(self, g, pb, trainer: int, trainers: int) -> OwnIds:
        """The training nodes of DGL's split without force_even (which may hand out other
        machines' nodes): this machine's own, shared among its trainers by DGL."""
        nids = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=False)
        if len(nids) and not bool((pb.nid2partid(nids) == pb.partid).all()):
            raise RuntimeError("node_split gave this trainer training nodes of another machine")
        return OwnIds(pb.nid2localnid(nids, pb.partid).long())

    def own_labels(self, g, pb, own: torch.Tensor) -> Optional[torch.Tensor]:
        """The labels' own rows in the machine's shared memory (runtime/own_rows.py)."""
        return own_rows(g.ndata["label"], pb, own)

    def own_batch(self, ids, owned, labels):
        """The batch's training nodes are its seeds; their labels the target."""
        return ids, labels[ids].long()

    def seed_loss(self, model, h, target) -> torch.Tensor:
        """Cross-entropy of the seeds' logits against their labels."""
        return F.cross_entropy(h, target)

    def build_model(self, in_dim: int) -> torch.nn.Module:
        return build_model(self.cfg.model, in_dim, self.num_classes)

    def out_dims(self) -> List[int]:
        m = self.cfg.model
        return [m.hidden] * (m.layers - 1) + [self.num_classes]

    def scorer(self, ctx):
        return NodeScorer(ctx)

    def evaluate_fn(self):
        if self._evaluate_fn is None:  # OGB's Evaluator reads its table once, not every evaluation
            ds = self.cfg.dataset
            self._evaluate_fn = accuracy_evaluator(str(ds.name)) if ds.kind == "ogb" else accuracy_evaluator()
        return self._evaluate_fn

    def describe(self) -> str:
        return f"{self.num_classes} classes"

    def summary(self) -> dict:
        return {"num_classes": self.num_classes}
