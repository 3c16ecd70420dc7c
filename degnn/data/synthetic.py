"""Offline planted-community graphs ("synthetic-*"), written in OGB's layout and read back by ogb.

The model is a degree-corrected stochastic block model (a Chung-Lu graph with communities):
- classes are planted communities of mildly unequal size;
- every node has a power-law degree propensity theta (Pareto tail), so degrees are skewed like
  citation graphs;
- each directed edge picks its source by theta; with probability `homophily` its target is a
  node of the source's class, otherwise a node of another class, mostly one of the class's two
  "neighbouring" classes on a ring (heterophilous edges are structured, like related subject
  areas, rather than uniform noise); targets are also picked by theta;
- features are the class mean plus Gaussian noise scaled by `feat_noise`, so features alone give
  a mediocre classifier and the graph is what lifts it;
- 10% of the labels are then redrawn at random (annotation noise), which caps every model; so the
  measured label homophily is a little under cfg.homophily (about 0.41 for 0.5).

Measured with a 2-layer full-graph GraphSAGE vs a 2-layer MLP (hidden 128, 150 epochs) on
synthetic-small: MLP ~0.44 test accuracy, SAGE ~0.84.

Link task (`synthetic-tiny-link`): the same graph made undirected, with held-out validation and test
edges and 1000 fixed negatives each (linksplit.py), metric MRR; features carry the communities, so
they predict links.

Everything is seeded by cfg.seed; the folder name carries a hash of the knobs, so a changed knob
never reads a stale cache.
"""
from __future__ import annotations

import hashlib
import json
import os.path as osp
from typing import Dict, Tuple

import numpy as np

from .graph import DatasetError, GraphData, config_value, node_masks, resolve_root
from . import ogb_layout as L
from .evaluate import accuracy_evaluator, mrr_evaluator
from .linksplit import hold_out, link_knobs, undirected

# bump when the generator changes, so old caches are not mistaken for new output
GEN_VERSION = 2
# share of heterophilous edges that go to the two neighbouring classes (c-1, c+1) instead of any
NEIGHBOUR_CLASS_SHARE = 0.9
# spread of class means relative to the noise at feat_noise=1 (tuned: MLP ~45% on synthetic-small)
MEAN_SCALE = 0.15
# Pareto shape of degree propensities: a tail exponent like citation graphs' in-degrees
PARETO_SHAPE = 1.6
# share of nodes whose label is drawn at random instead of being their community: annotation
# noise as in real data; it keeps a GNN from reaching ~100% on a dense planted graph
LABEL_NOISE = 0.10
SPLIT = (0.54, 0.18, 0.28)  # arxiv's train/valid/test proportions


def _knobs(cfg) -> Dict[str, object]:
    return {
        "v": GEN_VERSION,
        "num_nodes": int(config_value(cfg, "num_nodes", 0)),
        "num_classes": int(config_value(cfg, "num_classes", 0)),
        "feat_dim": int(config_value(cfg, "feat_dim", 128)),
        "avg_degree": float(config_value(cfg, "avg_degree", 7.0)),
        "homophily": float(config_value(cfg, "homophily", 0.5)),
        "feat_noise": float(config_value(cfg, "feat_noise", 1.0)),
        "seed": int(config_value(cfg, "seed", 0)),
        # the generator's constants too, so tuning them never reads a stale cache
        "consts": [NEIGHBOUR_CLASS_SHARE, MEAN_SCALE, PARETO_SHAPE, LABEL_NOISE, list(SPLIT)],
        **({"task": "link", "link_split": link_knobs()}
           if config_value(cfg, "task", "node") == "link" else {}),
    }


def _check(name: str, k: Dict[str, object]) -> None:
    if k["num_nodes"] < 10:
        raise DatasetError(f"synthetic dataset {name}: dataset.num_nodes={k['num_nodes']}; set it to at least 10")
    if not 2 <= k["num_classes"] <= k["num_nodes"]:
        raise DatasetError(f"synthetic dataset {name}: dataset.num_classes={k['num_classes']}; "
                           f"set it between 2 and num_nodes")
    if k["feat_dim"] < 1:
        raise DatasetError(f"synthetic dataset {name}: dataset.feat_dim={k['feat_dim']}; set it to at least 1")
    if not k["avg_degree"] > 0:
        raise DatasetError(f"synthetic dataset {name}: dataset.avg_degree={k['avg_degree']}; set it above 0")
    if not 0.0 <= k["homophily"] <= 1.0:
        raise DatasetError(f"synthetic dataset {name}: dataset.homophily={k['homophily']}; set it in [0, 1]")
    if k["feat_noise"] < 0:
        raise DatasetError(f"synthetic dataset {name}: dataset.feat_noise={k['feat_noise']}; set it >= 0")


def _pick_in_range(rng, cum: np.ndarray, lo: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Positions (in class-sorted order) drawn by theta within the mass interval [lo, lo+width)."""
    u = lo + rng.random(lo.shape[0]) * width
    return np.minimum(np.searchsorted(cum, u, side="right"), cum.shape[0] - 1)


def target_positions(rng, cs: np.ndarray, homophily: float, num_classes: int, cum: np.ndarray,
                     start: np.ndarray, mass: np.ndarray, total: float) -> np.ndarray:
    """The targets (positions in class-sorted order) of edges whose sources have classes `cs`:
    with probability `homophily` a node of the source's class, else mostly one of its two
    neighbouring classes on the ring, else any other class; within the class, picked by theta.
    `cum` is the class-sorted cumulative theta mass, class c the interval [start[c], start[c]+mass[c])."""
    m = cs.shape[0]
    inside = rng.random(m) < homophily
    near = (~inside) & (rng.random(m) < NEIGHBOUR_CLASS_SHARE)
    far = ~(inside | near)
    pos = np.empty(m, dtype=np.int64)
    # same class
    pos[inside] = _pick_in_range(rng, cum, start[cs[inside]], mass[cs[inside]])
    # a neighbouring class c±1 (classes on a ring)
    cn = (cs[near] + rng.choice([-1, 1], size=int(near.sum()))) % num_classes
    pos[near] = _pick_in_range(rng, cum, start[cn], mass[cn])
    # any other class: draw from the mass outside the source's class interval
    cf = cs[far]
    u = rng.random(int(far.sum())) * (total - mass[cf])
    u = np.where(u >= start[cf], u + mass[cf], u)
    pos[far] = np.minimum(np.searchsorted(cum, u, side="right"), cum.shape[0] - 1)
    return pos


def generate(k: Dict[str, object]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Dict[str, np.ndarray]]:
    """(edges [2,E] directed, feat [N,F] float32, label [N] int64, split idx dict)."""
    n, c, f = k["num_nodes"], k["num_classes"], k["feat_dim"]
    rng = np.random.default_rng(k["seed"])

    # communities of mildly unequal size; every class gets at least one node
    sizes = rng.dirichlet(np.full(c, 4.0))
    label = rng.choice(c, size=n, p=sizes)
    label[rng.permutation(n)[:c]] = np.arange(c)
    theta = rng.pareto(PARETO_SHAPE, size=n) + 1.0

    # nodes sorted by class: each class is one contiguous interval of the cumulative theta mass
    order = np.argsort(label, kind="stable")
    cum = np.cumsum(theta[order])
    total = cum[-1]
    bounds = np.searchsorted(label[order], np.arange(c + 1))
    start = np.concatenate([[0.0], cum])[bounds[:-1]]
    mass = np.concatenate([[0.0], cum])[bounds[1:]] - start

    def sample(m: int) -> np.ndarray:
        """m directed edges as keys src*n+dst (self-loops dropped)."""
        src = order[_pick_in_range(rng, cum, np.zeros(m), np.full(m, total))]
        dst = order[target_positions(rng, label[src], k["homophily"], c, cum, start, mass, total)]
        keep = src != dst
        return src[keep].astype(np.int64) * n + dst[keep]

    # hubs make duplicates: top up until the target edge count is reached (a few rounds at most)
    target = min(int(round(n * k["avg_degree"])), n * (n - 1))
    key = np.unique(sample(int(target * 1.03) + 16))
    for _ in range(20):
        if key.shape[0] >= target:
            break
        key = np.unique(np.concatenate([key, sample(2 * (target - key.shape[0]) + 16)]))
    key = rng.permutation(key)[:target]
    key.sort()
    edges = np.stack([key // n, key % n])

    means = rng.normal(size=(c, f)) * MEAN_SCALE
    feat = (means[label] + k["feat_noise"] * rng.normal(size=(n, f))).astype(np.float32)

    perm = rng.permutation(n)
    a = int(SPLIT[0] * n)
    b = a + int(SPLIT[1] * n)
    split = {"train": perm[:a], "valid": perm[a:b], "test": perm[b:]}
    noisy = rng.random(n) < LABEL_NOISE
    label = np.where(noisy, rng.integers(0, c, size=n), label)
    return edges, feat, label.astype(np.int64), split


def dataset_dir(root: str, name: str, k: Dict[str, object]) -> str:
    h = hashlib.sha1(json.dumps(k, sort_keys=True).encode()).hexdigest()[:10]
    return osp.join(root, f"{name.replace('-', '_')}_{h}")


def load_synthetic(cfg) -> GraphData:
    name = config_value(cfg, "name")
    task = config_value(cfg, "task", "node")
    if task not in ("node", "link"):
        raise DatasetError(f"synthetic dataset {name}: dataset.task={task}; use node or link")
    k = _knobs(cfg)
    _check(name, k)
    d = dataset_dir(resolve_root(cfg), name, k)
    if task == "link":
        return _load_link(name, d, k)
    meta = lambda p: L.node_meta(p, name, k["num_classes"], "random")  # noqa: E731

    if not L.is_complete(d):
        def build(tmp):
            edges, feat, label, split = generate(k)
            L.write_raw(tmp, edges=edges, num_nodes=k["num_nodes"], feat=feat, label=label)
            L.write_node_split(tmp, "random", split)
            L.mark_release(tmp, k)
            L.read_node(name, tmp, meta(tmp))  # ogb builds processed/ inside the temp folder
        L.build_atomically(d, build)

    _, g, labels, split = L.read_node(name, d, meta(d))
    g.ndata["label"] = labels.reshape(-1)
    g.ndata.update(node_masks(g.num_nodes(), split))
    return GraphData(name=name, task="node", graph=g, num_classes=k["num_classes"], metric="acc",
                     evaluate=accuracy_evaluator(), info={"dir": d, "source": "synthetic"})


def _load_link(name: str, d: str, k: Dict[str, object]) -> GraphData:
    # edges are stored once (u<v); ogb adds the reverse copies
    meta = lambda p: L.link_meta(p, name, "random", add_inverse_edge=True)  # noqa: E731
    if not L.is_complete(d):
        def build(tmp):
            edges, feat, _, _ = generate(k)
            n = k["num_nodes"]
            train_edges, split = hold_out(undirected(edges, n), n, np.random.default_rng(k["seed"] + 1))
            L.write_raw(tmp, edges=train_edges, num_nodes=n, feat=feat)
            L.write_link_split(tmp, "random", split)
            L.mark_release(tmp, k)
            L.read_link(name, tmp, meta(tmp))  # ogb builds processed/ inside the temp folder
        L.build_atomically(d, build)
    _, g, split = L.read_link(name, d, meta(d))
    return GraphData(name=name, task="link", graph=g, num_classes=0, metric="mrr", evaluate=mrr_evaluator(),
                     link_split=split, info={"dir": d, "source": "synthetic",
                                             "num_neg": int(split["valid"]["target_node_neg"].shape[1])})
