"""TMA's evaluation of the averaged model, split over the live trainers; and LLCG's correction.

The paper's code evaluates every averaged model in one server process that holds the whole graph
(docs/background.md, "TMA"). Here no process holds it: the evaluation is layer-wise full-neighbour
inference on the DistGraph, as DistDGL evaluates, with every live trainer computing a share of the
nodes and writing each layer's output into a DistTensor, then scoring a share of the validation and
test set (docs/design.md, "TMA's evaluation"). Unlike degnn/tasks/evaluation.py's DistEvaluator
there is no collective, which would hang on a dead peer: the coordinator (service.py) hands out
the units one at a time and gives a dead trainer's units to a live one.

* `SharedEvaluation`: the plan (every partition's nodes cut into `UNITS_PER_PART` contiguous
  units; the phases are the layers and then the scoring), the layer outputs' DistTensors (made by
  every trainer together at set-up, the only moment every trainer is known to be alive: DGL's
  DistTensor creation is a barrier) and one unit's work. A layer unit samples its nodes' in-edges
  through the graph servers (`dgl.distributed.sample_neighbors(fanout=-1)`), pulls the previous
  layer's rows (the features for the first) and writes its output rows; a scoring unit asks the
  task for its metric sums (node task: accuracy times the unit's validation and test nodes;
  link task: the reciprocal ranks of a share of the held-out edges). Traffic is counted under
  `eval`.
* `Corrector` (LLCG) keeps its own model and Adam state across rounds and samples the whole
  graph's training nodes (link task: every edge) through the DistGraph with DistNodeDataLoader
  (DistEdgeDataLoader), like the distdgl baseline; its traffic is counted under `correction`.
"""
from __future__ import annotations

from typing import Callable, Dict, List

import dgl
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from degnn.metrics import ID_BYTES, sampling_bytes
from degnn.tasks.evaluation import unfilled

# units of every phase per partition: a dead trainer's share is spread over this many hand-outs
UNITS_PER_PART = 4


def tensor_name(layer: int) -> str:
    return f"tma_eval_h{layer}"


class SharedEvaluation:
    """One trainer's side of the evaluation: the plan, the layer outputs, one unit's work."""

    def __init__(self, g, task, counter, batch_size: int, mover, units_per_part: int = UNITS_PER_PART,
                 hidden_dtype: torch.dtype = torch.float32):
        self.g, self.task, self.counter, self.batch_size = g, task, counter, batch_size
        self.mover = mover  # a unit's blocks and input rows to the model's device
        self.pb = pb = g.get_partition_book()
        sizes = [int(m["num_nodes"]) for m in pb.metadata()]
        self.ranges: List[tuple] = []  # unit -> (first node, end), node ids of one partition
        self.homes: List[int] = []  # unit -> its partition (= the rank of the trainer there)
        lo = 0
        for part, n in enumerate(sizes):
            for k in range(units_per_part):
                self.ranges.append((lo + k * n // units_per_part, lo + (k + 1) * n // units_per_part))
                self.homes.append(part)
            lo += n
        policy = g.get_node_partition_policy("_N")
        # kept for the whole run (creating one is a barrier, safe only here, with every trainer
        # alive); unwritten at first: a phase writes every node's row before the next reads any.
        # Hidden layers in train.eval_hidden_dtype (float16 halves them: 0.25 GiB a machine on
        # bench=scale's 8M graph), the top layer's outputs in float32
        dims = list(task.out_dims())
        self.outputs = [dgl.distributed.DistTensor((g.num_nodes(), d), hidden_dtype if i < len(dims) - 1 else torch.float32,
                                                   name=tensor_name(i), part_policy=policy, init_func=unfilled,
                                                   persistent=True)
                        for i, d in enumerate(dims)]
        self.layers = len(self.outputs)
        self.phases = self.layers + 1  # the layers, then the scoring

    def plan(self) -> dict:
        return {"homes": self.homes, "phases": self.phases}

    def nodes(self, unit: int) -> torch.Tensor:
        return torch.arange(*self.ranges[unit])

    @torch.no_grad()
    def layer(self, model, i: int, unit: int, beat: Callable[[], bool],
              after_write: Callable[[], None] = lambda: None) -> bool:
        """Layer i's output for the unit's nodes into its DistTensor; False when `beat` says the
        unit went to another trainer (nothing more is written)."""
        g, pb = self.g, self.pb
        x = g.ndata["feat"] if i == 0 else self.outputs[i - 1]
        row = x.shape[1] * torch.empty(0, dtype=x.dtype).element_size()
        nodes = self.nodes(unit)
        remote_home = self.homes[unit] != pb.partid
        out = self.outputs[i]
        out_row = out.shape[1] * torch.empty(0, dtype=out.dtype).element_size()
        for seeds in torch.split(nodes, self.batch_size):
            block = dgl.to_block(dgl.distributed.sample_neighbors(g, seeds, -1), seeds)
            inputs = block.srcdata[dgl.NID]
            remote = pb.nid2partid(inputs) != pb.partid
            h = model.layer_forward(i, *self.mover((block, x[inputs].float())))
            if not beat():
                return False
            out[seeds] = h.to(out.dtype).cpu()  # the table lives on the graph servers
            self.counter.add("eval", sampling_bytes(remote, [block]) + int(remote.sum()) * (ID_BYTES + row)
                             + (len(seeds) * (ID_BYTES + out_row) if remote_home else 0))
            after_write()
        if remote_home and len(nodes):
            # a push to another machine's server is one-way: reading a row back from that server
            # makes sure it has stored every row before the unit is reported done
            self.outputs[i][nodes[:1]]
            self.counter.add("eval", ID_BYTES + out_row)
        return True

    @torch.no_grad()
    def score(self, model, unit: int) -> Dict[str, list]:
        """The unit's metric sums: {"val": [sum, count], "test": [sum, count]}."""
        return self.task.score_share(self.outputs[-1], self.nodes(unit), unit, len(self.homes), model,
                                     self.counter)


class Corrector:
    """LLCG's server correction: Adam steps on mini-batches sampled from the whole graph (node task:
    its train nodes; link task: every edge, one uniform negative each), through the DistGraph."""

    def __init__(self, g, cfg, in_dim: int, task, counter):
        self.g, self.counter, self.task = g, counter, task
        self.pb = g.get_partition_book()
        self.model = task.build_model(in_dim)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.loader = task.dist_loader(g, task.all_train_ids(g, counter, "correction"), cfg.train.batch_size)
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
