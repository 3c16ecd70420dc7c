"""The planted-community generator (synthetic.py) written as a chunked graph, a block at a time.

Same model as synthetic.py (degree-corrected SBM: Pareto degree propensities theta, `homophily`
same-class edges, heterophilous edges mostly to the two neighbouring classes, features = class mean
+ noise, 10% label noise), generated so that no step holds the edge list or the feature matrix:

- per node it keeps label and theta and their cumulative mass (about 40 bytes a node: 320 MB at
  8M nodes), which every edge's endpoints are drawn from;
- edges are drawn per block of *source* nodes (contiguous ids, cut at equal theta mass): the
  block's edge count is its share of the total by theta mass, sources drawn by theta inside the
  block, targets by the same model as synthetic.py over the whole graph; duplicates are merged
  within the block, which is all of them, since no other block has these sources;
- each drawn edge is written in both directions (the graph is used as stored: see chunked.py),
  so the stored graph has about num_nodes * avg_degree directed edges. A pair drawn from both
  ends is stored twice (a multigraph; `reciprocal_share` in the metadata counts how often);
- features, labels and masks are written per block of nodes from a random stream of their own
  (seeded by the block), so the blocks do not depend on each other.

What differs from synthetic.py: the split is drawn per node (train/valid/test with probability
0.54/0.18/0.28) instead of by one permutation, so the counts vary by a few nodes; each block's edge
count is fixed by its mass instead of sampled; reverse edges are stored rather than added at load;
and the random streams differ, so a seed gives another graph than synthetic.py's.

Memory: the blocks are sized from `budget_bytes` (the per-node arrays above come on top); the
peak is measured by tests/test_chunked.py and benchmarks/chunked_scale.py (docs/benchmarks.md).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import numpy as np

from degnn.chunked import ChunkedWriter
from .synthetic import LABEL_NOISE, MEAN_SCALE, NEIGHBOUR_CLASS_SHARE, PARETO_SHAPE, SPLIT, target_positions

# bytes a drawn edge costs while its block is drawn, merged and formatted (measured: ~150)
EDGE_BYTES = 256
# bytes a feature value costs while its block is drawn (float64 noise, sum, float32 copy)
FEAT_VALUE_BYTES = 24
STREAM_VERSION = 1


def knobs(num_nodes: int, num_classes: int, feat_dim: int = 128, avg_degree: float = 20.0,
          homophily: float = 0.5, feat_noise: float = 1.0, seed: int = 0) -> Dict[str, object]:
    return {"v": STREAM_VERSION, "num_nodes": int(num_nodes), "num_classes": int(num_classes),
            "feat_dim": int(feat_dim), "avg_degree": float(avg_degree), "homophily": float(homophily),
            "feat_noise": float(feat_noise), "seed": int(seed),
            "consts": [NEIGHBOUR_CLASS_SHARE, MEAN_SCALE, PARETO_SHAPE, LABEL_NOISE, list(SPLIT)]}


def _pick(rng, cum: np.ndarray, lo, width, m: int) -> np.ndarray:
    u = lo + rng.random(m) * width
    return np.minimum(np.searchsorted(cum, u, side="right"), cum.shape[0] - 1)


def generate_chunked(k: Dict[str, object], out: Path, budget_bytes: int = 2 << 30) -> Path:
    """Write the graph of knobs `k` (see `knobs`) as a chunked graph into folder `out`."""
    n, c, f = int(k["num_nodes"]), int(k["num_classes"]), int(k["feat_dim"])
    seed = int(k["seed"])
    rng = np.random.default_rng([seed, 0])
    sizes = rng.dirichlet(np.full(c, 4.0))
    label = rng.choice(c, size=n, p=sizes).astype(np.int32)
    label[rng.permutation(n)[:c]] = np.arange(c)  # every class gets a node
    theta = rng.pareto(PARETO_SHAPE, size=n) + 1.0
    means = rng.normal(size=(c, f)) * MEAN_SCALE

    # class-sorted order: each class one interval of cumulative theta mass (targets are drawn here)
    order = np.argsort(label, kind="stable").astype(np.int64)
    cum = np.cumsum(theta[order])
    total = float(cum[-1])
    bounds = np.searchsorted(label[order], np.arange(c + 1))
    cum0 = np.concatenate([[0.0], cum])
    start, mass = cum0[bounds[:-1]], cum0[bounds[1:]] - cum0[bounds[:-1]]
    del cum0
    # id order: sources of a block are drawn here
    cum_id = np.cumsum(theta)
    del theta

    w = ChunkedWriter(out, n)
    pairs = int(round(n * float(k["avg_degree"]) / 2))
    block_edges = max(1024, int(budget_bytes // (2 * EDGE_BYTES)))
    num_blocks = max(1, -(-pairs // block_edges))
    cuts = np.searchsorted(cum_id, np.arange(1, num_blocks) * (total / num_blocks), side="right")
    cuts = np.unique(np.concatenate([[0], cuts, [n]]))
    reciprocal = 0
    homophily = float(k["homophily"])
    for b in range(len(cuts) - 1):
        a, z = int(cuts[b]), int(cuts[b + 1])
        lo = float(cum_id[a - 1]) if a else 0.0
        width = float(cum_id[z - 1]) - lo
        want = int(round(pairs * width / total))
        if want == 0:
            continue
        brng = np.random.default_rng([seed, 1, b])

        def draw(m: int) -> np.ndarray:
            src = _pick(brng, cum_id, lo, width, m)
            dst = order[target_positions(brng, label[src], homophily, c, cum, start, mass, total)]
            keep = src != dst
            return src[keep] * n + dst[keep]

        key = np.unique(draw(int(want * 1.05) + 16))
        for _ in range(20):  # hubs make duplicates: top up (a few rounds at most)
            if key.shape[0] >= want or (z - a) * (n - 1) <= key.shape[0]:
                break
            key = np.unique(np.concatenate([key, draw(2 * (want - key.shape[0]) + 16)]))
        key = np.sort(brng.permutation(key)[:want])
        src, dst = key // n, key % n
        del key
        # a pair drawn from both ends: its reverse is also one of this block's keys
        inner = (dst >= a) & (dst < z)
        reciprocal += int(np.isin(dst[inner] * n + src[inner], src[inner] * n + dst[inner]).sum())
        w.add_edges(np.concatenate([src, dst]), np.concatenate([dst, src]))
        del src, dst

    rows = max(1, int(budget_bytes // (2 * FEAT_VALUE_BYTES * max(f, 1))))
    for b, a in enumerate(range(0, n, rows)):
        z = min(n, a + rows)
        brng = np.random.default_rng([seed, 2, b])
        lab = label[a:z].astype(np.int64)
        feat = means[lab] + float(k["feat_noise"]) * brng.normal(size=(z - a, f))
        w.add_node_rows("feat", feat.astype(np.float32))
        del feat
        noisy = brng.random(z - a) < LABEL_NOISE
        w.add_node_rows("label", np.where(noisy, brng.integers(0, c, size=z - a), lab))
        u = brng.random(z - a)
        w.add_node_rows("train_mask", (u < SPLIT[0]).astype(np.uint8))
        w.add_node_rows("val_mask", ((u >= SPLIT[0]) & (u < SPLIT[0] + SPLIT[1])).astype(np.uint8))
        w.add_node_rows("test_mask", (u >= SPLIT[0] + SPLIT[1]).astype(np.uint8))
    return w.finish(str(k.get("name", "synthetic")),
                    {"generator": k, "num_classes": c, "reciprocal_share": reciprocal / max(1, pairs)})


def main() -> None:
    """`python -m degnn.data.synthetic_stream OUT '{"num_nodes": ..., ...}' [BUDGET_MB]`: what the
    measurements and the memory test run, in a process of their own."""
    import sys

    out, spec = Path(sys.argv[1]), json.loads(sys.argv[2])
    budget = int(float(sys.argv[3]) * (1 << 20)) if len(sys.argv) > 3 else 2 << 30
    print(generate_chunked(knobs(**spec), out, budget))


if __name__ == "__main__":
    main()
