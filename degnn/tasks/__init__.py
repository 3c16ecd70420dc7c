"""The learning task of a run as an object, chosen once from `dataset.task`.

A pipeline never asks which task it trains: it asks the task. A task knows its supervision ids
(training nodes, or training edges), its loaders (on the DistGraph, or on a plain local graph),
its batches' inputs and loss, its model (a GNN with a class head, or a GNN encoder with a link
decoder), its evaluation (the evaluator's metric on validation and test) and what it adds to the
run summary.

A pipeline that trains on its machine's own nodes only, with batches it builds itself (LAMP),
asks the task for its share of supervision ids there (`own_ids`), the targets it reads locally
(`own_labels`), a batch's seeds and targets (`own_batch`), the part of the model that computes
node representations layer by layer (`encoder`) and the loss from the seeds' top-layer rows
(`seed_loss`).

- `node.NodeTask`: node classification, accuracy (OGB's Evaluator for OGB data).
- `link.LinkTask`: link prediction, MRR of each held-out edge against its fixed negatives.
"""
from __future__ import annotations

from .base import OwnIds, Task

__all__ = ["OwnIds", "Task", "task_of"]


def task_of(cfg) -> Task:
    """The task of `cfg.dataset.task` (ValueError for another)."""
    name = cfg.dataset.task
    if name == "node":
        from degnn.tasks.node import NodeTask

        return NodeTask(cfg)
    if name == "link":
        from degnn.tasks.link import LinkTask

        return LinkTask(cfg)
    raise ValueError(f"dataset {cfg.dataset.name}: dataset.task={name!r}: choose node or link")
