"""The halo sync's bookkeeping on a trainer, whichever engine carries it: which halo history rows
to ask their owners for (`plan`), and the answers as rows for this machine's histories (`store`).

pipeline.sync_budget=r (default 0.25): r x the LAMP answer rows this trainer received since the
last sync, the rows refreshed longest ago first, over every table and halo node (a round robin).
The sync then adds at most a share r to the per-batch LAMP traffic whatever the number of
layers; the price is older halo rows, reported as history_age. null: every halo row its owner
wrote since the last sync, one copy per table: the bytes grow with the layers.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from degnn.pipelines.lamp.codec import Codec
from degnn.pipelines.lamp.compute import HistoryPull, HistoryRows, Rows
from degnn.pipelines.lamp.history import oldest_first


class HaloSync:
    def __init__(self, lg, pb, tables: int, seed: int, budget: Optional[float], since_margin: int, codec: Codec):
        """`tables`: the history tables h^(1..tables) kept for the halo nodes (L-2, or L-1 with
        pipeline.roots=histories); `codec`: their rows' (codec.py)."""
        halo = torch.nonzero(~lg.inner).flatten()
        self.local, self.gid = halo, lg.nid[halo]
        # (int16: a machine id; random parts of bench=scale's 8M graph give a machine 5.5M halo nodes)
        self.owner = pb.nid2partid(self.gid).to(torch.int16)
        # by position in `halo`: each owner's positions, and the step each row of each history
        # table was last refreshed from its owner (a budgeted sync takes the oldest first)
        self.pos_by_owner = {int(m): torch.nonzero(self.owner == m).flatten() for m in torch.unique(self.owner)}
        self.refreshed = torch.zeros(tables, len(halo), dtype=torch.int64)
        self.tables = list(range(1, tables + 1))
        self.rng = torch.Generator().manual_seed(seed)
        self.budget, self.since_margin, self.codec = budget, since_margin, codec
        self.roots_at_sync = 0
        self.last_sync = 0
        self.rows = 0  # halo rows stored
        self.pending = None  # the sync in flight: (asks, plan)

    def plan(self, step: int, roots: int, answerers) -> List[Tuple[int, HistoryPull]]:
        """The asks of a sync at `step`, (answerer, HistoryPull) each, `roots`: LAMP answer rows
        received so far, `answerers(m)`: who answers for machine m (every one is asked: each writes
        back what it prepared). Kept as `pending` until `store`. The margin of `since`: trainers
        can be a step apart, and an owner stamps what it computes with the version of its
        weights, up to weight_sync_steps (+ prefetch) steps old."""
        if not self.tables:  # two layers (roots from owners): no history is ever read
            return []
        asks, plan = [], []  # plan: per ask, (table index, halo position) of each row it asks for
        if self.budget is None:
            since = max(self.last_sync - 2 - self.since_margin, 0)
            for m, pos in self.pos_by_owner.items():
                rows = (torch.arange(len(self.tables)).repeat_interleave(len(pos)), pos.repeat(len(self.tables)))
                for a in answerers(m):
                    asks.append((a, HistoryPull(self.tables, [], self.gid[pos], True, since)))
                    plan.append(rows)
        else:
            table, pos = oldest_first(self.refreshed, int(self.budget * (roots - self.roots_at_sync)), self.rng)
            owner = self.owner[pos]
            for m in torch.unique(owner).tolist():
                mine = torch.nonzero(owner == m).flatten()
                mine = mine[torch.argsort(table[mine], stable=True)]  # the ask lists table after table
                counts = torch.bincount(table[mine], minlength=len(self.tables)).tolist()
                for a in answerers(m):
                    asks.append((a, HistoryPull(self.tables, counts, self.gid[pos[mine]], True, -1)))
                    plan.append((table[mine], pos[mine]))
        self.roots_at_sync = roots
        self.last_sync = step
        self.pending = (asks, plan) if asks else None
        return asks

    def store(self, answers: Dict[int, Rows], step: int, newest: bool) -> List[HistoryRows]:
        """The pending sync's answers (by answerer) as history rows of the halo nodes' local ids;
        `newest`: several answerers a machine, so a node may come from several: keep its newest row."""
        asks, plan = self.pending
        self.pending = None
        codec = self.codec
        rows: Dict[int, list] = {}  # table index -> [(halo positions, packed rows, stamps)]
        for (a, pull), (table, pos) in zip(asks, plan):
            r = answers[a]
            # an answer lists the rows asked for in order, or (since >= 0) those at positions `sel`
            sel = r.sel if pull.since >= 0 else torch.arange(len(pos))
            for t in torch.unique(table[sel]).tolist():
                idx = torch.nonzero(table[sel] == t).flatten()
                rows.setdefault(t, []).append((pos[sel[idx]], codec.take(r.rows, idx), r.stamp[idx]))
        out = []
        for t, parts in rows.items():
            pos, stamp = (torch.cat([p[j] for p in parts]) for j in (0, 2))
            packed = codec.cat([p[1] for p in parts])
            if newest:
                order = torch.argsort(stamp, descending=True, stable=True)
                uniq, inv = torch.unique(pos[order], return_inverse=True)
                first = torch.full((len(uniq),), len(inv), dtype=torch.int64).scatter_reduce(
                    0, inv, torch.arange(len(inv)), "amin")
                keep = order[first]
                pos, stamp, packed = pos[keep], stamp[keep], codec.take(packed, keep)
            self.refreshed[t, pos] = step
            self.rows += len(pos)
            out.append(HistoryRows(t + 1, self.local[pos], packed, stamp))
        return out
