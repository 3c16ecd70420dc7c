"""What every task provides (`Task`, the interface node.NodeTask and link.LinkTask implement) and
a trainer's share of supervision ids (`OwnIds`); degnn/tasks/__init__.py says what a task is."""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch



class OwnIds(NamedTuple):
    """A trainer's supervision ids among its machine's own nodes (`Task.own_ids`)."""
    # local ids of the machine's partition (DistGraph.local_partition), one supervision id per
    # position of the last dimension: [n] training nodes, or [2, n] (src, dst) training edges
    ids: torch.Tensor
    # how many of the partition's supervision ids this trainer's share was taken from (the
    # machine's candidates over its trainers), None when the task drops none
    pool: Optional[float] = None


class Task:
    """What every task provides (see node.NodeTask and link.LinkTask)."""

    name = ""
    metric = ""
    unit = ""  # what a supervision id is: "nodes" or "edges"

    def __init__(self, cfg):
        self.cfg = cfg

    # --- the data ---------------------------------------------------------------------------
    def prepare(self, ctx, collective: bool = True) -> None:
        """Read what the task needs from the run once (classes, the held-out edges).
        `collective=False`: without torch.distributed (a pipeline that survives dead trainers)."""

    def dist_ids(self, g, pb) -> torch.Tensor:
        """This trainer's share of the supervision ids of the DistGraph."""
        raise NotImplementedError

    def dist_loader(self, g, ids: torch.Tensor, batch_size: int):
        raise NotImplementedError

    def local_ids(self, graph, owned: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Supervision ids of a plain local graph (`owned`: the node data read for it)."""
        raise NotImplementedError

    def local_loader(self, graph, ids: torch.Tensor, batch_size: int):
        raise NotImplementedError

    def local_labels(self, graph) -> Optional[torch.Tensor]:
        """The targets of a local graph's batches by node (the `label` argument of `inputs` and
        `batch_loss`), as `local_ids` stored them; None when the batches hold their targets."""
        return None

    def all_train_ids(self, g, counter, category: str) -> torch.Tensor:
        """Supervision ids of the whole DistGraph, read without a collective (LLCG's correction;
        remote reads counted under `category`)."""
        raise NotImplementedError

    def score_share(self, h, nids: torch.Tensor, share: int, shares: int, model, counter) -> Dict[str, list]:
        """Metric sums of one share of the validation and test set, from the last layer `h` (a
        DistTensor of every node): {"val": [sum, count], "test": [sum, count]}, where the metric
        is sum / count over all shares together. Node task: the validation and test nodes among
        `nids`; link task: share `share` of `shares` of the held-out edges. Remote reads are
        counted under `eval`."""
        raise NotImplementedError

    def node_fields(self) -> List[str]:
        """The node data a trainer needs besides the features."""
        return []

    def partition_fields(self) -> List[str]:
        """The node data every partition must hold (checked when the DistGraph is up)."""
        return ["feat"]

    # --- one batch --------------------------------------------------------------------------
    def inputs(self, batch, feat, label=None):
        """(x, y): the batch's input features, and its targets (None when the batch holds them)."""
        raise NotImplementedError

    def loss(self, model, batch, x, y) -> torch.Tensor:
        raise NotImplementedError

    def batch_loss(self, model, batch, feat, label=None, move=None) -> torch.Tensor:
        """The loss of a batch of a local graph; the batch and its inputs moved by `move` (a
        degnn.runtime.device.DeviceMover) first."""
        batch, x, y = (batch, *self.inputs(batch, feat, label))
        if move is not None:
            batch, x, y = move((batch, x, y))
        return self.loss(model, batch, x, y)

    # --- batches of the machine's own nodes (LAMP) ----------------------------------------------
    def own_ids(self, g, pb, trainer: int, trainers: int) -> OwnIds:
        """This trainer's supervision ids among those whose nodes its machine owns, in the local
        ids of the machine's partition (`trainer` of the machine's `trainers`); every position of
        the last dimension is one id (a batch is a slice along it)."""
        raise NotImplementedError

    def own_labels(self, g, pb, own: torch.Tensor) -> Optional[torch.Tensor]:
        """The targets of the machine's own nodes `own` (global ids, in local-id order), by local
        id, read once at set-up: a batch's targets then need no DGL RPC. None: the task has none."""
        return None

    def own_batch(self, ids: torch.Tensor, owned: torch.Tensor,
                  labels: Optional[torch.Tensor]) -> Tuple[torch.Tensor, object]:
        """(seeds, target) of a batch of `own_ids` (`ids`, a slice): the unique local ids whose
        top-layer rows the model computes, and what `seed_loss` compares those rows with.
        `owned`: the local ids of every node the machine owns; `labels`: `own_labels`."""
        raise NotImplementedError

    def seed_loss(self, model, h: torch.Tensor, target) -> torch.Tensor:
        """The loss of a batch from the top-layer rows `h` of its seeds (`own_batch`'s order).
        Called inside the pipeline's DDP forward: every parameter it uses (a decoder) is then
        one DDP knows was used."""
        raise NotImplementedError

    def encoder(self, model) -> torch.nn.Module:
        """The part of `model` that computes node representations layer by layer (what LAMP's
        owners replicate): the model itself, unless the task puts a head on top of it."""
        return model

    def lookup_bytes(self, pb, batch) -> int:
        """Bytes of a DistGraph batch's lookups besides sampling and features (0 for nodes)."""
        return 0

    def observe(self, batch) -> None:
        """Called with every training batch (a task may measure something on the first)."""

    # --- the model and its evaluation ----------------------------------------------------------
    def build_model(self, in_dim: int) -> torch.nn.Module:
        raise NotImplementedError

    def out_dims(self) -> List[int]:
        """Output width of every layer (the layer-wise evaluator's tables)."""
        raise NotImplementedError

    def scorer(self, ctx):
        """(logits or embeddings of every node, model, evaluate_fn) -> (validation, test); a
        collective: rank 0 gets the numbers."""
        raise NotImplementedError

    def evaluate_fn(self):
        """The dataset's metric (degnn/data/evaluate.py: OGB's Evaluator)."""
        raise NotImplementedError

    def evaluator(self, ctx, model):
        """A DistEvaluator of `model` (collectives: every trainer calls it together)."""
        from degnn.tasks.evaluation import DistEvaluator

        return DistEvaluator(ctx, model, self)

    def describe(self) -> str:
        return self.metric

    def summary(self) -> dict:
        return {}
