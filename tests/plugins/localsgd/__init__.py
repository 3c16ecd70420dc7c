"""A pipeline that lives outside degnn: plain local SGD, each trainer on its own share of the
training nodes, and the models averaged before every evaluation.

It shows what a new pipeline needs: this folder and one config file
(tests/plugins/conf/pipeline/localsgd.yaml, found through `hydra.searchpath`). The loop does
the rest (tests/test_plugin_pipeline.py runs it on a 2-machine cluster).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from degnn.metrics import ID_BYTES, ring_allreduce_bytes, sampling_bytes
from degnn.pipelines.base import Pipeline


class LocalSGDPipeline(Pipeline):
    name = "localsgd"
    tasks = ("node",)

    def setup(self) -> None:
        ctx, task = self.ctx, self.task
        g = ctx.graph
        self.pb = g.get_partition_book()
        task.prepare(ctx)
        self.ids = task.dist_ids(g, self.pb)
        self.build_model(g.ndata["feat"].shape[1])
        self.loader = task.dist_loader(g, self.ids, self.cfg.train.batch_size)
        self.evaluator = task.evaluator(ctx, self.model)
        self.row_bytes = g.ndata["feat"].shape[1] * 4 + ID_BYTES

    def batches_of(self, epoch: int):
        return iter(self.loader)

    def step(self, batch) -> float:
        remote = self.pb.nid2partid(batch[0]) != self.pb.partid
        self.ctx.counter.add("sampling", sampling_bytes(remote, batch[-1]))
        self.ctx.counter.add("features", int(remote.sum()) * self.row_bytes)
        with self.timer("compute"):
            loss = self.task.batch_loss(self.model, batch, self.ctx.graph.ndata["feat"])
        return self.optimize(loss)  # no DDP: each trainer keeps its own model between averages

    def evaluate(self):
        with torch.no_grad():  # the average of every trainer's model
            for t in self.model.parameters():
                dist.all_reduce(t.data)
                t.data /= self.ctx.world_size
        self.ctx.counter.add("allreduce", ring_allreduce_bytes(self.param_bytes(), self.ctx.world_size))
        return self.evaluator()
