"""Whole-graph evaluation on a DistGraph, for the pipelines whose trainers meet in collectives.

Layer-wise, full-neighbour inference as DistDGL does it: for each layer, every trainer computes
that layer's output for its share of all nodes and writes it into a DistTensor; after a barrier
the next layer reads those rows (`inference`). Then the task scores the last layer: node task,
rank 0 scores the validation and test predictions with the dataset's evaluator (OGB's
`Evaluator`); link task, every trainer scores its share of the held-out edges against their
negatives with the model's decoder and rank 0 averages the reciprocal ranks of all.

With train.eval_fanouts (node task) there is no whole-graph pass: each trainer predicts its share
of the validation and test nodes (train.eval_max_nodes of each at most) in batches, each by a
computation graph sampled with those fan-outs as in training (`predict`), and holds only the batch.
"""
from __future__ import annotations

from typing import Optional, Tuple

import dgl
import torch
import torch.distributed as dist

from degnn.compat import DistNodeDataLoader, MultiLayerFullNeighborSampler, NeighborSampler
from degnn.runtime.device import DeviceMover


def remote_rows(pb, nids: torch.Tensor) -> int:
    """How many of `nids` live on another machine (their reads cross the network)."""
    return int((pb.nid2partid(nids) != pb.partid).sum())


HIDDEN_DTYPES = {"float32": torch.float32, "float16": torch.float16}  # train.eval_hidden_dtype


def unfilled(shape, dtype) -> torch.Tensor:
    """A DistTensor's initial rows as DGL's server copies them into shared memory: left unwritten
    (an inference writes every node's row of a layer before any is read; a large fresh allocation
    is not even resident until then). DGL's default fills a heap tensor with zeros first, so a
    server briefly held each layer's share twice: 0.5 GiB more on bench=scale's 4M graph, enough to
    exceed a 3 GiB machine. (Module-level: DGL pickles it to the servers.)"""
    return torch.empty(shape, dtype=dtype)


def gather_to_rank0(ctx, obj) -> list:
    """Every trainer's `obj`, on rank 0 (None elsewhere)."""
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered if ctx.is_rank0 else None


class DistEvaluator:
    """`evaluator()` -> (validation, test) metric of `model` on the whole DistGraph, identical on
    every rank; `inference()` -> every layer's output for every node, in DistTensors that exist
    until `release()` (the evaluator's own call releases them)."""

    def __init__(self, ctx, model, task):
        g = ctx.graph
        self.ctx, self.g, self.model, self.task = ctx, g, model, task
        self.mover = DeviceMover.of(ctx.cfg.model.backend, ctx.device)  # a batch's block and rows to the model
        self.pb = g.get_partition_book()
        self.batch_size = ctx.cfg.train.eval_batch_size
        self.feat_bytes = g.ndata["feat"].shape[1] * 4  # a float32 input row, as counted
        self.evaluate_fn = task.evaluate_fn()
        n = g.num_nodes()
        self.all_nids = dgl.distributed.node_split(torch.ones(n, dtype=torch.bool), self.pb, force_even=True)
        self.score = task.scorer(ctx)
        self.dims = list(task.out_dims())
        # train.eval_fanouts: the validation and test nodes only, by sampled computation graphs
        self.fanouts = list(ctx.cfg.train.get("eval_fanouts") or [])
        if self.fanouts and not hasattr(self.score, "sampled"):
            raise ValueError(f"train.eval_fanouts={self.fanouts}: a sampled evaluation scores node tasks "
                             f"only; remove it for the {task.name} task")
        self.hidden_dtype = HIDDEN_DTYPES.get(str(ctx.cfg.train.eval_hidden_dtype))
        if self.hidden_dtype is None:
            raise ValueError(f"train.eval_hidden_dtype={ctx.cfg.train.eval_hidden_dtype} is not one of "
                             f"{', '.join(HIDDEN_DTYPES)}")
        # each layer's DistTensor while an inference needs it (None when not allocated): created by
        # `inference`, deleted by `release`
        self.outputs: list = [None] * len(self.dims)

    def _allocate(self, i: int) -> None:
        """Layer i's DistTensor on the graph servers (collective)."""
        dtype = self.hidden_dtype if i < len(self.dims) - 1 else torch.float32
        self.outputs[i] = dgl.distributed.DistTensor(
            (self.g.num_nodes(), self.dims[i]), dtype, name=f"degnn_eval_h{i}",
            part_policy=self.g.get_node_partition_policy("_N"), init_func=unfilled, persistent=True)

    def _delete(self, i: int) -> None:
        """Layer i's DistTensor deleted from the graph servers (collective; DGL's own deletion,
        what DistTensor.__del__ does for a non-persistent one)."""
        t, self.outputs[i] = self.outputs[i], None
        if t is not None:
            t.kvstore.delete_data(t._name)

    def release(self) -> None:
        """Delete every output's DistTensor (collective). Kept between evaluations they would hold
        every layer's rows for every node while the pipeline trains: 0.5 GiB of a machine's shared
        memory a hidden layer on bench=scale's 4M graph (128 floats a node)."""
        for i in range(len(self.outputs)):
            self._delete(i)

    @torch.no_grad()
    def inference(self, layers: Optional[int] = None, keep: bool = True) -> list:
        """Every layer's output for every node (one DistTensor a layer, input layer first), from
        one layer-wise whole-graph pass; every trainer calls it (collective). layers: only the
        first that many are computed and allocated (the others stay None). keep=False deletes each
        layer's tensor once the next one is computed (a machine holds two layers' shares at most;
        only the last one is returned)."""
        x = self.g.ndata["feat"]
        self.model.eval()
        sampler = MultiLayerFullNeighborSampler(1)
        for i in range(len(self.dims) if layers is None else layers):
            if self.outputs[i] is None:
                self._allocate(i)
            out = self.outputs[i]
            loader = DistNodeDataLoader(self.g, self.all_nids, sampler, batch_size=self.batch_size,
                                        shuffle=False, drop_last=False)
            row_bytes = (self.feat_bytes if i == 0 else x.shape[1] * x.dtype.itemsize)
            for input_nodes, output_nodes, blocks in loader:
                self.ctx.counter.add("eval", remote_rows(self.pb, input_nodes) * row_bytes)
                h = self.model.layer_forward(i, *self.mover((blocks[0], x[input_nodes].float())))
                out[output_nodes] = h.to(out.dtype).cpu()  # the tables live on the graph servers
                self.ctx.heartbeat.beat()
            self.g.barrier()
            if not keep and i > 0:
                self._delete(i - 1)
            x = out
        self.model.train()
        return self.outputs

    @torch.no_grad()
    def predict(self, nids: torch.Tensor) -> torch.Tensor:
        """The model's outputs for `nids` (this trainer's share of a split), in that order, each
        batch's nodes by a computation graph sampled with train.eval_fanouts (as in training):
        nothing held but the batch. A sampled estimate of what the full-neighbour inference gives."""
        x = self.g.ndata["feat"]
        self.model.eval()
        loader = DistNodeDataLoader(self.g, nids, NeighborSampler(self.fanouts), batch_size=self.batch_size,
                                    shuffle=False, drop_last=False)
        out = []
        for input_nodes, _, blocks in loader:
            self.ctx.counter.add("eval", remote_rows(self.pb, input_nodes) * self.feat_bytes)
            out.append(self.model(*self.mover((blocks, x[input_nodes].float()))).cpu())
            self.ctx.heartbeat.beat()
        self.model.train()
        return torch.cat(out) if out else torch.empty(0, self.dims[-1])

    def __call__(self) -> Tuple[float, float]:
        if self.fanouts:
            val, test = self.score.sampled(self.predict, self.evaluate_fn)
        else:
            val, test = self.score(self.inference(keep=False)[-1], self.model, self.evaluate_fn)
            self.release()
        box = [val, test]
        dist.broadcast_object_list(box, src=0)
        return box[0], box[1]
