"""DistDGL baseline: trainers sample through the graph servers, pull the raw features of every
sampled node from the KVStore, and synchronise gradients with DDP (one step per batch).

One batch (`batches_of` -> `step`): DGL's distributed loader samples the multi-hop
neighbourhood of the seeds (sampling RPCs to the machines that own them; the loop times it as
sampling) -> the features of all input nodes are pulled (remote rows cross the network) ->
forward/backward through the DDP wrapper -> gradient all-reduce -> Adam step.

The task decides what a batch is (degnn/tasks): node classification samples around training
nodes; link prediction (the TMA paper's synchronous baseline) takes mini-batches of training
edges with one uniform negative each and the MLP decoder, evaluated by MRR.
"""
from __future__ import annotations

from typing import Iterator, Optional

from torch.nn.parallel import DistributedDataParallel

from degnn.metrics import ID_BYTES, ring_allreduce_bytes, sampling_bytes, timed_allreduce_hook
from degnn.pipelines.base import Pipeline
from degnn.runtime.device import to_device


class DistDGLPipeline(Pipeline):
    name = "distdgl"
    tasks = ("node", "link")
    shortens_epochs = True

    def setup(self) -> None:
        ctx, cfg, task = self.ctx, self.cfg, self.task
        g = ctx.graph
        self.pb = g.get_partition_book()
        task.prepare(ctx)
        self.train_ids = task.dist_ids(g, self.pb)
        in_dim = g.ndata["feat"].shape[1]
        self.feat_row_bytes = in_dim * 4
        self.build_model(in_dim)
        # Every forward goes through the DDP wrapper: calling submodules directly would skip
        # DDP's gradient hooks silently (docs/design.md, "Pitfalls the code relies on").
        self.ddp = DistributedDataParallel(self.model)
        self.ddp.register_comm_hook(None, timed_allreduce_hook(self.timer))  # DDP's averaging, timed
        self.allreduce_bytes = ring_allreduce_bytes(self.param_bytes(), ctx.world_size)
        self.loader = task.dist_loader(g, self.train_ids, cfg.train.batch_size)
        self.evaluator = task.evaluator(ctx, self.model)
        self._batch_iter = None  # train.batches_per_epoch: the pass under way
        self.log.info("distdgl: %d train %s on this trainer, %s, %d parameters", len(self.train_ids),
                      task.unit, task.describe(), sum(p.numel() for p in self.model.parameters()))

    def batches_per_epoch(self) -> Optional[int]:
        return self.cfg.train.batches_per_epoch or -(-len(self.train_ids) // self.cfg.train.batch_size)

    def batches_of(self, epoch: int) -> Iterator:
        """One pass over the loader, or (train.batches_per_epoch=N) the next N batches of it,
        starting a new pass whenever one ends. Every rank takes the same number of steps (DDP)."""
        n = self.cfg.train.batches_per_epoch
        self.ddp.train()
        if not n:
            yield from self.loader
            return
        for _ in range(n):
            batch = None if self._batch_iter is None else next(self._batch_iter, None)
            if batch is None:  # no pass under way yet, or it ended
                self._batch_iter = iter(self.loader)
                batch = next(self._batch_iter)
            yield batch

    def step(self, batch) -> float:
        task, counter, g = self.task, self.ctx.counter, self.ctx.graph
        input_nodes, blocks = batch[0], batch[-1]
        remote = self.pb.nid2partid(input_nodes) != self.pb.partid
        counter.add("sampling", sampling_bytes(remote, blocks) + task.lookup_bytes(self.pb, batch))
        # remote feature rows: 8 bytes of id out, one feature row back
        counter.add("features", int(remote.sum()) * (self.feat_row_bytes + ID_BYTES))
        task.observe(batch)
        with self.timer("owner_wait"):  # the feature (and label) pulls from the machines that own the rows
            x, y = task.inputs(batch, g.ndata["feat"])
        batch, x, y = to_device((batch, x, y), self.device)
        with self.timer("compute"):
            loss = task.loss(self.ddp, batch, x, y)
        value = self.optimize(loss)  # DDP all-reduces the gradients in backward (timed by the hook)
        counter.add("allreduce", self.allreduce_bytes)
        return value

    def evaluate(self):
        return self.evaluator()
