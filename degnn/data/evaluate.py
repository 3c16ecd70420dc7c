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


def reciprocal_ranks(y_pred_pos: torch.Tensor, y_pred_neg: torch.Tensor) -> torch.Tensor:
    """Evaluator('ogbl-citation2')'s per-edge reciprocal ranks [n] of the true edges' scores [n]
    among their own negatives' scores [n, k]; their mean is the MRR.

    OGB ranks each positive among its k negatives at the mean of the optimistic and pessimistic
    ranks (ties count half) and accepts any k. Pipelines that score edges on several trainers
    gather these lists, so the mean is OGB's MRR over all edges."""
    from ogb.linkproppred import Evaluator

    pos = torch.as_tensor(y_pred_pos).detach().cpu().reshape(-1).float()
    neg = torch.as_tensor(y_pred_neg).detach().cpu().float()
    if neg.dim() == 1:
        neg = neg.reshape(pos.shape[0], -1)
    if pos.numel() == 0:
        return torch.zeros(0)
    return torch.as_tensor(Evaluator("ogbl-citation2").eval({"y_pred_pos": pos, "y_pred_neg": neg})["mrr_list"])


def mrr_evaluator() -> Callable[[torch.Tensor, torch.Tensor], float]:
    """(scores of the true edges [n], scores of their negatives [n, k]) -> MRR (OGB's Evaluator
    for ogbl-citation2, whatever the dataset: reciprocal_ranks). `evaluate(y_pred_pos, y_pred_neg)`."""

    def evaluate(y_pred_pos: torch.Tensor, y_pred_neg: torch.Tensor) -> float:
        rr = reciprocal_ranks(y_pred_pos, y_pred_neg)
        return float(rr.mean()) if rr.numel() else 0.0

    return evaluate
