"""The LAMP pipeline (trainer side); the design is described in degnn/pipelines/lamp/__init__.py."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import dgl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from degnn.metrics import ring_allreduce_bytes
from degnn.models import build_model
from degnn.pipelines.base import Pipeline
from degnn.pipelines.distdgl import num_classes_of
from degnn.pipelines.evaluation import DistEvaluator, dataset_evaluator
from degnn.pipelines.lamp.graph import CompGraph, LocalGraph
from degnn.pipelines.lamp.history import ages_summary
from degnn.pipelines.lamp.quantize import QRows, check_bits, dequantize, quantize
from degnn.pipelines.lamp.service import (HistoryPullRequest, HistoryPushRequest, LampRequest,
                                          LampSetupRequest, SetWeightsRequest, call, payload_bytes,
                                          receive, send, servers_of)

GRAD_MODES = ("stop",)


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


def check_lamp_config(pcfg, model_cfg) -> None:
    check_bits(int(pcfg.bits))
    if pcfg.grad not in GRAD_MODES:
        raise ValueError(f"pipeline.grad={pcfg.grad}: this version implements {', '.join(GRAD_MODES)} "
                         f"(owner answers are constants, GAS semantics); push-pull gradients are issue 9")
    if model_cfg.layers < 2:
        raise ValueError("pipeline=lamp needs model.layers >= 2 (with one layer there is nothing to prepare)")
    if pcfg.sync_every < 1 or pcfg.weight_sync_every < 1:
        raise ValueError("pipeline.sync_every and pipeline.weight_sync_every must be >= 1")


class LAMPPipeline(Pipeline):
    name = "lamp"
    metric = "acc"

    def setup(self) -> None:
        ctx, cfg = self.ctx, self.cfg
        pcfg = cfg.pipeline
        self.check_task(cfg)
        check_lamp_config(pcfg, cfg.model)
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
        halo = torch.nonzero(~self.lg.inner).flatten()
        halo_gid = self.lg.nid[halo]
        self.halo_x = torch.zeros(self.lg.num_nodes, in_dim)
        self.halo_x[halo] = g.ndata["feat"][halo_gid].float()  # one-time replica (setup bytes)
        owner = self.pb.nid2partid(halo_gid)
        self.halo_by_owner = {int(m): (halo[owner == m], halo_gid[owner == m]) for m in torch.unique(owner)}
        # own nodes that other machines hold as halo nodes: the only own history rows anyone reads
        # (other machines, through the halo sync); pushes and write-backs are limited to them
        lists = [None] * ctx.world_size
        dist.all_gather_object(lists, {m: gids for m, (_, gids) in self.halo_by_owner.items()}
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
        self.stats = {"roots": 0, "rounds": 0, "owner_nodes": 0, "cg_nodes": 0}
        self.step = 0
        self.last_sync = 0
        self.weights_version = -1

        if self.leader:
            meta = dict(kind=cfg.model.name, in_dim=in_dim, hidden=cfg.model.hidden, out_dim=self.num_classes,
                        layers=self.L, dropout=float(cfg.model.dropout), heads=cfg.model.heads,
                        fanouts=self.fanouts, bits=self.bits, seed=int(cfg.train.seed) + self.me)
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
            reqs.append(self._push(layer, torch.arange(self.lg.num_nodes), rows, 0))
        self._local_call("setup", reqs)

    def _ship_weights(self) -> None:
        if not self.leader or self.weights_version == self.step:
            return
        state = {k: v.detach() for k, v in self.model.state_dict().items()
                 if not k.startswith(f"layers.{self.L - 1}.")}
        self._local_call("weights", [SetWeightsRequest(self.step, list(state), list(state.values()))])
        self.weights_version = self.step

    def _sync_histories(self) -> None:
        """Pull the rows of this machine's halo nodes that their owners wrote since the last
        sync and store them locally. The margin: trainers can be a step apart, and an owner's
        server stamps what it computes with the version of its weights, up to weight_sync_every
        steps old."""
        since = max(self.last_sync - 2 - int(self.cfg.pipeline.weight_sync_every), 0)
        layers = list(range(1, self.L - 1))
        if not layers:  # two layers: no history is ever read
            return
        pairs, order = [], []
        for m, (_, gids) in self.halo_by_owner.items():
            pairs.append((servers_of(m)[0], HistoryPullRequest(layers, [], gids, True, since)))
            order.append(m)
        res = call(pairs)
        self.stats["rounds"] += 1 if pairs else 0
        pushes = []
        for (_, req), r, m in zip(pairs, res, order):
            self.ctx.counter.add("history_sync", payload_bytes(req) + payload_bytes(r))
            local_ids = self.halo_by_owner[m][0]
            n = len(local_ids)
            for i, layer in enumerate(layers):
                mine = (r.sel >= i * n) & (r.sel < (i + 1) * n)
                if not bool(mine.any()):
                    continue
                idx = torch.nonzero(mine).flatten()
                q = QRows(r.codes[idx], r.scale[idx] if len(r.scale) else r.scale,
                          r.offset[idx] if len(r.offset) else r.offset)
                pushes.append(HistoryPushRequest(layer, local_ids[r.sel[idx] - i * n], q.codes, q.scale,
                                                 q.offset, r.stamp[idx]))
        if pushes:
            self._local_call("history_sync_store", pushes)
        self.last_sync = self.step

    # --- one batch ------------------------------------------------------------------------
    def _batch(self, seeds: torch.Tensor):
        lg, L = self.lg, self.L
        # the top block first: its leaves (the seeds' remote neighbours) go to their owners at
        # once, and the owners prepare them while this trainer builds the rest of its graph
        top = lg.build(self.pb.nid2localnid(seeds, self.me).long(), self.fanouts[L - 1:])
        top_gid = lg.nid[top.leaves[0]]
        owner = self.pb.nid2partid(top_gid)
        masks, lamp = [], []
        for m in torch.unique(owner).tolist():
            mask = owner == m
            servers = servers_of(m)
            lamp.append((servers[torch.randint(len(servers), (1,)).item()], LampRequest(top_gid[mask], self.step)))
            masks.append(mask)
        pending = send(lamp)
        low = lg.build(top.inner_src[0], self.fanouts[:L - 1])
        cg = CompGraph(low.blocks + top.blocks, low.dst + top.dst, low.inner_src + top.inner_src,
                       low.leaves + top.leaves)
        mids = list(range(1, L - 1))
        pull = None
        if mids:
            pull = HistoryPullRequest(mids, [len(cg.leaves[k]) for k in mids], torch.cat([cg.leaves[k] for k in mids]))
            send([(self.local_servers[0], pull)], pending)
        x = self.local_feat[cg.inner_src[0]].float()
        leaves = [self.halo_x[cg.leaves[0]]]
        res = receive(pending)
        self.stats["cg_nodes"] += cg.num_nodes
        top_h = torch.zeros(len(top_gid), self.cfg.model.hidden)
        ages = []
        for (_, req), r, mask in zip(lamp, res, masks):
            self.ctx.counter.add("lamp_request", payload_bytes(req))
            self.ctx.counter.add("lamp_response", payload_bytes(r))
            top_h[mask] = dequantize(QRows(r.codes, r.scale, r.offset), self.bits, top_h.shape[1])
            self.ages[0] += r.ages[0]
            self.ages[1] += r.ages[1]
            self.ages[2] = max(self.ages[2], r.ages[2])
            self.stats["owner_nodes"] += r.computed
        self.stats["roots"] += len(top_gid)
        self.stats["rounds"] += 1 if lamp else 0
        if pull is not None:
            r = res[-1]
            self._local("history_pull", payload_bytes(pull) + payload_bytes(r))
            rows = dequantize(QRows(r.codes, r.scale, r.offset), self.bits, top_h.shape[1])
            ages.append(self.step - r.stamp)
            leaves += list(torch.split(rows, [len(cg.leaves[k]) for k in mids]))
        leaves.append(top_h)
        s, c, mx = ages_summary(ages)
        self.ages[0] += s
        self.ages[1] += c
        self.ages[2] = max(self.ages[2], mx)
        return cg, x, leaves

    def batches_per_epoch(self) -> Optional[int]:
        return self.num_batches

    def train_epoch(self, epoch: int, progress) -> Tuple[float, int]:
        cfg, counter = self.cfg, self.ctx.counter
        world = self.ctx.world_size
        self.step = self.batches
        self._ship_weights()  # (after a resume the servers hold the initial weights)
        self.ddp.train()
        total, n = 0.0, 0
        order = self.train_nids[torch.randperm(len(self.train_nids))]
        for seeds in torch.tensor_split(order, self.num_batches):
            cg, x, leaves = self._batch(seeds)
            y = self.ctx.graph.ndata["label"][seeds].long()
            out, hidden = self.ddp(cg.blocks, x, leaves)
            loss = F.cross_entropy(out, y)
            self.optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients of the trainer's own sub-graph
            counter.add("allreduce", ring_allreduce_bytes(self.param_bytes, world))
            self.optimizer.step()
            pushes = []
            for k, h in enumerate(hidden[:self.L - 2]):  # fresh h^(1..L-2) of the batch's boundary nodes
                keep = self.boundary[cg.dst[k]]
                if bool(keep.any()):
                    pushes.append(self._push(k + 1, cg.dst[k][keep], h[keep], self.step))
            self.step += 1
            if self.step % cfg.pipeline.weight_sync_every == 0 and self.leader:
                state = {k: v.detach() for k, v in self.model.state_dict().items()
                         if not k.startswith(f"layers.{self.L - 1}.")}
                pushes.append(SetWeightsRequest(self.step, list(state), list(state.values())))
                self.weights_version = self.step
            self._local_call_mixed(pushes)
            if self.step % cfg.pipeline.sync_every == 0 and self.leader:
                self._sync_histories()
            total += loss.item()
            n += 1
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        return (total / n if n else float("nan")), n

    def _local_call_mixed(self, requests: list) -> None:
        pairs = [(s, r) for r in requests for s in self.local_servers]
        for _, r in pairs:
            self._local("weights" if isinstance(r, SetWeightsRequest) else "history_push", payload_bytes(r))
        call(pairs)

    def evaluate(self) -> Tuple[float, float]:
        return self.evaluator()

    def extra_summary(self):
        mine = {"ages": self.ages, "stats": self.stats, "local": self.local_bytes, "setup": self.setup_bytes,
                "batches": self.batches}
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
        p = self.cfg.pipeline
        return {"fanouts": self.fanouts, "num_classes": self.num_classes, "bits": self.bits,
                "grad": p.grad, "sync_every": p.sync_every, "weight_sync_every": p.weight_sync_every,
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
