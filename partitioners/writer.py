"""Write any node assignment of a homogeneous DGL graph in DGL's distributed partition format.

The output is what ``dgl.distributed.partition_graph(g, graph_name, K, out, num_hops=1)`` writes
for a homogeneous graph (DGL 1.1.3 layout and field names), so ``load_partition``,
``load_partition_book``, ``DistGraphServer`` and ``DistGraph`` read it unchanged:

    <out>/<graph_name>.json          graph_name, num_nodes, num_edges, part_method, num_parts,
                                     halo_hops, node_map {ntype: [[start, end) per part]},
                                     edge_map {"src:etype:dst": [[start, end) per part]},
                                     ntypes, etypes, part-<i>: {node_feats, edge_feats, part_graph}
                                     (+ "degnn": our own metadata, ignored by DGL)
    <out>/part<i>/graph.dgl          the part with its 1-hop HALO nodes; ndata _ID (new global id),
                                     inner_node, part_id, _TYPE; edata _ID, inner_edge, _TYPE
    <out>/part<i>/graph_csc.dgl      the same part as CSC arrays, which degnn's graph servers map
                                     (degnn/part_csc.py); DGL ignores it
    <out>/part<i>/node_feat.dgl      every ndata field of the input, rows of the part's own nodes,
                                     keyed "<ntype>/<name>" (e.g. "_N/feat")
    <out>/part<i>/edge_feat.dgl      every edata field, keyed "<src>:<etype>:<dst>/<name>"
    <out>/orig_nids.pt, orig_eids.pt new (shuffled) id -> original id (partition_graph's return_mapping)
    <out>/link_split.pt              link task only: the held-out validation and test edges and their
                                     negatives in new ids (`write_link_split`); the graph itself
                                     holds the training edges only

Node and edge ids are reshuffled (``dgl.partition_graph_with_halo(..., reshuffle=True)``) so part
i owns the contiguous new-id range node_map[i] (DGL's RangePartitionBook needs that); an edge
belongs to the part of its destination.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from degnn.part_csc import CSC_FILE, reserved_dtypes, write_part_csc

from .assign import PartitionError, structure_graph


LINK_SPLIT = "link_split.pt"


def write_link_split(path: Path, split: Dict[str, Dict[str, object]], orig_nids) -> Dict[str, Dict[str, object]]:
    """valid/test edges and negatives of a link dataset, renumbered into the partition's new node
    ids (`orig_nids`: new id -> original id), saved as plain tensors (read with weights_only=True).
    Negatives are int32 when the ids fit (OGB's citation2 has 2 x 87k x 1000 of them)."""
    import torch

    new_of = torch.empty_like(orig_nids)
    new_of[orig_nids] = torch.arange(len(orig_nids), dtype=orig_nids.dtype)
    small = len(orig_nids) < 2 ** 31
    out = {}
    for part in ("valid", "test"):
        d = split[part]
        src = new_of[torch.as_tensor(d["source_node"]).long()]
        dst = new_of[torch.as_tensor(d["target_node"]).long()]
        neg = torch.as_tensor(d["target_node_neg"]).long()
        neg = new_of[neg.reshape(-1)].reshape(neg.shape)
        out[part] = {"source_node": src, "target_node": dst,
                     "target_node_neg": neg.to(torch.int32) if small else neg}
    torch.save(out, path)
    return out


def _etype_str(etype) -> str:
    return ":".join(etype)


def write_partitions(
    g,
    part: np.ndarray,
    num_parts: int,
    out: Path,
    graph_name: str,
    part_method: str,
    extra_meta: Optional[Dict[str, object]] = None,
    sim_g=None,
    link_split: Optional[Dict[str, Dict[str, object]]] = None,
) -> Dict[str, object]:
    """Write g cut by `part` into `out` (created). Returns {"json": path, "halo": [...]}.

    `link_split` (a link dataset's valid/test edges and negatives, original ids) travels with the
    partition as LINK_SPLIT, so trainers, which see only partitions, can evaluate."""
    import dgl
    import torch
    from dgl.data.utils import save_graphs, save_tensors

    if not g.is_homogeneous:
        raise PartitionError(
            f"graph has node types {g.ntypes} and edge types {g.etypes}; the partitioners take a "
            "homogeneous graph (convert with dgl.to_homogeneous)"
        )
    n, m = g.num_nodes(), g.num_edges()
    part_t = torch.from_numpy(np.ascontiguousarray(part, dtype=np.int64))
    counts = torch.bincount(part_t, minlength=num_parts)
    if len(counts) > num_parts or int(counts.min()) == 0:
        empty = [i for i in range(num_parts) if i >= len(counts) or int(counts[i]) == 0]
        raise PartitionError(
            f"part(s) {empty} of {num_parts} got no nodes ({n} nodes in the graph); use fewer parts"
        )
    ntype = g.ntypes[0]
    etype = g.canonical_etypes[0]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    # structure only (no features) with _ID/_TYPE like partition_graph's to_homogeneous(g)
    if sim_g is None:
        sim_g = structure_graph(g)
    parts, orig_nids, orig_eids = dgl.partition_graph_with_halo(sim_g, part_t, 1, reshuffle=True)
    del sim_g

    node_bounds = [0] + torch.cumsum(counts, 0).tolist()
    node_map = [[node_bounds[i], node_bounds[i + 1]] for i in range(num_parts)]
    edge_map = []
    halo = []
    meta = {
        "graph_name": graph_name,
        "num_nodes": n,
        "num_edges": m,
        "part_method": part_method,
        "num_parts": num_parts,
        "halo_hops": 1,
        "node_map": {ntype: node_map},
        "edge_map": {_etype_str(etype): edge_map},
        "ntypes": {ntype: 0},
        "etypes": {_etype_str(etype): 0},
    }
    edge_start = 0
    for i in range(num_parts):
        p = parts[i]
        inner = p.ndata["inner_node"].bool()
        inner_nid = p.ndata[dgl.NID][inner]
        # reshuffled ids: part i owns exactly node_map[i], in order
        if len(inner_nid) != node_map[i][1] - node_map[i][0] or (
            len(inner_nid) and (int(inner_nid[0]) != node_map[i][0] or int(inner_nid[-1]) != node_map[i][1] - 1)
        ):
            raise PartitionError(f"internal: part {i} does not own a contiguous node range")
        inner_e = p.edata["inner_edge"].bool()
        inner_eid = p.edata[dgl.EID][inner_e]
        ne = len(inner_eid)
        if ne and (int(inner_eid.min()) != edge_start or int(inner_eid.max()) != edge_start + ne - 1):
            raise PartitionError(f"internal: part {i} does not own a contiguous edge range")
        edge_map.append([edge_start, edge_start + ne])
        edge_start += ne
        halo.append(int(p.num_nodes() - int(inner.sum())))

        local_nodes = p.ndata["orig_id"][inner]
        local_edges = p.edata["orig_id"][inner_e]
        node_feats = {
            f"{ntype}/{k}": v[local_nodes]
            for k, v in g.ndata.items()
            if k not in (dgl.NID, "inner_node")
        }
        edge_feats = {
            f"{_etype_str(etype)}/{k}": v[local_edges]
            for k, v in g.edata.items()
            if k not in (dgl.EID, "inner_edge")
        }
        del p.ndata["orig_id"]
        del p.edata["orig_id"]
        for k, dt in reserved_dtypes().items():
            if k in p.ndata:
                p.ndata[k] = p.ndata[k].to(dt)
            if k in p.edata:
                p.edata[k] = p.edata[k].to(dt)
        pdir = out / f"part{i}"
        pdir.mkdir(exist_ok=True)
        save_tensors(str(pdir / "node_feat.dgl"), node_feats)
        save_tensors(str(pdir / "edge_feat.dgl"), edge_feats)
        save_graphs(str(pdir / "graph.dgl"), [p])
        write_part_csc(pdir / CSC_FILE, p)
        meta[f"part-{i}"] = {
            "node_feats": f"part{i}/node_feat.dgl",
            "edge_feats": f"part{i}/edge_feat.dgl",
            "part_graph": f"part{i}/graph.dgl",
        }
        parts[i] = None  # free as we go
    if edge_start != m:
        raise PartitionError(f"internal: inner edges cover {edge_start} of {m} edges")
    torch.save(orig_nids, out / "orig_nids.pt")
    torch.save(orig_eids, out / "orig_eids.pt")
    if link_split is not None:
        write_link_split(out / LINK_SPLIT, link_split, orig_nids)
        extra_meta = {**(extra_meta or {}), "link_split": LINK_SPLIT}
    if extra_meta:
        meta["degnn"] = extra_meta
    jpath = out / f"{graph_name}.json"
    with open(jpath, "w") as f:
        json.dump(meta, f, indent=4)
    return {"json": jpath, "halo": halo}
