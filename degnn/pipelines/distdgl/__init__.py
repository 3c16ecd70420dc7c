"""DistDGL baseline: trainers sample through the graph servers, pull the raw features of every
sampled node from the KVStore, and synchronise gradients with DDP (one step per batch).

One batch: DistNodeDataLoader samples the multi-hop neighbourhood of the seeds (sampling RPCs to
the machines that own them) -> the features of all input nodes are pulled (remote rows cross the
network) -> forward/backward through the DDP wrapper -> gradient all-reduce -> Adam step.
"""
from __future__ import annotations

from typing import Optional, Tuple

import dgl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from degnn.metrics import ring_allreduce_bytes
from degnn.models import build_model
from degnn.pipelines.base import Pipeline
from degnn.pipelines.evaluation import DistEvaluator, dataset_evaluator
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

    def setup(self) -> None:
        ctx, cfg = self.ctx, self.cfg
        if cfg.dataset.task != "node":
            raise ValueError(f"pipeline=distdgl trains node classification; dataset {cfg.dataset.name} is a "
                             f"{cfg.dataset.task} task")
        g = ctx.graph
        self.pb = g.get_partition_book()
        self.train_nids = dgl.distributed.node_split(g.ndata["train_mask"], self.pb, force_even=True)
        in_dim = g.ndata["feat"].shape[1]
        self.feat_row_bytes = in_dim * 4
        num_classes = num_classes_of(g, self.train_nids)
        torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
        self.model = build_model(cfg.model, in_dim, num_classes)
        torch.manual_seed(cfg.train.seed + ctx.rank)
        # Every forward goes through the DDP wrapper: calling submodules directly would skip
        # DDP's gradient hooks silently (docs/design.md, "Pitfalls the code relies on").
        self.ddp = DistributedDataParallel(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.loader = DistNodeDataLoader(g, self.train_nids, NeighborSampler(list(cfg.model.fanouts)),
                                         batch_size=cfg.train.batch_size, shuffle=True, drop_last=False)
        hidden_out = cfg.model.hidden
        out_dims = [hidden_out] * (cfg.model.layers - 1) + [num_classes]
        self.evaluator = DistEvaluator(ctx, self.model, out_dims, dataset_evaluator(cfg.dataset),
                                       cfg.train.eval_batch_size)
        self.num_classes = num_classes
        self.log.info("distdgl: %d train nodes on this trainer, %d classes, %d parameters",
                      len(self.train_nids), num_classes, sum(p.numel() for p in self.model.parameters()))

    def batches_per_epoch(self) -> Optional[int]:
        return -(-len(self.train_nids) // self.cfg.train.batch_size)

    def train_epoch(self, epoch: int, progress) -> Tuple[float, int]:
        counter, g = self.ctx.counter, self.ctx.graph
        world = self.ctx.world_size
        self.ddp.train()
        total, n = 0.0, 0
        for input_nodes, seeds, blocks in self.loader:
            remote = self.pb.nid2partid(input_nodes) != self.pb.partid
            counter.add("sampling", sampling_bytes(remote, blocks))
            # remote feature rows: 8 bytes of id out, one feature row back
            counter.add("features", int(remote.sum()) * (self.feat_row_bytes + ID_BYTES))
            x = g.ndata["feat"][input_nodes]
            y = g.ndata["label"][seeds].long()
            out = self.ddp(blocks, x)
            loss = F.cross_entropy(out, y)
            self.optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients here
            counter.add("allreduce", ring_allreduce_bytes(self.param_bytes, world))
            self.optimizer.step()
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
        return {"fanouts": list(self.cfg.model.fanouts), "num_classes": self.num_classes}
