"""Held-out edges and their fixed negatives: the link-prediction protocol of every generated graph.

OGB's ogbl-citation2 protocol (docs/background.md, "TMA"): each validation and test edge (source,
target) is ranked against `NUM_NEG` = 1000 negative targets of the same source, metric MRR.
OGB ships citation2's negatives; for the graphs degnn builds (wordnet-link, synthetic-*-link) and
for a custom link folder without `target_node_neg`, `sample_negatives` draws them once, seeded,
and they are stored with the dataset (split_dict.pt) and carried with its partitions
(partitioners/writer.py), so every pipeline and every run scores the same candidates.

Negatives are uniform over the nodes, excluding the source itself and every node it is linked to
in the whole graph (held-out edges included), as the TMA paper's Reddit split does.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

NUM_NEG = 1000
# share of the undirected edges held out for validation and for test, at most MAX_EVAL_EDGES each:
# one evaluation scores 2 x MAX_EVAL_EDGES x (1 + NUM_NEG) pairs with the MLP decoder (about
# 4 million pairs, a few seconds on a CPU); wordnet-link's 5% would be 9,189 edges per split
HOLDOUT = 0.05
MAX_EVAL_EDGES = 2000
# bump when the held-out edges or the negatives are drawn differently (part of the cache keys)
SPLIT_VERSION = 2


def link_knobs() -> Dict[str, object]:
    """What the held-out edges and negatives depend on (dataset cache keys include it)."""
    return {"v": SPLIT_VERSION, "num_neg": NUM_NEG, "holdout": HOLDOUT, "max_eval_edges": MAX_EVAL_EDGES}


def edge_keys(edges: np.ndarray, n: int) -> np.ndarray:
    """Sorted unique keys u*n+v of the edges in both directions (for membership tests)."""
    u, v = edges[0].astype(np.int64), edges[1].astype(np.int64)
    return np.unique(np.concatenate([u * n + v, v * n + u]))


def sample_negatives(src: np.ndarray, keys: np.ndarray, n: int, num_neg: int,
                     rng: np.random.Generator, max_rounds: int = 100) -> np.ndarray:
    """[len(src), num_neg] uniform targets, none equal to its source or linked to it (`keys`)."""
    src = src.astype(np.int64)
    neg = rng.integers(0, n, size=(src.shape[0], num_neg), dtype=np.int64)

    def bad(s, w):
        if not len(keys):
            return w == s
        k = s * n + w
        return (w == s) | (keys[np.minimum(np.searchsorted(keys, k), len(keys) - 1)] == k)

    rows = np.repeat(src[:, None], num_neg, axis=1)
    redo = bad(rows, neg)
    for _ in range(max_rounds):
        if not redo.any():
            break
        neg[redo] = rng.integers(0, n, size=int(redo.sum()), dtype=np.int64)
        redo[redo] = bad(rows[redo], neg[redo])
    return neg


def hold_out(edges: np.ndarray, n: int, rng: np.random.Generator, fraction: float = HOLDOUT,
             max_edges: int = MAX_EVAL_EDGES, num_neg: int = NUM_NEG) -> Tuple[np.ndarray, Dict]:
    """Split undirected edges [2, E] (u<v, unique) into training edges and OGB-style valid/test.

    Returns (training edges [2, E'], {"train": {source_node, target_node}, "valid"/"test":
    {source_node, target_node, target_node_neg [m, num_neg]}}). A held-out edge is removed from
    the training graph in both directions; its orientation (which end is the source) is random.
    """
    e = edges.shape[1]
    m = min(max_edges, max(1, int(fraction * e)))
    perm = rng.permutation(e)
    va, te, tr = perm[:m], perm[m:2 * m], np.sort(perm[2 * m:])
    keys = edge_keys(edges, n)
    split = {"train": {"source_node": edges[0, tr], "target_node": edges[1, tr]}}
    for part, idx in (("valid", va), ("test", te)):
        flip = rng.random(idx.shape[0]) < 0.5
        s = np.where(flip, edges[1, idx], edges[0, idx])
        t = np.where(flip, edges[0, idx], edges[1, idx])
        split[part] = {"source_node": s, "target_node": t,
                       "target_node_neg": sample_negatives(s, keys, n, num_neg, rng)}
    return edges[:, tr], split


def undirected(edges: np.ndarray, n: int) -> np.ndarray:
    """[2, E] edges -> unique undirected edges (u<v), self-loops dropped."""
    u, v = edges[0].astype(np.int64), edges[1].astype(np.int64)
    keep = u != v
    lo, hi = np.minimum(u, v)[keep], np.maximum(u, v)[keep]
    key = np.unique(lo * n + hi)
    return np.stack([key // n, key % n])
