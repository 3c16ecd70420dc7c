"""DistDGL baseline: trainers sample through the graph servers, pull the raw features of every
sampled node from the KVStore, and synchronise gradients with DDP (one step per batch).

One batch: DistNodeDataLoader samples the multi-hop neighbourhood of the seeds (sampling RPCs to
the machines that own them) -> the features of all input nodes are pulled (remote rows cross the
network) -> forward/backward through the DDP wrapper -> gradient all-reduce -> Adam step.

Link task (the TMA paper's synchronous baseline): the same loop over mini-batches of training
edges from DistEdgeDataLoader, one uniform negative per positive, the MLP decoder and BCE
(degnn/pipelines/link.py); evaluation is MRR against each held-out edge's 1000 negatives.
"""
from __future__ import annotations

from typing import Optional, Tuple

import dgl
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from degnn.metrics import ring_allreduce_bytes, timed_allreduce_hook
from degnn.models import build_link_model, build_model
from degnn.pipelines.base import Pipeline
from degnn.pipelines.evaluation import DistEvaluator, dataset_evaluator
from degnn.pipelines.link import (batch_inputs, dist_edge_loader, edge_lookup_bytes, inputs_loss,
                                  load_link_split, negatives_per_positive)
from degnn.runtime.compat import DistNodeDataLoader, NeighborSampler

ID_BYTES = 8  # int64 node / edge ids on the wire


def sampling_bytes(remote: torch.Tensor, blocks) -> int:
    """Bytes of the sampling RPCs this batch sent to other machines.

    DGL sends the seeds of each hop to the machine that owns them (8 bytes per id) and gets back
    the sampled edges as (src, dst, eid) int64 triples; seeds owned by this machine are sampled
    locally and never cross the network. `remote` flags the batch's input nodes owned elsewhere:
    every block's destination nodes are a prefix of them (DGL's block layout), so one ownership
    lookup per batch serves every hop and the feature pull.
    """
    total = 0
    for block in blocks:
        seeds_remote = remote[:block.num_dst_nodes()]
        if not bool(seeds_remote.any()):
            continue
        # the edges sampled for remote seeds are their in-edges in the block (no COO needed)
        total += ID_BYTES * int(seeds_remote.sum()) + 3 * ID_BYTES * int(block.in_degrees()[seeds_remote].sum())
    return total


def num_classes_of(g, train_nids) -> int:
    top = torch.tensor([int(g.ndata["label"][train_nids].max()) if len(train_nids) else 0])
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return int(top) + 1


class DistDGLPipeline(Pipeline):
    name = "distdgl"
    metric = "acc"
    tasks = ("node", "link")

    def setup(self) -> None:
        ctx, cfg = self.ctx, self.cfg
        self.check_task(cfg)
        g = ctx.graph
        self.pb = g.get_partition_book()
        self.link = cfg.dataset.task == "link"
        in_dim = g.ndata["feat"].shape[1]
        self.feat_row_bytes = in_dim * 4
        link_split = None
        if self.link:
            self.metric = "mrr"
            # every edge of the training graph (both directions) supervises; the held-out edges
            # are not in it
            self.train_ids = dgl.distributed.edge_split(torch.ones(g.num_edges(), dtype=torch.bool), self.pb,
                                                        force_even=True)
            self.label, num_classes = None, None
            link_split = load_link_split(ctx.part_config)
            torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
            self.model = build_link_model(cfg.model, in_dim)
            out_dims = [cfg.model.hidden] * cfg.model.layers
        else:
            self.train_ids = dgl.distributed.node_split(g.ndata["train_mask"], self.pb, force_even=True)
            self.label = g.ndata["label"]
            num_classes = num_classes_of(g, self.train_ids)
            torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
            self.model = build_model(cfg.model, in_dim, num_classes)
            out_dims = [cfg.model.hidden] * (cfg.model.layers - 1) + [num_classes]
        torch.manual_seed(cfg.train.seed + ctx.rank)
        # Every forward goes through the DDP wrapper: calling submodules directly would skip
        # DDP's gradient hooks silently (docs/design.md, "Pitfalls the code relies on").
        self.ddp = DistributedDataParallel(self.model)
        self.ddp.register_comm_hook(None, timed_allreduce_hook(self.timer))  # DDP's averaging, timed
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        if self.link:
            self.loader = dist_edge_loader(g, self.train_ids, cfg.model.fanouts, cfg.train.batch_size)
        else:
            self.loader = DistNodeDataLoader(g, self.train_ids, NeighborSampler(list(cfg.model.fanouts)),
                                             batch_size=cfg.train.batch_size, shuffle=True, drop_last=False)
        self.evaluator = DistEvaluator(ctx, self.model, out_dims, dataset_evaluator(cfg.dataset),
                                       cfg.train.eval_batch_size, link_split=link_split)
        self.num_classes = num_classes
        self._batch_iter = None  # train.batches_per_epoch: the pass under way
        self.link_info = {}
        if self.link:
            self.link_info = {"eval_num_neg": int(link_split["valid"]["target_node_neg"].shape[1]),
                              "eval_edges": {p: len(d["source_node"]) for p, d in link_split.items()}}
        self.log.info("distdgl: %d train %s on this trainer, %s, %d parameters", len(self.train_ids),
                      "edges" if self.link else "nodes",
                      "MRR" if self.link else f"{num_classes} classes",
                      sum(p.numel() for p in self.model.parameters()))

    def batches_per_epoch(self) -> Optional[int]:
        return self.cfg.train.batches_per_epoch or -(-len(self.train_ids) // self.cfg.train.batch_size)

    def _epoch_batches(self):
        """One pass over the loader, or (train.batches_per_epoch=N) the next N batches of it,
        starting a new pass whenever one ends. Every rank takes the same number of steps (DDP)."""
        n = self.cfg.train.batches_per_epoch
        if not n:
            yield from self.loader
            return
        for _ in range(n):
            batch = None if self._batch_iter is None else next(self._batch_iter, None)
            if batch is None:  # no pass under way yet, or it ended
                self._batch_iter = iter(self.loader)
                batch = next(self._batch_iter)
            yield batch

    def train_epoch(self, epoch: int, progress) -> Tuple[float, int]:
        counter, g = self.ctx.counter, self.ctx.graph
        world = self.ctx.world_size
        self.ddp.train()
        total, n = 0.0, 0
        timer = self.timer
        batches = self._epoch_batches()
        while True:
            with timer("sampling"):  # DGL's sampler, with its sampling RPCs to other machines
                # node: (input_nodes, seeds, blocks); link: (input_nodes, pos, neg, blocks)
                batch = next(batches, None)
            if batch is None:
                break
            input_nodes, blocks = batch[0], batch[-1]
            remote = self.pb.nid2partid(input_nodes) != self.pb.partid
            counter.add("sampling", sampling_bytes(remote, blocks) + edge_lookup_bytes(self.pb, batch))
            # remote feature rows: 8 bytes of id out, one feature row back
            counter.add("features", int(remote.sum()) * (self.feat_row_bytes + ID_BYTES))
            if self.link and "train_neg_per_pos" not in self.link_info:
                self.link_info["train_neg_per_pos"] = negatives_per_positive(batch)
            with timer("owner_wait"):  # the feature (and label) pulls from the machines that own the rows
                x, y = batch_inputs(batch, g.ndata["feat"], self.label)
            with timer("compute"):
                allreduce0 = timer.total["allreduce"]
                loss = inputs_loss(self.ddp, batch, x, y)
                self.optimizer.zero_grad()
                loss.backward()  # DDP all-reduces the gradients here (timed by the hook)
                self.optimizer.step()
            timer.add("compute", allreduce0 - timer.total["allreduce"])
            counter.add("allreduce", ring_allreduce_bytes(self.param_bytes, world))
            loss_value = loss.item()
            total += loss_value
            n += 1
            self.ctx.heartbeat.beat()
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss_value:.3f}", refresh=False)
        return (total / n if n else float("nan")), n

    def evaluate(self) -> Tuple[float, float]:
        return self.evaluator()

    def extra_summary(self):
        return {"fanouts": list(self.cfg.model.fanouts), "num_classes": self.num_classes, **self.link_info}
