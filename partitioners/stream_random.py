"""Random partitioning of a chunked graph (degnn.chunked) in passes, within a memory budget.

It writes what partitioners.writer writes for an in-memory graph cut by the same random assignment
(assign.random_assignment: the same seed gives the same parts): DGL's partition format with each
part's 1-hop halo, the node and edge maps, the node data, the JSON, stats.json with the same
statistics, under the same folder protocol (folder.temp_folder / folder.install: nothing at `out`
looks complete after an interruption). It never holds the edge list or the feature matrix:

1. per node it keeps the part, the new id, and one "is a halo node of part p" flag per part:
   (16 + K) bytes a node (8 parts of 8M nodes: 190 MB);
2. one pass over the edge chunks, a block at a time: counts, halo flags, the digest, and each edge
   spilled to a file of its destination's part (the part's inner edges, in order: their new ids
   are that order) and, when cut, of its source's part (the part's outgoing halo edges);
3. per part: its spills read back into its graph (inner nodes, then halo nodes; inner edges, then
   outgoing ones, as DGL's partition_graph_with_halo orders them), saved with DGL's save_graphs and
   as the CSC arrays degnn's servers map (partitioners/stream_part.py: 34 bytes an edge of the part
   and 48 a node of it, its halo's included), while of the per-node state only the part stays;
4. one pass over each node data field, rows appended to every part's node_feat.dgl.

Step 3 holds one part's graph (its server later holds it in shared memory); the budget check
before it says which part does not fit. Within a part, nodes keep their original order (DGL's own
sort is not stable, so new ids within a part differ from partition_graph's; the parts, halos and
counts are the same). orig_eids (new edge id -> original) is written as orig_eids.npy, not .pt, so that it is
never held whole; nothing in degnn reads it.
"""
from __future__ import annotations

import hashlib
import json
import resource
import shutil
import time
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np

from .assign import PartitionError, random_assignment
from .folder import STATS, check_out, folder_lock, install, temp_folder, validate
from .stream_part import block_edges, part_bytes, write_part
from degnn.tensor_dict import TensorDictWriter, write_empty

DEFAULT_BUDGET = 2 << 30
# bytes an edge costs in an edge pass (csv parse, src/dst, parts, ranks, spill columns)
PASS_EDGE_BYTES = 200
# the node data a node task reads and the dtype each is stored in (degnn.data.graph.finalize)
FIELDS = {"feat": np.float32, "label": np.int64, "train_mask": np.bool_, "val_mask": np.bool_,
          "test_mask": np.bool_}
NTYPE, ETYPE = "_N", "_N:_E:_N"


def node_state(n: int, k: int) -> int:
    """Bytes the partitioner keeps a node of the graph: its part, its new id, a halo flag per part
    and the assignment's own temporaries."""
    return n * (16 + k + 8)


def _rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def _label_tv(hist: np.ndarray) -> list:
    whole = hist.sum(0).astype(np.float64)
    if whole.sum() == 0:
        return [None] * len(hist)
    whole /= whole.sum()
    return [None if h.sum() == 0 else float(0.5 * np.abs(h / h.sum() - whole).sum()) for h in hist.astype(np.float64)]


def partition_chunked(
    chunked,
    num_parts: int,
    out,
    graph_name: str,
    seed: int = 0,
    budget_bytes: int = DEFAULT_BUDGET,
    settings: Optional[Dict[str, Any]] = None,
    force: bool = False,
) -> Path:
    """Partition the chunked graph at `chunked` (a folder, or an opened ChunkedGraph) randomly into
    `num_parts` parts at `out`; returns the partition JSON. Bad input (a chunk missing, truncated or
    of the wrong length, a node id out of range) raises before anything is at `out`."""
    from degnn.chunked import ChunkedError, ChunkedGraph, open_chunked

    try:
        g = chunked if isinstance(chunked, ChunkedGraph) else open_chunked(chunked)
    except ChunkedError as e:
        raise PartitionError(str(e)) from None
    n, k = g.num_nodes, int(num_parts)
    validate("random", num_parts, n, graph_name)
    out = Path(out).absolute()
    check_out(out, graph_name, "random", k, force)
    if settings is None:
        settings = {"method": "random", "num_parts": k, "seed": int(seed)}
    if node_state(n, k) > budget_bytes:
        raise PartitionError(f"{n} nodes in {k} parts need {node_state(n, k) >> 20} MiB of per-node state, over the "
                             f"budget of {budget_bytes >> 20} MiB; raise partition.stream_budget_mb")
    # a random part holds about E/K inner edges and (K-1)/K of as many outgoing halo edges: refuse
    # before the edge pass what the exact check after it would refuse
    part_edges = g.num_edges * (2 * k - 1) / (k * k)
    part_need = 2 * n + part_bytes(int(part_edges), n, budget_bytes)  # its halo: up to every node
    if part_need > 1.1 * budget_bytes:
        raise PartitionError(f"a part of {k} will have about {int(part_edges)} edges (with its halo's): about "
                             f"{part_need >> 20} MiB to build, over the budget of "
                             f"{budget_bytes >> 20} MiB; raise partition.stream_budget_mb or partition into more parts")
    with folder_lock(out):
        check_out(out, graph_name, "random", k, force)
        return write_chunked_partition(g, k, out, graph_name, int(seed), int(budget_bytes), settings)


def write_chunked_partition(g, k: int, out: Path, graph_name: str, seed: int, budget_bytes: int,
                            settings: Dict[str, Any]) -> Path:
    """Partition into a temporary sibling folder, then rename it to `out` (caller holds the lock)."""
    from degnn.chunked import ChunkedError

    tmp = temp_folder(out)
    try:
        return _write(g, k, out, tmp, graph_name, seed, budget_bytes, settings)
    except ChunkedError as e:  # a bad chunk found while reading it
        shutil.rmtree(tmp, ignore_errors=True)
        raise PartitionError(str(e)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write(g, k: int, out: Path, tmp: Path, graph_name: str, seed: int, budget: int,
           settings: Dict[str, Any]) -> Path:
    t0 = time.time()
    n = g.num_nodes
    part = random_assignment(n, k, seed)
    nodes = np.bincount(part, minlength=k)
    if int(nodes.min()) == 0:
        raise PartitionError(f"part(s) {[i for i in range(k) if nodes[i] == 0]} of {k} got no nodes "
                             f"({n} nodes in the graph); use fewer parts")
    order = np.argsort(part, kind="stable")  # new id -> original id
    new_of = np.empty(n, dtype=np.int64)
    new_of[order] = np.arange(n, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(nodes)]).astype(np.int64)
    t_assign = time.time()

    # ---- pass over the edges: counts, halo flags, digest, spills (one file per part and column,
    # so that a part is built a column at a time)
    spill = tmp / ".spill"
    spill.mkdir(parents=True)
    cols = ("in_src", "in_dst", "in_eid", "out_src", "out_dst", "out_part", "out_rank")
    files = {(p, c): open(spill / f"{c}{p}", "wb") for p in range(k) for c in cols}
    dst_f = open(spill / "dst", "wb")  # the digest hashes every src, then every dst
    halo = np.zeros((k, n), dtype=bool)
    inner_count = np.zeros(k, dtype=np.int64)
    outer_to = np.zeros((k, k), dtype=np.int64)  # [p, q]: part p's outgoing halo edges into part q
    cut_total = 0
    h = hashlib.blake2b(digest_size=8)
    h.update(str((g.num_edges,)).encode())
    eid0 = 0
    rows = max(1024, budget // (4 * PASS_EDGE_BYTES))
    try:
        for src, dst in g.edge_blocks(rows):
            h.update(src.tobytes())
            dst.tofile(dst_f)
            ps, pd = part[src], part[dst]
            cut = ps != pd
            cut_total += int(cut.sum())
            halo[pd[cut], src[cut]] = True
            halo[ps[cut], dst[cut]] = True
            ns, nd = new_of[src], new_of[dst]
            del src, dst
            # every edge's rank among its destination part's inner edges, before any part's
            # outgoing edges (whose destinations are in other parts) are spilled with theirs
            rank = np.empty(len(ns), dtype=np.int64)
            by_part = [np.flatnonzero(pd == p) for p in range(k)]
            for p, sel in enumerate(by_part):
                rank[sel] = inner_count[p] + np.arange(len(sel))
                inner_count[p] += len(sel)
            for p, sel in enumerate(by_part):
                ns[sel].tofile(files[p, "in_src"])
                nd[sel].tofile(files[p, "in_dst"])
                (eid0 + sel).tofile(files[p, "in_eid"])
                osel = np.flatnonzero(cut & (ps == p))
                ns[osel].tofile(files[p, "out_src"])
                nd[osel].tofile(files[p, "out_dst"])
                pd[osel].tofile(files[p, "out_part"])
                rank[osel].tofile(files[p, "out_rank"])
                outer_to[p] += np.bincount(pd[osel], minlength=k)
            eid0 += len(ns)
    finally:
        for f in list(files.values()) + [dst_f]:
            f.close()
    m = eid0
    h.update(str((m,)).encode())
    with open(spill / "dst", "rb") as f:
        while True:
            b = f.read(min(64 << 20, max(1 << 20, budget // 16)))
            if not b:
                break
            h.update(b)
    (spill / "dst").unlink()
    edge_bounds = np.concatenate([[0], np.cumsum(inner_count)]).astype(np.int64)
    halo_count = halo.sum(1)
    # while the parts are built only each node's part stays, in 2 bytes: the halo flags become
    # each part's sorted halo ids on disk, the new-id order is written as orig_nids now
    assignment_digest = _digest(part)
    for p in range(k):
        np.sort(new_of[np.flatnonzero(halo[p])]).tofile(spill / f"halo{p}")
    del halo, new_of
    import torch

    torch.save(torch.from_numpy(order), tmp / "orig_nids.pt")
    del order
    part = part.astype(np.int16 if k < 2 ** 15 else np.int32)
    for p in range(k):
        edges, pnodes = int(inner_count[p] + outer_to[p].sum()), int(nodes[p] + halo_count[p])
        need = n * part.itemsize + part_bytes(edges, pnodes, budget)
        if need > budget:
            raise PartitionError(f"part {p} has {edges} edges and {pnodes} nodes (with its halo's): about "
                                 f"{need >> 20} MiB to build, over the budget of {budget >> 20} MiB; raise "
                                 f"partition.stream_budget_mb or partition into more parts")

    # ---- the part graphs, one at a time (partitioners/stream_part.py)
    nfields = [f for f in FIELDS if f in g.node_data]
    with open(tmp / "orig_eids.npy", "wb") as ef:
        np.lib.format.write_array_header_2_0(ef, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)),
                                                  "fortran_order": False, "shape": (m,)})
        for p in range(k):
            with open(spill / f"in_eid{p}", "rb") as f:
                shutil.copyfileobj(f, ef, 16 << 20)  # inner edges in new-id order: their original ids
            (spill / f"in_eid{p}").unlink()
            halo_ids = np.fromfile(spill / f"halo{p}", dtype=np.int64)
            write_part(spill, p, bounds, edge_bounds, outer_to[p], halo_ids, tmp / f"part{p}", block_edges(budget))
            write_empty(tmp / f"part{p}" / "edge_feat.dgl")
            del halo_ids
    shutil.rmtree(spill)

    # ---- node data: one pass per field, rows appended to every part's file
    specs = {}
    for name in nfields:
        row_shape, _ = g.field_shape(name)
        if name != "feat":
            row_shape = ()  # labels and masks are one value a node
        specs[name] = (np.dtype(FIELDS[name]), row_shape)
    files = [open(tmp / f"part{p}" / "node_feat.dgl", "wb") for p in range(k)]
    writers = [TensorDictWriter(files[p], [(f"{NTYPE}/{name}", d, (int(nodes[p]),) + s)
                                           for name, (d, s) in specs.items()]) for p in range(k)]
    num_classes = 0
    hist = {"train": np.zeros((k, 0), dtype=np.int64), "labelled": np.zeros((k, 0), dtype=np.int64)}
    train_any = False
    try:
        for name, (dtype, row_shape) in specs.items():
            row_bytes = max(1, int(np.prod(g.field_shape(name)[0], dtype=np.int64)) * 8)
            for start, block in g.node_blocks(name, max(1024, budget // (4 * row_bytes))):
                if name != "feat":
                    block = block.reshape(len(block), -1)[:, 0]
                block = block.astype(dtype, copy=False)
                bp = part[start:start + len(block)]
                for p in range(k):
                    writers[p].append(block[bp == p])
        # label histograms per part (stats.json's label_tv), over training nodes where there are any
        if "label" in specs:
            tm_blocks = g.node_blocks("train_mask", 1 << 20) if "train_mask" in specs else None
            for start, y in g.node_blocks("label", 1 << 20):
                y = y.reshape(len(y), -1)[:, 0].astype(np.int64)
                bp = part[start:start + len(y)]
                tm = next(tm_blocks)[1].reshape(len(y), -1)[:, 0].astype(bool) if tm_blocks is not None \
                    else np.zeros(len(y), dtype=bool)
                train_any |= bool(tm.any())
                valid = y >= 0
                if valid.any():
                    num_classes = max(num_classes, int(y[valid].max()) + 1)
                for key, sel in (("train", valid & tm), ("labelled", valid)):
                    if hist[key].shape[1] < num_classes:
                        hist[key] = np.pad(hist[key], ((0, 0), (0, num_classes - hist[key].shape[1])))
                    if sel.any():
                        np.add.at(hist[key], (bp[sel], y[sel]), 1)
    finally:
        for f in files:
            f.close()
    if not all(w.done() for w in writers):
        raise PartitionError("internal: a part's node data is incomplete")
    t_write = time.time()

    # ---- the graph's digest, as partitioners.stats.graph_digest computes it
    for name in ("train_mask", "label"):
        if name in specs:
            h.update(str((n,)).encode())
            for _, block in g.node_blocks(name, 1 << 20):
                h.update(block.reshape(len(block), -1)[:, 0].astype(np.int64).tobytes())
    graph_digest = h.hexdigest()

    node_map = [[int(bounds[i]), int(bounds[i + 1])] for i in range(k)]
    edge_map = [[int(edge_bounds[i]), int(edge_bounds[i + 1])] for i in range(k)]
    meta = {"graph_name": graph_name, "num_nodes": n, "num_edges": m, "part_method": "random", "num_parts": k,
            "halo_hops": 1, "node_map": {NTYPE: node_map}, "edge_map": {ETYPE: edge_map},
            "ntypes": {NTYPE: 0}, "etypes": {ETYPE: 0}}
    for p in range(k):
        meta[f"part-{p}"] = {"node_feats": f"part{p}/node_feat.dgl", "edge_feats": f"part{p}/edge_feat.dgl",
                             "part_graph": f"part{p}/graph.dgl"}
    meta["degnn"] = {"method": "random", "seed": seed, "balance_edges": bool(settings.get("balance_edges", True)),
                     "settings": settings, "streamed": {"budget_mb": budget >> 20, "chunked": str(g.path)}}
    jpath = tmp / f"{graph_name}.json"
    jpath.write_text(json.dumps(meta, indent=4))

    over = None
    tv = [None] * k
    if "label" in specs and num_classes:
        over = "train" if train_any else "labelled"
        tv = _label_tv(hist[over])
    train = hist["train"].sum(1) if train_any else np.zeros(k, dtype=np.int64)
    if "train_mask" in specs and not train_any:
        train = np.zeros(k, dtype=np.int64)
    tvs = [t for t in tv if t is not None]
    t_end = time.time()
    stats = {
        "graph_name": graph_name, "method": "random", "seed": seed,
        "num_nodes": n, "num_edges": m, "num_parts": k, "edge_cut": cut_total,
        "edge_cut_fraction": float(cut_total / m) if m else 0.0,
        "node_imbalance": float(nodes.max() / max(nodes.mean(), 1e-12)),
        "edge_imbalance": float(inner_count.max() / max(inner_count.mean(), 1e-12)),
        "halo_nodes_total": int(halo_count.sum()),
        "label_tv_over": over,
        "label_tv_mean": float(np.mean(tvs)) if tvs else None,
        "label_tv_max": float(np.max(tvs)) if tvs else None,
        "graph_digest": graph_digest,
        "assignment_digest": assignment_digest,
        "parts": [{"part": p, "nodes": int(nodes[p]), "edges": int(inner_count[p]),
                   "train_nodes": int(train[p]), "halo_nodes": int(halo_count[p]), "label_tv": tv[p]}
                  for p in range(k)],
        "wall_time_s": round(t_end - t0, 4), "assign_time_s": round(t_assign - t0, 4),
        "write_time_s": round(t_write - t_assign, 4), "load_time_s": None,
        "peak_rss_mb": _rss_mb(), "budget_mb": budget >> 20, "streamed": True,
    }
    (tmp / STATS).write_text(json.dumps(stats, indent=2))
    install(tmp, out)
    return out / f"{graph_name}.json"


def _digest(a: np.ndarray) -> str:
    from .stats import digest

    return digest(a)


def main() -> None:
    """`python -m partitioners.stream_random CHUNKED_DIR OUT NUM_PARTS [BUDGET_MB] [SEED]`: what the
    measurements and docs/usage.md run (bad input: one line on stderr, exit status 2)."""
    import sys

    a = sys.argv[1:]
    if len(a) < 3:
        print(main.__doc__.split(":", 1)[0].strip("`"), file=sys.stderr)
        sys.exit(2)
    budget = int(float(a[3]) * (1 << 20)) if len(a) > 3 else DEFAULT_BUDGET
    try:
        j = partition_chunked(a[0], int(a[2]), a[1], Path(a[1]).name, int(a[4]) if len(a) > 4 else 0, budget)
    except PartitionError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(j)


if __name__ == "__main__":
    main()
