"""Node-to-part assignments: the only thing that differs between the three methods.

Every method returns an int64 numpy vector ``part[i]`` (the part of original node ``i``); the
same writer (`partitioners.writer`) then turns any assignment into DGL's partition format.

* ``random``: every node draws its part uniformly and independently, as DistDGL's
  ``part_method="random"`` and RandomTMA's "random-nodes" do, from a stream of its own
  (``default_rng([RANDOM_STREAM, seed])``): with ``default_rng(seed)`` the parts would repeat
  whatever a user drew from the same seed (labels drawn with ``default_rng(0).integers`` made
  the parts a function of the labels).
* ``metis``: K-way METIS through ``dgl.metis_partition_assignment`` with the training nodes
  balanced (``balance_ntypes=train_mask``, as DistDGL's examples pass it) and, when
  ``balance_edges``, in-degrees balanced too. METIS itself is deterministic: the seed is unused.
* ``supernode``: METIS into C small clusters ("super-nodes"), cluster ids shuffled with
  ``default_rng(seed)`` and dealt in K contiguous groups of floor/ceil(C/K) clusters
  (SuperTMA's "uniform-cluster"; docs/background.md, "TMA"). C follows `effective_num_supernodes`.
"""
from __future__ import annotations

import numpy as np

METHODS = ("random", "metis", "supernode")

# mixed into the random method's seed: its stream is nobody else's (part of the cache key,
# partitioners/folder.py: a new stream is a new folder)
RANDOM_STREAM = 0x5EED_9A27

# a super-node holds at least this many nodes on average (see effective_num_supernodes)
MIN_SUPERNODE_SIZE = 20


class PartitionError(RuntimeError):
    """Bad partitioning input; the message names the problem and the fix (one line)."""


def effective_num_supernodes(num_nodes: int, num_parts: int, num_supernodes: int) -> int:
    """The number of METIS clusters the supernode method really cuts.

    ``min(num_supernodes, max(num_parts, num_nodes // 20))``: the configured count (15000, the
    SuperTMA paper's) on large graphs; on small graphs clusters of about 20 nodes at least, so
    METIS is not asked for near-singleton parts; and never fewer clusters than parts.
    """
    return int(min(num_supernodes, max(num_parts, num_nodes // MIN_SUPERNODE_SIZE)))


def structure_graph(g):
    """g's structure without features, int64, with _ID/_TYPE: what DGL's partition_graph feeds
    METIS and partition_graph_with_halo (``dgl.to_homogeneous`` without ndata/edata)."""
    import dgl
    import torch

    sg = dgl.to_homogeneous(g)
    return sg if sg.idtype == torch.int64 else sg.long()


def _metis(sg, k: int, balance_ntypes, balance_edges: bool) -> np.ndarray:
    import dgl

    n = sg.num_nodes()
    if k == 1:
        return np.zeros(n, dtype=np.int64)
    parts = dgl.metis_partition_assignment(sg, k, balance_ntypes=balance_ntypes, balance_edges=balance_edges)
    if parts is None:
        raise PartitionError(f"METIS failed to cut the graph into {k} parts; try fewer parts")
    return parts.numpy().astype(np.int64)


def train_balance_types(g):
    """`balance_ntypes` for METIS: 1 for training nodes, 0 otherwise (None without train_mask)."""
    if "train_mask" not in g.ndata:
        return None
    t = g.ndata["train_mask"].reshape(-1).long()
    if int(t.min()) == int(t.max()):  # a single type balances nothing
        return None
    return t


def random_assignment(num_nodes: int, num_parts: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([RANDOM_STREAM, int(seed)])
    return rng.integers(0, num_parts, size=num_nodes, dtype=np.int64)


def metis_assignment(g, num_parts: int, balance_edges: bool = True, sg=None) -> np.ndarray:
    sg = structure_graph(g) if sg is None else sg
    return _metis(sg, num_parts, train_balance_types(g), balance_edges)


def deal_clusters(clusters: np.ndarray, num_clusters: int, num_parts: int, seed: int) -> np.ndarray:
    """Shuffle cluster ids and deal them to parts in contiguous groups of (nearly) equal count."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(num_clusters)
    cluster_part = np.empty(num_clusters, dtype=np.int64)
    # the i-th cluster of the shuffled order goes to part floor(i * K / C): group sizes differ by <= 1
    cluster_part[order] = (np.arange(num_clusters, dtype=np.int64) * num_parts) // num_clusters
    return cluster_part[clusters]


def supernode_assignment(
    g, num_parts: int, seed: int, num_supernodes: int = 15000, balance_edges: bool = False, sg=None
) -> np.ndarray:
    c = effective_num_supernodes(g.num_nodes(), num_parts, num_supernodes)
    sg = structure_graph(g) if sg is None else sg
    clusters = _metis(sg, c, None, balance_edges)
    # METIS may leave some of the requested clusters empty; deal only the ids it used
    used, clusters = np.unique(clusters, return_inverse=True)
    return deal_clusters(clusters.astype(np.int64), len(used), num_parts, seed)


def compute_assignment(
    g,
    method: str,
    num_parts: int,
    seed: int = 0,
    num_supernodes: int = 15000,
    balance_edges: bool = True,
    sg=None,
) -> np.ndarray:
    """The part of every node of g under `method` (one of METHODS); `sg`: structure_graph(g) if
    the caller already has it."""
    if method == "random":
        return random_assignment(g.num_nodes(), num_parts, seed)
    if method == "metis":
        return metis_assignment(g, num_parts, balance_edges, sg)
    if method == "supernode":
        return supernode_assignment(g, num_parts, seed, num_supernodes, balance_edges, sg)
    raise PartitionError(
        f"unknown partition method '{method}'; use one of {', '.join(METHODS)}"
    )
