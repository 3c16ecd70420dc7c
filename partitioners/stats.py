"""Partition statistics (stats.json) computed from the graph and a node assignment.

Everything is computed from the original graph and ``part[i]`` alone, so the same function
describes our partitions and DGL's own (`benchmarks/partition_bench.py`).

* per part: ``nodes`` (owned / inner nodes), ``edges`` (inner edges: DGL gives an edge to the part
  of its destination), ``train_nodes``, ``halo_nodes`` (1-hop: distinct sources of inner edges
  owned by another part, exactly the HALO nodes of DGL's part graph with ``num_hops=1``),
  ``label_tv`` (see below).
* ``edge_cut_fraction``: edges whose endpoints lie in different parts / all edges. 1 minus it is
  the fraction of edges a TMA trainer keeps (induced subgraphs drop cut edges).
* ``label_tv``: the TMA paper's "data uniformity": the total variation distance
  ``0.5 * sum_c |p_part(c) - p_graph(c)|`` between a part's label histogram and the whole graph's,
  over the **training nodes** (``label_tv_over: "train"``); over all labelled nodes
  (``"labelled"``) when the graph has no train_mask; null without single-label integer labels.
  ``label_tv_mean`` / ``label_tv_max`` summarise the parts.
* ``graph_digest`` / ``assignment_digest``: short hashes of the graph (its edges, training nodes and
  labels) and of ``part``. Two runs whose bytes per batch differ say by these whether they ran on
  the same data and the same partition (a dataset or partition rebuilt on another machine, with
  other library versions, need not be the same; the launcher copies both into every summary).
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional

import numpy as np


def _labels(g):
    """(label vector int64, mask of nodes whose label counts, 'train'|'labelled') or None."""
    if "label" not in g.ndata:
        return None
    y = g.ndata["label"]
    if y.dim() > 1:
        if y.dim() == 2 and y.shape[1] == 1:
            y = y[:, 0]
        else:
            return None  # multi-label: no single histogram
    if y.is_floating_point():
        ok = ~y.isnan()
        y = y.nan_to_num(-1)
    else:
        ok = None
    y = y.long().numpy()
    valid = y >= 0
    if ok is not None:
        valid &= ok.numpy()
    over = "labelled"
    if "train_mask" in g.ndata:
        tm = g.ndata["train_mask"].reshape(-1).numpy().astype(bool)
        if tm.any():
            valid &= tm
            over = "train"
    return y, valid, over


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    return float(0.5 * np.abs(p - q).sum())


def digest(*arrays) -> str:
    """A short hash of the arrays' values (as int64: the same on every machine and dtype)."""
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a).astype(np.int64, copy=False))
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def graph_digest(g, src: np.ndarray, dst: np.ndarray) -> str:
    """The graph as the partitioner saw it: its edges in order, its training nodes and labels."""
    extra = []
    for key in ("train_mask", "label"):
        if key in g.ndata:
            extra.append(np.nan_to_num(g.ndata[key].numpy().astype(np.float64), nan=-1).astype(np.int64))
    return digest(src, dst, *extra)


def partition_stats(g, part: np.ndarray, num_parts: int, halo=None) -> Dict[str, object]:
    """Statistics of assignment `part` (int per original node) of graph g into num_parts parts.

    `halo`: the per-part HALO node counts when the caller already has them (the writer does)."""
    part = np.asarray(part, dtype=np.int64)
    n = g.num_nodes()
    src, dst = g.edges()
    src = src.numpy().astype(np.int64)
    dst = dst.numpy().astype(np.int64)
    ps, pd = part[src], part[dst]
    cut = ps != pd
    nodes = np.bincount(part, minlength=num_parts)
    edges = np.bincount(pd, minlength=num_parts)
    if "train_mask" in g.ndata:
        tm = g.ndata["train_mask"].reshape(-1).numpy().astype(bool)
        train = np.bincount(part[tm], minlength=num_parts)
    else:
        train = np.zeros(num_parts, dtype=np.int64)
    if halo is None:
        # halo of part p: distinct sources (owned elsewhere) of edges whose destination p owns
        halo = np.zeros(num_parts, dtype=np.int64)
        cs, cd = src[cut], pd[cut]
        mark = np.zeros(n, dtype=bool)
        for p in range(num_parts):
            mark[:] = False
            mark[cs[cd == p]] = True
            halo[p] = int(mark.sum())
    halo = np.asarray(halo, dtype=np.int64)

    tv: List[Optional[float]] = [None] * num_parts
    over = None
    lab = _labels(g)
    if lab is not None:
        y, valid, over = lab
        if valid.any():
            c = int(y[valid].max()) + 1
            whole = np.bincount(y[valid], minlength=c).astype(np.float64)
            whole /= whole.sum()
            for p in range(num_parts):
                sel = valid & (part == p)
                if sel.any():
                    h = np.bincount(y[sel], minlength=c).astype(np.float64)
                    tv[p] = total_variation(h / h.sum(), whole)
    tvs = [t for t in tv if t is not None]
    parts = [
        {
            "part": p,
            "nodes": int(nodes[p]),
            "edges": int(edges[p]),
            "train_nodes": int(train[p]),
            "halo_nodes": int(halo[p]),
            "label_tv": tv[p],
        }
        for p in range(num_parts)
    ]
    m = len(src)
    return {
        "num_nodes": int(n),
        "num_edges": int(m),
        "num_parts": int(num_parts),
        "edge_cut": int(cut.sum()),
        "edge_cut_fraction": float(cut.mean()) if m else 0.0,
        "node_imbalance": float(nodes.max() / max(nodes.mean(), 1e-12)),
        "edge_imbalance": float(edges.max() / max(edges.mean(), 1e-12)),
        "halo_nodes_total": int(halo.sum()),
        "label_tv_over": over,
        "label_tv_mean": float(np.mean(tvs)) if tvs else None,
        "label_tv_max": float(np.max(tvs)) if tvs else None,
        "graph_digest": graph_digest(g, src, dst),
        "assignment_digest": digest(part),
        "parts": parts,
    }


def format_table(stats: Dict[str, object]) -> str:
    """stats.json as a plain-text table (what the CLI prints)."""
    head = (
        f"{stats.get('graph_name', '?')}: method={stats.get('method')} K={stats['num_parts']} "
        f"seed={stats.get('seed')} nodes={stats['num_nodes']} edges={stats['num_edges']} "
        f"time={stats.get('wall_time_s', float('nan')):.2f}s"
    )
    cols = ["part", "nodes", "edges", "train_nodes", "halo_nodes", "label_tv"]
    rows = []
    for p in stats["parts"]:
        rows.append(
            [str(p[c]) if c != "label_tv" else ("-" if p[c] is None else f"{p[c]:.4f}") for c in cols]
        )
    width = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, width))
    out = [head, line(cols), line(["-" * w for w in width])] + [line(r) for r in rows]
    tvm = stats.get("label_tv_mean")
    out.append(
        f"edge cut fraction {stats['edge_cut_fraction']:.4f}   "
        f"label TV mean ({stats.get('label_tv_over')}) "
        + ("-" if tvm is None else f"{tvm:.4f}")
        + f"   node imbalance {stats['node_imbalance']:.3f}   edge imbalance {stats['edge_imbalance']:.3f}"
    )
    return "\n".join(out)
