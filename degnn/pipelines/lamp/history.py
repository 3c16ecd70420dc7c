"""Quantized historical embeddings: one table per hidden layer read as a leaf, over one machine's
local nodes (its own nodes and its halo nodes). GAS keeps h^(1) .. h^(L-1); here h^(L-1) of a
remote node is always prepared fresh by its owner (that is LAMP's answer), so only h^(1) .. h^(L-2)
are ever read, and only those are kept, pushed and synchronised (none for a 2-layer model);
with pipeline.roots=histories (the ablation) the roots read h^(L-1) from here, so it is kept too.

Like pyg_autoscale's ``History``: ``push`` writes rows (encoded by the run's codec, codec.py:
quantized with stochastic rounding by default, stamped with the model version that computed
them), ``pull`` reads them back as float32 with their age (now - stamp, in training steps).
``push_packed`` / ``pull_packed`` move already-encoded rows unchanged, for the halo sync between
machines (the owner's stamp travels with the row).

Where the tables live: in the graph server process of each machine, as state set by requests
(degnn/pipelines/lamp/service.py), not as a DistTensor in the KVStore. The reason: the reader that
matters is the LAMP engine inside that server, and it needs the *halo* rows (nodes other machines
own) next to the rows of its own nodes; a node-partitioned DistTensor holds only a machine's own
rows, so every halo read would cross the network, which is what histories exist to avoid. The
trainer of that machine reads and writes the same tables through its local server (loopback, no
wire bytes). With pipeline.engine=trainer the tables live in the trainer process instead, and
the owners' answers are prepared there too (owners.TrainerOwners).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from degnn.pipelines.lamp.codec import Codec, Packed


class History:
    def __init__(self, num_nodes: int, layers: int, codec: Codec, where: Optional[str] = None):
        """`layers` tables (hidden layers 1..layers) of `num_nodes` rows of `codec.dim` values; in
        memory, or in memory-mapped files in the directory `where` (pipeline.history_store=disk)."""
        self.num_nodes, self.dim, self.layers, self.codec = num_nodes, codec.dim, layers, codec
        # (one zero row encoded with the global random stream, as the tables' prototype was
        # before the codec: fixed-seed runs draw the same numbers as they did)
        codec.encode(torch.zeros(1, codec.dim))
        self.rows = [codec.table(num_nodes, where) for _ in range(layers)]
        self.stamp = [torch.full((num_nodes,), -1, dtype=torch.int64) for _ in range(layers)]

    def _t(self, layer: int) -> int:
        if not 1 <= layer <= self.layers:
            raise IndexError(f"history layer {layer} out of range 1..{self.layers}")
        return layer - 1

    # --- float rows ----------------------------------------------------------------------------
    def push(self, layer: int, ids: torch.Tensor, x: torch.Tensor, version: int) -> None:
        self.push_packed(layer, ids, self.codec.encode(x), torch.full((len(ids),), version, dtype=torch.int64))

    def pull(self, layer: int, ids: torch.Tensor, now: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(rows as float32 [len(ids), dim], age of each row in steps). Rows never written read as
        zeros with age `now + 1`."""
        rows, stamp = self.pull_packed(layer, ids)
        return self.codec.decode(rows), now - stamp

    # --- encoded rows, unchanged (halo sync) ---------------------------------------------------
    def push_packed(self, layer: int, ids: torch.Tensor, rows: Packed, stamp: torch.Tensor) -> None:
        t = self._t(layer)
        self.codec.put(self.rows[t], ids, rows)
        self.stamp[t][ids] = stamp

    def pull_packed(self, layer: int, ids: torch.Tensor) -> Tuple[Packed, torch.Tensor]:
        t = self._t(layer)
        return self.codec.take(self.rows[t], ids), self.stamp[t][ids]

    def nbytes(self) -> int:
        return self.layers * self.num_nodes * (self.codec.row_bytes + 8)


def ages_summary(ages: List[torch.Tensor]) -> Tuple[int, int, int]:
    """(sum, count, max) of the ages of history rows used."""
    s = c = m = 0
    for a in ages:
        if len(a):
            s += int(a.sum())
            c += len(a)
            m = max(m, int(a.max()))
    return s, c, m


def oldest_first(refreshed: torch.Tensor, n: int, generator: torch.Generator = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The `n` (table, row) pairs of `refreshed` ([tables, rows]: the step each halo row was last
    refreshed) refreshed longest ago, ties in random order: (table index, row index). Refreshing
    them and stamping them now makes a budgeted halo sync a round robin over tables and rows."""
    flat = refreshed.flatten()
    n = max(0, min(int(n), len(flat)))
    if n == 0:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
    tie = torch.rand(len(flat), generator=generator, dtype=torch.float64)
    pick = torch.topk(-(flat.double() + tie), n, sorted=False).indices
    rows = refreshed.shape[1]
    return pick // rows, pick % rows
