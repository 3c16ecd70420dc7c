"""Metric functions built on OGB's own Evaluator, so numbers match the leaderboard's definitions."""
from __future__ import annotations

from typing import Callable

import torch


def accuracy_evaluator(ogb_name: str = "ogbn-arxiv") -> Callable[[torch.Tensor, torch.Tensor], float]:
    """(labels [n], predicted classes [n]) -> accuracy.

    For our own datasets (synthetic, wordnet, custom) we reuse Evaluator('ogbn-arxiv'): for a
    1-task 'acc' dataset it is plain multiclass accuracy over [n,1] tensors, nothing arxiv-specific.
    """
    from ogb.nodeproppred import Evaluator

    ev = Evaluator(ogb_name)

    def evaluate(y_true: torch.Tensor, y_pred: torch.Tensor) -> float:
        y_true = torch.as_tensor(y_true).detach().cpu().reshape(-1, 1)
        y_pred = torch.as_tensor(y_pred).detach().cpu().reshape(-1, 1)
        if y_true.numel() == 0:
            return 0.0
        return float(ev.eval({"y_true": y_true, "y_pred": y_pred})["acc"])

    return evaluate


def mrr_evaluator() -> Callable[[torch.Tensor, torch.Tensor], float]:
    """(scores of the true edges [n], scores of their negatives [n, k]) -> MRR.

    Evaluator('ogbl-citation2') ranks each positive among its own k negatives and averages the
    optimistic and pessimistic ranks (ties count half); it accepts any k, so it serves wordnet-link
    (k=100) as well as citation2 (k=1000). For link tasks `evaluate(y_pred_pos, y_pred_neg)`.
    """
    from ogb.linkproppred import Evaluator

    ev = Evaluator("ogbl-citation2")

    def evaluate(y_pred_pos: torch.Tensor, y_pred_neg: torch.Tensor) -> float:
        pos = torch.as_tensor(y_pred_pos).detach().cpu().reshape(-1).float()
        neg = torch.as_tensor(y_pred_neg).detach().cpu().float()
        if neg.dim() == 1:
            neg = neg.reshape(pos.shape[0], -1)
        if pos.numel() == 0:
            return 0.0
        return float(ev.eval({"y_pred_pos": pos, "y_pred_neg": neg})["mrr_list"].mean())

    return evaluate
