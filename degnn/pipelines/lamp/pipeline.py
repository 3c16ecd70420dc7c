"""The LAMP pipeline (trainer side); the design is described in degnn/pipelines/lamp/__init__.py."""
from __future__ import annotations

from collections import deque
from typing import Dict, List, NamedTuple, Optional, Tuple

import dgl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from degnn.metrics import ring_allreduce_bytes, timed_allreduce_hook
from degnn.models import build_model
from degnn.pipelines.base import Pipeline
from degnn.pipelines.distdgl import num_classes_of
from degnn.pipelines.evaluation import DistEvaluator, dataset_evaluator
from degnn.pipelines.lamp.engine import TrainerEngine
from degnn.pipelines.lamp.graph import CompGraph, LocalGraph, fusion_counts, unfold
from degnn.pipelines.lamp.history import ages_summary, oldest_first
from degnn.pipelines.lamp.quantize import QRows, check_bits, dequantize, quantize
from degnn.pipelines.lamp.service import (AckResponse, GradPullRequest, GradPushRequest, HistoryPullRequest,
                                          HistoryPushRequest, LampRequest, LampSetupRequest,
                                          SetWeightsRequest, add_grads, call, payload_bytes, receive, send,
                                          servers_of)

GRAD_MODES = ("stop", "push")
ENGINES = ("server", "trainer")


class LampNet(nn.Module):
    """The GNN over a locality-aware computation graph: block k's sources are the previous
    block's outputs followed by that block's leaf rows (constants)."""

    def __init__(self, gnn):
        super().__init__()
        self.gnn = gnn

    def forward(self, blocks, x_inner: torch.Tensor, leaves: List[torch.Tensor]):
        h, hidden = x_inner, []
        for k, block in enumerate(blocks):
            h = self.gnn.layer_forward(k, block, torch.cat([h, leaves[k]]))
            if k < len(blocks) - 1:
                hidden.append(h.detach())
        return h, hidden


def check_lamp_config(pcfg, model_cfg, cluster_cfg=None) -> None:
    check_bits(int(pcfg.bits))
    if pcfg.engine not in ENGINES:
        raise ValueError(f"pipeline.engine={pcfg.engine}: choose server (the owners' preparation runs in DGL's graph "
                         f"servers) or trainer (in each machine's trainer process, over torch.distributed)")
    if pcfg.engine == "trainer" and cluster_cfg is not None and cluster_cfg.trainers_per_machine != 1:
        raise ValueError("pipeline.engine=trainer needs cluster.trainers_per_machine=1 (each machine's one trainer "
                         "answers for its partition); use pipeline.engine=server with several trainers a machine")
    if pcfg.grad not in GRAD_MODES:
        raise ValueError(f"pipeline.grad={pcfg.grad}: this version implements {', '.join(GRAD_MODES)} "
                         f"(stop: owner answers are constants, GAS semantics; push: their gradients go back to the "
                         f"owners, P3-style)")
    if model_cfg.layers < 2:
        raise ValueError("pipeline=lamp needs model.layers >= 2 (with one layer there is nothing to prepare)")
    if pcfg.sync_every < 1 or pcfg.weight_sync_every < 1:
        raise ValueError("pipeline.sync_every and pipeline.weight_sync_every must be >= 1")
    if pcfg.sync_budget is not None and not pcfg.sync_budget >= 0:
        raise ValueError(f"pipeline.sync_budget must be >= 0 (halo rows per sync as a share of the LAMP answer "
                         f"rows since the last one) or null (every changed row), got {pcfg.sync_budget}")
    if pcfg.prefetch < 0:
        raise ValueError(f"pipeline.prefetch must be >= 0 (batches whose requests are in flight ahead), "
                         f"got {pcfg.prefetch}")


def pipelined(items: list, k: int, issue, complete, timer):
    """Yield (issued, complete(issued)) for every item, in order, keeping the items up to i+k
    issued before item i is completed (k = 0: issue, complete, one after the other). `timer`
    (PhaseTimer) takes the issuing as ``sampling`` and the completing as ``owner_wait``."""
    inflight: deque = deque()
    for i in range(len(items)):
        with timer("sampling"):
            while len(inflight) <= k and i + len(inflight) < len(items):
                inflight.append(issue(items[i + len(inflight)]))
        b = inflight.popleft()
        with timer("owner_wait"):
            done = complete(b)
        yield b, done


class Batch(NamedTuple):
    """One batch between its requests going out (`_issue`) and its answers coming back
    (`_complete`): the seeds, the trainer's computation graph, and what is in flight for it."""
    seeds: torch.Tensor
    cg: CompGraph
    top_gid: torch.Tensor       # the top block's leaves (roots at their owners), global ids
    masks: list                 # per LAMP request: which of top_gid it asked for
    lamp: list                  # (server, LampRequest)
    pull: Optional[object]      # this machine's history rows for the middle blocks: the HistoryPullRequest
                                # in flight, or (engine=trainer) its answer, read in-process
    pending: object             # service.send's map (the LAMP requests, then the pull), or
                                # (engine=trainer) the Future of the batch's round
    top_rows: Optional[torch.Tensor]  # fusion=false: which answer each (repeated) top leaf takes
    x: torch.Tensor             # input features of the trainer's own nodes (local shared memory)
    x_leaves: torch.Tensor      # the halo leaves' input features (the setup replica)


class LAMPPipeline(Pipeline):
    name = "lamp"
    metric = "acc"

    @classmethod
    def prepare_launch(cls, cfg, task_overrides) -> List[str]:
        check_lamp_config(cfg.pipeline, cfg.model, cfg.cluster)
        return []

    def setup(self) -> None:
        ctx, cfg = self.ctx, self.cfg
        pcfg = cfg.pipeline
        self.check_task(cfg)
        check_lamp_config(pcfg, cfg.model, cfg.cluster)
        self.bits, self.L = int(pcfg.bits), int(cfg.model.layers)
        self.fanouts = [int(f) for f in cfg.model.fanouts]
        g = ctx.graph
        self.pb = g.get_partition_book()
        self.me = self.pb.partid
        # seeds must be nodes this machine owns (force_even may hand out other machines' nodes);
        # every trainer then takes the same number of steps per epoch (DDP), the largest share's
        self.train_nids = dgl.distributed.node_split(g.ndata["train_mask"], self.pb, force_even=False)
        if len(self.train_nids) and not bool((self.pb.nid2partid(self.train_nids) == self.pb.partid).all()):
            raise RuntimeError("pipeline=lamp: node_split gave this trainer nodes of another machine")
        nb = torch.tensor([-(-len(self.train_nids) // cfg.train.batch_size)])
        dist.all_reduce(nb, op=dist.ReduceOp.MAX)
        self.num_batches = int(nb)
        in_dim = g.ndata["feat"].shape[1]
        self.num_classes = num_classes_of(g, self.train_nids)
        torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
        self.model = build_model(cfg.model, in_dim, self.num_classes)
        torch.manual_seed(cfg.train.seed + ctx.rank)
        self.ddp = DistributedDataParallel(LampNet(self.model))
        self.ddp.register_comm_hook(None, timed_allreduce_hook(self.timer))  # DDP's averaging, timed
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        out_dims = [cfg.model.hidden] * (self.L - 1) + [self.num_classes]
        self.evaluator = DistEvaluator(ctx, self.model, out_dims, dataset_evaluator(cfg.dataset),
                                       cfg.train.eval_batch_size)

        # this machine's partition, as its graph server sees it
        self.lg = LocalGraph.from_partition(g.local_partition)
        inner = torch.nonzero(self.lg.inner).flatten()
        if not torch.equal(self.pb.nid2localnid(self.lg.nid[inner], self.me).long(), inner):
            raise RuntimeError("pipeline=lamp: local ids of the partition graph and of the KVStore differ")
        self.local_feat = g.ndata["feat"].local_partition  # own nodes' rows, by local id
        # labels by local id too: no DGL RPC may run while LAMP answers are in flight (service.receive)
        self.local_label = g.ndata["label"].local_partition
        halo = torch.nonzero(~self.lg.inner).flatten()
        halo_gid = self.lg.nid[halo]
        self.halo_x = torch.zeros(self.lg.num_nodes, in_dim)
        self.halo_x[halo] = g.ndata["feat"][halo_gid].float()  # one-time replica (setup bytes)
        owner = self.pb.nid2partid(halo_gid)
        # the halo sync's bookkeeping, by position in `halo`: each owner's positions, and the step
        # each row of each history table was last refreshed from its owner (a budgeted sync takes
        # the oldest first)
        self.halo_local, self.halo_gid, self.halo_owner = halo, halo_gid, owner
        self.halo_pos_by_owner = {int(m): torch.nonzero(owner == m).flatten() for m in torch.unique(owner)}
        self.halo_refreshed = torch.zeros(max(self.L - 2, 0), len(halo), dtype=torch.int64)
        self.sync_rng = torch.Generator().manual_seed(int(cfg.train.seed) + ctx.rank)
        self.roots_at_sync = 0
        # own nodes that other machines hold as halo nodes: the only own history rows anyone reads
        # (other machines, through the halo sync); pushes and write-backs are limited to them
        lists = [None] * ctx.world_size
        dist.all_gather_object(lists, {m: halo_gid[pos] for m, pos in self.halo_pos_by_owner.items()}
                               if ctx.local_rank == 0 else {})
        wanted = [d[self.me] for d in lists if self.me in d]
        wanted = torch.unique(torch.cat(wanted)) if wanted else torch.empty(0, dtype=torch.int64)
        self.boundary = torch.zeros(self.lg.num_nodes, dtype=torch.bool)
        self.boundary[self.pb.nid2localnid(wanted, self.me).long()] = True
        self.local_servers = servers_of(self.me)
        self.leader = ctx.local_rank == 0  # talks to this machine's servers for state they share
        self.local_bytes: Dict[str, int] = {}
        self.setup_bytes = (len(halo_gid) * (8 + in_dim * 4)) if self.leader else 0
        self.ages = [0, 0, 0]  # sum, count, max of ages of history rows used (here and at owners)
        self.stats = {"roots": 0, "rounds": 0, "owner_nodes": 0, "cg_nodes": 0, "answers": 0,
                      "lag_sum": 0, "lag_max": 0, "merged": 0, "computations": 0, "grad_rows": 0,
                      "owner_grad_rows": 0, "sync_rows": 0}
        # (node, layer) computations: done, had requests not been merged, had nothing been fused
        # (trainer and owners; graph.fusion_counts)
        self.fusion = [0, 0, 0]
        self.prefetch, self.fused = int(pcfg.prefetch), bool(pcfg.fusion)
        self.background: List[dict] = []  # pending maps of history and weight traffic
        self.sync_pending = None  # a halo sync whose answers are not yet stored
        # grad=push: parameter gradients the owners of this machine computed from other trainers'
        # pushed rows (pulled from the local servers in the background), added before the next backward
        self.push = pcfg.grad == "push"
        self.owner_grads: Dict[str, torch.Tensor] = {}
        self.grad_pull = None
        self.step = 0
        self.last_sync = 0
        self.weights_version = -1

        meta = dict(kind=cfg.model.name, in_dim=in_dim, hidden=cfg.model.hidden, out_dim=self.num_classes,
                    layers=self.L, dropout=float(cfg.model.dropout), heads=cfg.model.heads,
                    fanouts=self.fanouts, bits=self.bits, seed=int(cfg.train.seed) + self.me,
                    fusion=bool(pcfg.fusion))
        # where the owners' preparation runs: this process (engine.py) or the graph servers
        self.engine = None
        if pcfg.engine == "trainer":
            parts = [None] * ctx.world_size
            dist.all_gather_object(parts, self.me)
            group = dist.new_group(backend="gloo")  # the rounds' own group: they run beside DDP's all-reduce
            self.engine = TrainerEngine(self.lg, self.local_feat, self.halo_x, self.boundary, self.model, meta,
                                        self.pb, {p: r for r, p in enumerate(parts)}, group)
        elif self.leader:
            self._local_call("setup", [LampSetupRequest(meta, halo, self.halo_x[halo],
                                                        torch.nonzero(self.boundary).flatten())])
        dist.barrier()
        self._init_histories()
        self._ship_weights()
        dist.barrier()
        self.log.info("lamp: %d train nodes on this trainer, %d classes, %d local nodes (%d halo), %d bits, "
                      "histories initialised by one layer-wise inference pass", len(self.train_nids),
                      self.num_classes, self.lg.num_nodes, len(halo), self.bits)

    # --- helpers ---------------------------------------------------------------------------
    def _local(self, category: str, nbytes: int) -> None:
        self.local_bytes[category] = self.local_bytes.get(category, 0) + int(nbytes)

    def _local_call(self, category: str, requests: list) -> list:
        """Every request to every graph server of this machine (loopback)."""
        pairs = [(s, r) for r in requests for s in self.local_servers]
        for _, r in pairs:
            self._local(category, payload_bytes(r))
        return call(pairs)

    def _push(self, layer: int, ids: torch.Tensor, x: torch.Tensor, version: int) -> HistoryPushRequest:
        q = quantize(x, self.bits)
        return HistoryPushRequest(layer, ids, q.codes, q.scale, q.offset,
                                  torch.full((len(ids),), version, dtype=torch.int64))

    def _init_histories(self) -> None:
        """h^(1..L-1) of every node of this partition from one whole-graph layer-wise pass."""
        self.evaluator._inference()  # every trainer: collective
        if not self.leader:
            return
        reqs = []
        halo = ~self.lg.inner
        for layer in range(1, self.L - 1):
            rows = self.evaluator.outputs[layer - 1][self.lg.nid]
            self.setup_bytes += int(halo.sum()) * (8 + rows.shape[1] * 4)
            if self.engine is not None:
                self.engine.history.push(layer, torch.arange(self.lg.num_nodes), rows, 0)
            else:
                reqs.append(self._push(layer, torch.arange(self.lg.num_nodes), rows, 0))
        if reqs:
            self._local_call("setup", reqs)

    def _lower_layers(self) -> Dict[str, torch.Tensor]:
        """The weights the owners compute with: every layer but the top."""
        return {k: v.detach() for k, v in self.model.state_dict().items()
                if not k.startswith(f"layers.{self.L - 1}.")}

    def _ship_weights(self) -> None:
        if not self.leader or self.weights_version == self.step:
            return
        state = self._lower_layers()
        if self.engine is not None:
            self.engine.set_weights(self.step, state)  # an in-process copy
        else:
            self._local_call("weights", [SetWeightsRequest(self.step, list(state), list(state.values()))])
        self.weights_version = self.step

    def _sync_histories(self) -> None:
        """Ask the owners for rows of this machine's halo nodes (stored when the answers are back:
        `_store_sync`, at once or, with prefetch, next step).

        pipeline.sync_budget=r (default): r x the LAMP answer rows this trainer received since the
        last sync, the rows refreshed longest ago first, over every table and halo node (a round
        robin). The sync then adds at most a share r to the per-batch LAMP traffic whatever the
        number of layers; the price is older halo rows, reported as history_age. null: every
        halo row its owner wrote since the last sync, one copy per table: the bytes grow with the
        layers. The margin of `since`: trainers can be a step apart, and an owner's server stamps
        what it computes with the version of its weights, up to weight_sync_every (+ prefetch)
        steps old."""
        layers = list(range(1, self.L - 1))
        if not layers:  # two layers: no history is ever read
            return
        if self.engine is not None and self.sync_pending is not None:
            return  # the last sync's answers have not come back yet (they ride on a later round)
        # who answers for machine m: its graph servers, or (engine=trainer) its trainer
        answerers = servers_of if self.engine is None else (lambda m: [m])
        budget = self.cfg.pipeline.sync_budget
        pairs, plan = [], []  # plan: per request, (table index, halo position) of each row it asks for
        if budget is None:
            since = max(self.last_sync - 2 - int(self.cfg.pipeline.weight_sync_every) - self.prefetch, 0)
            for m, pos in self.halo_pos_by_owner.items():
                rows = (torch.arange(len(layers)).repeat_interleave(len(pos)), pos.repeat(len(layers)))
                # every server of the owner: each writes back what it prepared (servers_per_machine > 1)
                for server in answerers(m):
                    pairs.append((server, HistoryPullRequest(layers, [], self.halo_gid[pos], True, since)))
                    plan.append(rows)
        else:
            n = budget * (self.stats["roots"] - self.roots_at_sync)
            table, pos = oldest_first(self.halo_refreshed, int(n), self.sync_rng)
            owner = self.halo_owner[pos]
            for m in torch.unique(owner).tolist():
                mine = torch.nonzero(owner == m).flatten()
                mine = mine[torch.argsort(table[mine], stable=True)]  # the request lists table after table
                counts = torch.bincount(table[mine], minlength=len(layers)).tolist()
                for server in answerers(m):
                    pairs.append((server, HistoryPullRequest(layers, counts, self.halo_gid[pos[mine]], True, -1)))
                    plan.append((table[mine], pos[mine]))
        self.roots_at_sync = self.stats["roots"]
        if self.engine is not None:  # asked on the next round; the answers come back with it
            for m, req in pairs:
                self.engine.ask(m, "sync", req.__getstate__())
            self.sync_pending = (pairs, plan, None) if pairs else None
        else:
            self.stats["rounds"] += 1 if pairs else 0
            self.sync_pending = (pairs, plan, send(pairs))
        self.last_sync = self.step

    def _store_sync(self, answers: Optional[dict] = None) -> None:
        """Store the answers of the halo sync in flight in this machine's histories (its servers',
        or with engine=trainer, the engine's: `answers` by owner, from the round that carried it)."""
        if self.sync_pending is None or (self.engine is not None and not answers):
            return  # (engine=trainer: a round sent before the sync was asked carries none of it)
        pairs, plan, pending = self.sync_pending
        self.sync_pending = None
        res = receive(pending) if self.engine is None else [answers[m] for m, _ in pairs]
        rows: Dict[int, list] = {}  # table index -> [(halo positions, QRows, stamps)], one per answer
        for (_, req), r, (table, pos) in zip(pairs, res, plan):
            if self.engine is None:  # (the engine counts what its rounds move)
                self.ctx.counter.add("history_sync", payload_bytes(req) + payload_bytes(r))
            # an answer lists the rows asked for in order, or (since >= 0) those at positions `sel`
            sel = r.sel if req.since >= 0 else torch.arange(len(pos))
            for t in torch.unique(table[sel]).tolist():
                idx = torch.nonzero(table[sel] == t).flatten()
                rows.setdefault(t, []).append((pos[sel[idx]], QRows(
                    r.codes[idx], r.scale[idx] if len(r.scale) else r.scale,
                    r.offset[idx] if len(r.offset) else r.offset), r.stamp[idx]))
        pushes = []
        for t, parts in rows.items():
            pos, stamp = torch.cat([p[0] for p in parts]), torch.cat([p[2] for p in parts])
            q = [torch.cat([p[1][j] for p in parts]) for j in range(3)]
            if len(self.local_servers) > 1:  # a node written by several servers of its owner: the newest row
                order_ = torch.argsort(stamp, descending=True, stable=True)
                uniq, inv = torch.unique(pos[order_], return_inverse=True)
                first = torch.full((len(uniq),), len(inv), dtype=torch.int64).scatter_reduce(
                    0, inv, torch.arange(len(inv)), "amin")
                keep = order_[first]
                pos, stamp = pos[keep], stamp[keep]
                q = [x[keep] if len(x) else x for x in q]
            self.halo_refreshed[t, pos] = self.step
            self.stats["sync_rows"] += len(pos)
            if self.engine is not None:
                self.engine.history.push_codes(t + 1, self.halo_local[pos], QRows(*q), stamp)
            else:
                pushes.append(HistoryPushRequest(t + 1, self.halo_local[pos], q[0], q[1], q[2], stamp))
        if pushes:
            self._send_local("history_sync_store", pushes)

    # --- one batch ------------------------------------------------------------------------
    def _issue(self, seeds: torch.Tensor) -> Batch:
        """Build the batch's computation graph and send its requests (LAMP to the owners, the
        history rows of the middle blocks to this machine's server); nothing is waited for."""
        lg, L = self.lg, self.L
        # the top block first: its leaves (the seeds' remote neighbours) go to their owners at
        # once, and the owners prepare them while this trainer builds the rest of its graph
        top = lg.build(self.pb.nid2localnid(seeds, self.me).long(), self.fanouts[L - 1:])
        top_gid = lg.nid[top.leaves[0]]
        owner = self.pb.nid2partid(top_gid)
        masks, lamp = [], []
        for m in torch.unique(owner).tolist():
            mask = owner == m
            # the answerer: one of machine m's graph servers, or (engine=trainer) machine m's trainer
            servers = servers_of(m) if self.engine is None else [m]
            lamp.append((servers[torch.randint(len(servers), (1,)).item()], LampRequest(top_gid[mask], self.step)))
            masks.append(mask)
        if self.engine is not None:
            pending = self.engine.submit({m: req.roots for m, req in lamp})
        else:
            pending = send(lamp)
        low = lg.build(top.inner_src[0], self.fanouts[:L - 1])
        cg = CompGraph(low.blocks + top.blocks, low.dst + top.dst, low.inner_src + top.inner_src,
                       low.leaves + top.leaves)
        counts = fusion_counts(cg)
        top_rows = None
        if not self.fused:
            counts = (counts[2],) * 3  # the unfolded graph is computed: nothing saved
            tree = unfold(cg)  # its top leaves repeat: one per path, each takes its root's answer
            pos = torch.full((lg.num_nodes,), -1, dtype=torch.int64)
            pos[cg.leaves[-1]] = torch.arange(len(cg.leaves[-1]))
            cg, top_rows = tree, pos[tree.leaves[-1]]
        for i in range(3):
            self.fusion[i] += counts[i]
        mids = list(range(1, L - 1))
        pull = None
        if mids:
            pull = HistoryPullRequest(mids, [len(cg.leaves[k]) for k in mids], torch.cat([cg.leaves[k] for k in mids]))
            if self.engine is not None:  # the rows themselves: the histories are in this process
                pull = pull.rows(self.engine.history, self.pb)
            else:
                send([(self.local_servers[0], pull)], pending)
        self.stats["roots"] += len(top_gid)
        self.stats["rounds"] += 1 if lamp else 0
        self.stats["cg_nodes"] += cg.num_nodes
        # the local gathers here, not in _complete: owner_wait then measures only the owners
        x = self.local_feat[cg.inner_src[0]].float()
        return Batch(seeds, cg, top_gid, masks, lamp, pull, pending, top_rows, x, self.halo_x[cg.leaves[0]])

    def _complete(self, b: Batch):
        """Wait for the batch's answers; returns (cg, input features, leaf rows per block)."""
        cg, x, leaves = b.cg, b.x, [b.x_leaves]
        if self.engine is not None:
            got = b.pending.result()  # the round's answers (engine.RoundResult)
            res = [got.lamp[m] for m, _ in b.lamp] + ([b.pull] if b.pull is not None else [])
            for nbytes in got.nbytes.values():
                for cat, n in nbytes.items():
                    self.ctx.counter.add(cat, n)
            self._store_sync(got.sync)
        else:
            res = receive(b.pending)
        hidden = self.cfg.model.hidden
        top_h = torch.zeros(len(b.top_gid), hidden)
        for (_, req), r, mask in zip(b.lamp, res, b.masks):
            if self.engine is None:
                self.ctx.counter.add("lamp_request", payload_bytes(req))
                self.ctx.counter.add("lamp_response", payload_bytes(r))
            top_h[mask] = dequantize(QRows(r.codes, r.scale, r.offset), self.bits, hidden)
            self.ages[0] += r.ages[0]
            self.ages[1] += r.ages[1]
            self.ages[2] = max(self.ages[2], r.ages[2])
            # model version lag of the answer: steps between the owner's weights and this step
            lag = self.step - r.version
            self.stats["answers"] += 1
            self.stats["lag_sum"] += lag
            self.stats["lag_max"] = max(self.stats["lag_max"], lag)
            computed, separate, unfolded, merged = r.counts
            self.stats["owner_nodes"] += computed
            self.stats["merged"] += merged
            self.stats["computations"] += 1 if merged else 0
            self.fusion[0] += computed
            self.fusion[1] += separate
            self.fusion[2] += unfolded
        if b.pull is not None:
            r = res[-1]
            if self.engine is None:
                self._local("history_pull", payload_bytes(b.pull) + payload_bytes(r))
            rows = dequantize(QRows(r.codes, r.scale, r.offset), self.bits, hidden)
            s, c, mx = ages_summary([self.step - r.stamp])
            self.ages[0] += s
            self.ages[1] += c
            self.ages[2] = max(self.ages[2], mx)
            leaves += list(torch.split(rows, [len(cg.leaves[k]) for k in range(1, self.L - 1)]))
        if self.push:
            top_h.requires_grad_(True)  # its gradient goes back to the owners
        leaves.append(top_h if b.top_rows is None else top_h[b.top_rows])
        return cg, x, leaves, top_h

    def batches_per_epoch(self) -> Optional[int]:
        return self.num_batches

    def train_epoch(self, epoch: int, progress) -> Tuple[float, int]:
        """The asynchronous pipeline: the requests of batch i+k (k = pipeline.prefetch) are in
        flight while batch i trains; batches are trained in the order drawn. With k > 0, history
        pushes, weight shipping and the halo sync are sent without waiting, and their answers
        collected a step later (a server handles one connection's requests in order, so a later
        request still sees an earlier push). Nothing is in flight between epochs."""
        counter, timer = self.ctx.counter, self.timer
        world = self.ctx.world_size
        self.step = self.batches
        self._ship_weights()  # (after a resume the servers hold the initial weights)
        self.ddp.train()
        total, n = 0.0, 0
        order = self.train_nids[torch.randperm(len(self.train_nids))]
        seeds_of = list(torch.tensor_split(order, self.num_batches))
        for b, (cg, x, leaves, top_h) in pipelined(seeds_of, self.prefetch, self._issue, self._complete, timer):
            y = self.local_label[self.pb.nid2localnid(b.seeds, self.me).long()].long()
            with timer("compute"):
                allreduce0 = timer.total["allreduce"]
                out, hidden = self.ddp(cg.blocks, x, leaves)
                loss = F.cross_entropy(out, y)
                self.optimizer.zero_grad()
                if self.push:  # the owners' gradients join this step's all-reduce (DDP sums into .grad)
                    self._apply_owner_grads()
                loss.backward()  # DDP all-reduces the gradients of the trainer's own sub-graph
                self.optimizer.step()
            timer.add("compute", allreduce0 - timer.total["allreduce"])
            counter.add("allreduce", ring_allreduce_bytes(self.param_bytes, world))
            with timer("history"):
                if self.push:
                    self._push_grads(b, top_h.grad)
                self._after_step(cg, hidden)
            loss_value = loss.item()
            total += loss_value
            n += 1
            self.ctx.heartbeat.beat()
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss_value:.3f}", refresh=False)
        with timer("history"):
            self._drain_background()
            # every trainer has its answers: every server's sends of this epoch are done before any
            # machine reads its wire counters (the epoch's window, base.run)
            dist.barrier()
        return (total / n if n else float("nan")), n

    def _after_step(self, cg: CompGraph, hidden: List[torch.Tensor]) -> None:
        """History pushes of the batch's fresh rows, the weights every weight_sync_every steps,
        the halo sync every sync_every steps; waited for at once with prefetch 0, else in the
        background (collected at the next step)."""
        cfg = self.cfg
        self._drain_background()
        pushes = []
        for k, h in enumerate(hidden[:self.L - 2]):  # fresh h^(1..L-2) of the batch's boundary nodes
            keep = self.boundary[cg.dst[k]]
            if bool(keep.any()):
                if self.engine is not None:
                    self.engine.history.push(k + 1, cg.dst[k][keep], h[keep], self.step)
                else:
                    pushes.append(self._push(k + 1, cg.dst[k][keep], h[keep], self.step))
        # own rows are read only by other machines' halo sync, which asks every server of this
        # machine: one copy is enough (the halo rows and the weights go to every server)
        self._send_local(None, pushes, self.local_servers[:1])
        self.step += 1
        if self.step % cfg.pipeline.weight_sync_every == 0 and self.leader:
            state = self._lower_layers()
            if self.engine is not None:
                self.engine.set_weights(self.step, state)
            else:
                self._send_local(None, [SetWeightsRequest(self.step, list(state), list(state.values()))])
            self.weights_version = self.step
        if self.step % cfg.pipeline.sync_every == 0 and self.leader:
            self._sync_histories()
        if self.push and self.grad_pull is None and self.engine is None:  # what the owners here computed for other trainers
            pairs = [(srv, GradPullRequest()) for srv in self.local_servers]
            for _, r in pairs:
                self._local("grad_pull", payload_bytes(r))
            self.grad_pull = send(pairs)
        if self.prefetch == 0:
            self._drain_background()

    def _push_grads(self, b: Batch, grad: Optional[torch.Tensor]) -> None:
        """grad=push: each owner gets the gradient rows of the roots it answered (quantized like
        the answers; the acks are collected in the background)."""
        if grad is None:
            return
        for (server, req), mask in zip(b.lamp, b.masks):
            q = quantize(grad[mask], self.bits)
            if self.engine is not None:  # rides on the next round (which counts its bytes)
                self.engine.ask(server, "grad", (req.roots, q.codes, q.scale, q.offset))
                continue
            push = GradPushRequest(req.roots, q.codes, q.scale, q.offset)
            self.ctx.counter.add("grad_push", payload_bytes(push) + payload_bytes(AckResponse()))
            self.background.append(send([(server, push)]))
        self.stats["grad_rows"] += len(grad)
        if self.engine is None:
            self.stats["rounds"] += 1 if b.lamp else 0  # a second round to the owners per batch

    def _collect_owner_grads(self) -> None:
        if self.engine is not None:  # what this trainer's engine computed from its peers' rows
            grads, rows = self.engine.take_owner_grads()
            add_grads(self.owner_grads, grads.items())
            self.stats["owner_grad_rows"] += rows
            return
        if self.grad_pull is None:
            return
        for r in receive(self.grad_pull):
            add_grads(self.owner_grads, zip(r.names, r.tensors))
            self.stats["owner_grad_rows"] += r.rows
        self.grad_pull = None

    def _apply_owner_grads(self) -> None:
        self._collect_owner_grads()
        params = dict(self.model.named_parameters())
        for name, t in self.owner_grads.items():
            params[name].grad = t.clone()
        self.owner_grads = {}

    def _send_local(self, category: Optional[str], requests: list, servers: Optional[list] = None) -> None:
        """Send requests to every graph server of this machine (or to `servers`);
        `_drain_background` collects the acks."""
        pairs = [(s, r) for r in requests for s in (servers or self.local_servers)]
        for _, r in pairs:
            cat = category or ("weights" if isinstance(r, SetWeightsRequest) else "history_push")
            self._local(cat, payload_bytes(r))
        if pairs:
            self.background.append(send(pairs))

    def _drain_background(self) -> None:
        """Collect everything sent in the background: the halo sync's answers (then stored) and
        the acks of pushes and weights."""
        self._store_sync()
        self._collect_owner_grads()
        while self.background:
            receive(self.background.pop(0))

    def evaluate(self) -> Tuple[float, float]:
        return self.evaluator()

    def extra_summary(self):
        mine = {"ages": self.ages, "stats": self.stats, "local": self.local_bytes, "setup": self.setup_bytes,
                "batches": self.batches, "fusion": self.fusion}
        ranks = [None] * self.ctx.world_size
        dist.all_gather_object(ranks, mine)
        batches = sum(r["batches"] for r in ranks) or 1
        age_sum = sum(r["ages"][0] for r in ranks)
        age_cnt = sum(r["ages"][1] for r in ranks)
        local: Dict[str, int] = {}
        for r in ranks:
            for k, v in r["local"].items():
                local[k] = local.get(k, 0) + v
        stat = {k: sum(r["stats"][k] for r in ranks) for k in self.stats}
        done, separate, unfolded = (sum(r["fusion"][i] for r in ranks) for i in range(3))
        p = self.cfg.pipeline
        return {"fanouts": self.fanouts, "num_classes": self.num_classes, "bits": self.bits,
                "engine": p.engine, "grad": p.grad, "sync_every": p.sync_every, "weight_sync_every": p.weight_sync_every,
                "sync_budget": p.sync_budget,
                # halo history rows the syncs brought to this machine (per batch of a trainer)
                "history_sync_rows_per_batch": stat["sync_rows"] / batches,
                "prefetch": int(p.prefetch), "fusion": bool(p.fusion),
                # staleness the pipeline adds: steps between the owners' weights and the step that
                # uses their answer (at most prefetch + weight_sync_every, +1 as trainers may be a
                # step apart)
                "owner_version_lag_mean": stat["lag_sum"] / stat["answers"] if stat["answers"] else None,
                "owner_version_lag_max": max(r["stats"]["lag_max"] for r in ranks),
                # (node, layer) computations per batch, trainer and owners: done, and the share saved
                # against no fusion at all and against owners not merging queued requests
                # (graph.fusion_counts)
                "nodes_computed_per_batch": done / batches,
                "fusion_saved_share": 1 - done / unfolded if unfolded else 0.0,
                "fusion_saved_share_requests": 1 - done / separate if separate else 0.0,
                "owner_requests_per_computation": (stat["merged"] / stat["computations"]
                                                   if stat["computations"] else None),
                # grad=push: gradient rows sent to owners, and rows whose parameter gradients the
                # owners handed to their machine's trainer (one step or more later)
                "grad_rows_pushed_per_batch": stat["grad_rows"] / batches,
                "owner_grad_rows_joined_per_batch": stat["owner_grad_rows"] / batches,
                "history_age_mean": age_sum / age_cnt if age_cnt else None,
                "history_age_max": max(r["ages"][2] for r in ranks),
                "history_rows_used_per_batch": age_cnt / batches,
                "roots_per_batch": stat["roots"] / batches,
                # rounds of requests that cross machines: the LAMP round, plus the halo syncs
                "rpc_round_trips_per_batch": stat["rounds"] / batches,
                "owner_nodes_computed_per_batch": stat["owner_nodes"] / batches,
                "trainer_cg_nodes_per_batch": stat["cg_nodes"] / batches,
                "local_bytes_by_category": local,
                "setup_bytes": sum(r["setup"] for r in ranks)}
