"""The LAMP pipeline (trainer side); the design is described in degnn/pipelines/lamp/__init__.py."""
from __future__ import annotations

import os
import tempfile
from collections import deque
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from degnn.metrics import ring_allreduce_bytes, timed_allreduce_hook
from degnn.pipelines.base import Pipeline
from degnn.runtime.own_rows import own_rows
from degnn.pipelines.lamp.codec import make_codec
from degnn.pipelines.lamp.config import LAMPConfig
from degnn.pipelines.lamp.compute import (GradRows, HaloFeatures, HistoryPull, HistoryRows, Roots, Weights, add_grads,
                                          halo_table)
from degnn.pipelines.lamp.graph import CompGraph, LocalGraph, fusion_counts, unfold
from degnn.pipelines.lamp.halo import HaloSync
from degnn.pipelines.lamp.history import ages_summary
from degnn.pipelines.lamp.owners import Ticket, make_owners
from degnn.pipelines.lamp.summary import LAMPSummary, lamp_summary

GRAD_MODES = ("stop", "push")


def chunks(n: int, row_bytes: int, chunk_bytes: int):
    """Slices of range(n) of about `chunk_bytes` worth of rows each (at least one row): the
    set-up's reads stream in such pieces (pipeline.setup_chunk_mb)."""
    step = max(1, int(chunk_bytes) // max(1, row_bytes))
    for lo in range(0, n, step):
        yield slice(lo, min(n, lo + step))

ENGINES = ("server", "trainer")
STORES = ("memory", "disk")  # pipeline.halo_store, pipeline.history_store
ROOTS = ("owners", "histories")


class LampNet(nn.Module):
    """The model over a locality-aware computation graph: block k's sources are the previous
    block's outputs followed by that block's leaf rows (constants). Returns the top block's rows
    (the seeds'), or with `loss` (the task's seed_loss) and a batch's target the batch's loss,
    computed inside the DDP forward (a link model's decoder runs there)."""

    def __init__(self, gnn, loss=None):
        super().__init__()
        self.gnn = gnn
        self.loss = loss

    def forward(self, blocks, x_inner: torch.Tensor, leaves: List[torch.Tensor], target=None):
        h, hidden = x_inner, []
        for k, block in enumerate(blocks):
            h = self.gnn.layer_forward(k, block, torch.cat([h, leaves[k]]))
            if k < len(blocks) - 1:
                hidden.append(h.detach())
        if self.loss is not None and target is not None:
            h = self.loss(self.gnn, h, target)
        return h, hidden


def check_lamp_config(pcfg, model_cfg) -> None:
    make_codec(pcfg.codec, 1, int(pcfg.bits))  # a known codec, and bits it encodes
    if int(pcfg.halo_bits) not in (32, 16, 8):
        raise ValueError(f"pipeline.halo_bits={pcfg.halo_bits}: choose 32 (the halo nodes' features exact), 16 or 8 "
                         f"(rounded, for machines short of memory)")
    if pcfg.engine not in ENGINES:
        raise ValueError(f"pipeline.engine={pcfg.engine}: choose server (the owners' preparation runs in DGL's graph "
                         f"servers) or trainer (in each machine's trainer process, over torch.distributed)")
    if pcfg.halo_store not in STORES:
        raise ValueError(f"pipeline.halo_store={pcfg.halo_store}: choose memory (the halo nodes' features in RAM) "
                         f"or disk (in a memory-mapped file under $TMPDIR, paged in and out by the kernel)")
    if pcfg.history_store not in STORES:
        raise ValueError(f"pipeline.history_store={pcfg.history_store}: choose memory (the history tables in RAM) "
                         f"or disk (in memory-mapped files under $TMPDIR, paged in and out by the kernel)")
    if pcfg.roots not in ROOTS:
        raise ValueError(f"pipeline.roots={pcfg.roots}: choose owners (the remote roots prepared by their owners, "
                         f"LAMP) or histories (read from this machine's histories, the ablation)")
    if pcfg.roots == "histories" and pcfg.grad == "push":
        raise ValueError("pipeline.roots=histories asks no owner, so there is nothing to push gradients to: "
                         "use pipeline.grad=stop")
    if pcfg.grad not in GRAD_MODES:
        raise ValueError(f"pipeline.grad={pcfg.grad}: this version implements {', '.join(GRAD_MODES)} "
                         f"(stop: owner answers are constants, GAS semantics; push: their gradients go back to the "
                         f"owners, P3-style)")
    if model_cfg.layers < 2:
        raise ValueError("pipeline=lamp needs model.layers >= 2 (with one layer there is nothing to prepare)")
    if pcfg.halo_sync_steps < 1 or pcfg.weight_sync_steps < 1:
        raise ValueError("pipeline.halo_sync_steps and pipeline.weight_sync_steps must be >= 1")
    if pcfg.sync_budget is not None and not pcfg.sync_budget >= 0:
        raise ValueError(f"pipeline.sync_budget must be >= 0 (halo rows per sync as a share of the LAMP answer "
                         f"rows since the last one) or null (every changed row), got {pcfg.sync_budget}")
    if pcfg.prefetch < 0:
        raise ValueError(f"pipeline.prefetch must be >= 0 (batches whose requests are in flight ahead), "
                         f"got {pcfg.prefetch}")
    if not pcfg.setup_chunk_mb > 0:
        raise ValueError(f"pipeline.setup_chunk_mb must be > 0 (MB of halo features or history rows "
                         f"the set-up reads at once), got {pcfg.setup_chunk_mb}")


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
    """One batch between its asks going out (`_issue`) and its answers coming back
    (`_complete`): the seeds, the trainer's computation graph, and what is in flight for it."""
    seeds: torch.Tensor
    cg: CompGraph
    top_gid: torch.Tensor       # the top block's leaves (roots at their owners), global ids
    masks: list                 # per LAMP ask (ticket.asks): which of top_gid it asked for
    ticket: Ticket              # the asks in flight (owners.Owners)
    top_rows: Optional[torch.Tensor]  # fusion=false: which answer each (repeated) top leaf takes
    x: torch.Tensor             # input features of the trainer's own nodes (local shared memory)
    x_leaves: torch.Tensor      # the halo leaves' input features (the setup replica)
    target: object = None       # what the task's loss compares the seeds' top rows with (Task.own_batch)


class LAMPPipeline(Pipeline):
    name = "lamp"
    tasks = ("node", "link")
    config_schema = LAMPConfig
    shortens_epochs = True  # train.batches_per_epoch: the first N batches of each epoch's shuffle
    byte_categories = {"lamp_request": "a batch's roots to the machines that own them",
                       "lamp_response": "the owners' prepared hidden states of those roots",
                       "history_sync": "halo history rows pulled from their owners",
                       "grad_push": "grad=push: gradient rows of the answers back to their owners"}

    @classmethod
    def prepare_launch(cls, cfg, task_overrides) -> List[str]:
        check_lamp_config(cfg.pipeline, cfg.model)
        return []

    def setup(self) -> None:
        cfg, pcfg = self.cfg, self.cfg.pipeline
        check_lamp_config(pcfg, cfg.model)
        self.bits, self.L = int(pcfg.bits), int(cfg.model.layers)
        self.codec = make_codec(pcfg.codec, cfg.model.hidden, self.bits)  # encodes every hidden-state row
        self.fanouts = [int(f) for f in cfg.model.fanouts]
        self.prefetch, self.fused, self.push = int(pcfg.prefetch), bool(pcfg.fusion), pcfg.grad == "push"
        # roots=histories: the top block's leaves read history h^(L-1) too, so one more table
        self.from_histories = pcfg.roots == "histories"
        self.tables = self.L - 1 if self.from_histories else self.L - 2
        self.chunk_bytes = int(float(pcfg.setup_chunk_mb) * 2**20)
        self.pb = self.ctx.graph.get_partition_book()
        self.me = self.pb.partid
        self.leader = self.ctx.local_rank == 0  # sets up this machine's owners, ships weights, syncs halos
        self._split_seeds()
        self._build_model()
        self._read_partition()
        self._start_owners()
        self.log.info("lamp: %d train %s on this trainer, %s, %d local nodes (%d halo, their features in %s), "
                      "%d bits, %s", self.num_train, self.task.unit, self.task.describe(), self.lg.num_nodes,
                      len(self.halo.local), cfg.pipeline.halo_store, self.bits,
                      f"{self.tables} history tables initialised by one layer-wise inference pass" if self.tables
                      else "no history table (2 layers)")

    # --- setup ---------------------------------------------------------------------------------
    def _split_seeds(self) -> None:
        """The trainer's supervision ids among its machine's own nodes (the task's `own_ids`, in
        the partition's local ids: a batch's seeds are then nodes the trainer computes, with their
        remote neighbours prepared by their owners); every trainer then takes the same number of
        steps per epoch (DDP), the largest share's. `kept`: the share and how many ids it was
        taken from, where the task drops some (link prediction's cut edges: edges_kept_fraction)."""
        g = self.ctx.graph
        own = self.task.own_ids(g, self.pb, self.ctx.local_rank, int(self.cfg.cluster.trainers_per_machine))
        self.train_ids, self.num_train = own.ids, own.ids.shape[-1]
        self.kept = None if own.pool is None else (self.num_train, own.pool)
        self.owned = torch.nonzero(g.local_partition.ndata["inner_node"].bool()).flatten()  # local ids
        nb = torch.tensor([-(-self.num_train // self.cfg.train.batch_size)])
        dist.all_reduce(nb, op=dist.ReduceOp.MAX)
        self.num_batches = int(nb)

    def _build_model(self) -> None:
        g = self.ctx.graph
        self.in_dim = g.ndata["feat"].shape[1]
        self.task.prepare(self.ctx)
        self.out_dim = self.task.out_dims()[-1]
        self.build_model(self.in_dim)  # the same initial weights on every rank
        # what the owners replicate (every layer but the top): the task's encoder of the model
        self.gnn = self.task.encoder(self.model)
        self.ddp = DistributedDataParallel(LampNet(self.model, self.task.seed_loss))
        self.ddp.register_comm_hook(None, timed_allreduce_hook(self.timer))  # DDP's averaging, timed
        self.allreduce_bytes = ring_allreduce_bytes(self.param_bytes(), self.ctx.world_size)
        self.evaluator = self.task.evaluator(self.ctx, self.model)

    def _read_partition(self) -> None:
        """This machine's partition as its graph server sees it, its own features and labels by
        local id, the halo nodes' features (a one-time replica: setup bytes) and the boundary."""
        g, cfg = self.ctx.graph, self.cfg
        self.lg = LocalGraph.from_partition(g.local_partition)
        own = self.lg.nid[torch.nonzero(self.lg.inner).flatten()]
        self.local_feat = own_rows(g.ndata["feat"], self.pb, own)  # own nodes' rows, by local id
        if self.local_feat is None:
            raise RuntimeError("pipeline=lamp: this machine's partition graph and its KVStore order "
                               "the machine's nodes differently (or there is no local graph server)")
        # labels by local id too: no DGL RPC may run while LAMP answers are in flight (service.receive)
        self.local_label = self.task.own_labels(g, self.pb, own)
        self.halo = HaloSync(self.lg, self.pb, self.tables, int(cfg.train.seed) + self.ctx.rank, cfg.pipeline.sync_budget,
                             int(cfg.pipeline.weight_sync_steps) + self.prefetch, self.codec)
        self.halo_x = self._copy_halo(g.ndata["feat"])
        self.setup_bytes = (len(self.halo.gid) * (8 + self.in_dim * 4)) if self.leader else 0
        self.boundary = self._boundary()

    def _copy_halo(self, feat) -> HaloFeatures:
        """The halo nodes' input features (looked up by local id), pulled from their owners in
        pieces of pipeline.setup_chunk_mb, into compute.halo_table's table: with engine=server the
        leader's is a file its graph servers map (one copy on the machine, not two); with
        pipeline.halo_store=disk it is a file on disk, whose pages the kernel may drop and re-read."""
        pcfg = self.cfg.pipeline
        shared = self.leader and pcfg.engine == "server"
        where = tempfile.gettempdir() if pcfg.halo_store == "disk" else ("/dev/shm" if shared else None)
        codec = make_codec(pcfg.codec, self.in_dim, int(pcfg.halo_bits))
        table, path = halo_table(len(self.halo.gid), codec, where)
        x = HaloFeatures(self.halo.local, table, self.lg.num_nodes, codec)
        gen = torch.Generator().manual_seed(int(self.cfg.train.seed) + self.ctx.rank)  # stochastic rounding
        for part in chunks(len(self.halo.gid), self.in_dim * 4, self.chunk_bytes):
            x.write(part, feat[self.halo.gid[part]].float(), gen)
        # the servers map the file by its path; unshared, the mapping alone keeps it
        self.halo_path = path if shared else ""
        if path and not shared:
            os.unlink(path)
        return x

    def _boundary(self) -> torch.Tensor:
        """Own nodes that other machines hold as halo nodes: the only own history rows anyone
        reads (other machines, through the halo sync); pushes and write-backs are limited to them."""
        # each machine's leader sends every trainer the halo ids it holds of that trainer's machine
        # (one all_to_all: a machine receives only its own nodes; on random parts of bench=scale's
        # 8M graph a machine holds 5.5M halo nodes, which an all-gather would hand every trainer)
        world = self.ctx.world_size
        machine_of = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(machine_of, torch.tensor([self.me], dtype=torch.int64))
        empty = torch.empty(0, dtype=torch.int64)
        parts = [self.halo.gid[self.halo.pos_by_owner[m]] if self.leader and m in self.halo.pos_by_owner else empty
                 for m in torch.cat(machine_of).tolist()]
        sizes = torch.tensor([len(p) for p in parts], dtype=torch.int64)
        got = torch.empty(world, dtype=torch.int64)
        dist.all_to_all_single(got, sizes)
        wanted = torch.empty(int(got.sum()), dtype=torch.int64)
        dist.all_to_all_single(wanted, torch.cat(parts), got.tolist(), sizes.tolist())
        del parts
        wanted = torch.unique(wanted)
        boundary = torch.zeros(self.lg.num_nodes, dtype=torch.bool)
        boundary[self.pb.nid2localnid(wanted, self.me).long()] = True
        return boundary

    def _start_owners(self) -> None:
        """The owners of pipeline.engine, their histories from one whole-graph layer-wise pass and
        the first weights."""
        cfg = self.cfg
        self.ages = [0, 0, 0]  # sum, count, max of ages of history rows used (here and at owners)
        self.stats = {"roots": 0, "owner_nodes": 0, "cg_nodes": 0, "answers": 0, "lag_sum": 0, "lag_max": 0,
                      "merged": 0, "computations": 0, "grad_rows": 0, "owner_grad_rows": 0}
        # (node, layer) computations: done, had requests not been merged, had nothing been fused
        # (trainer and owners; graph.fusion_counts)
        self.fusion = [0, 0, 0]
        # grad=push: parameter gradients this machine's owners computed from other trainers'
        # pushed rows, added before the next backward
        self.owner_grads: Dict[str, torch.Tensor] = {}
        self.step_no, self.weights_version = 0, -1
        meta = dict(kind=cfg.model.name, in_dim=self.in_dim, hidden=cfg.model.hidden, out_dim=self.out_dim,
                    layers=self.L, dropout=float(cfg.model.dropout), heads=cfg.model.heads, backend=cfg.model.backend,
                    fanouts=self.fanouts, bits=self.bits, seed=int(cfg.train.seed) + self.me, fusion=self.fused,
                    history_layers=self.tables, halo_bits=int(cfg.pipeline.halo_bits), codec=cfg.pipeline.codec,
                    history_store=cfg.pipeline.history_store)
        try:
            self.owners = make_owners(cfg.pipeline.engine, self.ctx, self.lg, self.local_feat, self.halo_x,
                                      self.boundary, self.gnn, meta, self.leader, self.halo_path)
        finally:
            if self.halo_path:  # the servers have mapped it (or failed): the mappings keep the pages
                os.unlink(self.halo_path)
                self.halo_path = ""
        dist.barrier()
        self._init_histories()
        self._ship_weights(wait=True)
        dist.barrier()

    def _init_histories(self) -> None:
        """h^(1..L-2) (roots=histories: h^(1..L-1)) of every node of this partition from one
        whole-graph layer-wise pass through those layers only, read and stored in pieces (`chunks`).
        With no history table (2 layers, roots=owners) there is nothing to fill and no pass."""
        if self.tables == 0:
            return
        outputs = self.evaluator.inference(self.tables)  # every trainer: collective
        for layer in range(1, self.tables + 1) if self.leader else ():
            out = outputs[layer - 1]
            dim = out.shape[1]
            self.setup_bytes += int((~self.lg.inner).sum()) * (8 + dim * 4)
            for part in chunks(self.lg.num_nodes, dim * 4, self.chunk_bytes):
                ids = torch.arange(part.start, part.stop)
                self.owners.init_history([HistoryRows.of(layer, ids, out[self.lg.nid[part]].float(), 0, self.codec)])
        self.evaluator.release()  # every trainer: collective

    def _ship_weights(self, wait: bool) -> None:
        """The weights the owners compute with (every layer but the top), with their version."""
        if not self.leader or self.weights_version == self.step_no:
            return
        state = {k: v.detach() for k, v in self.gnn.state_dict().items()
                 if not k.startswith(f"layers.{self.L - 1}.")}
        self.owners.ship_weights(Weights(self.step_no, list(state), list(state.values())), wait)
        self.weights_version = self.step_no

    # --- one batch ------------------------------------------------------------------------
    def _issue(self, item: torch.Tensor) -> Batch:
        """Build the batch's computation graph and send its asks (LAMP to the owners, the history
        rows of the middle blocks to this machine's owner); nothing is waited for. `item`: a slice
        of the trainer's supervision ids (local ids), whose seeds and target the task picks
        (`own_batch`: the training nodes and their labels, or the endpoints of the edges and of
        their negatives, and the pairs)."""
        seeds, target = self.task.own_batch(item, self.owned, self.local_label)
        lg, L = self.lg, self.L
        # the top block first: its leaves (the seeds' remote neighbours) go to their owners at
        # once, and the owners prepare them while this trainer builds the rest of its graph
        top = lg.build(seeds, self.fanouts[L - 1:])
        top_gid = lg.nid[top.leaves[0]]
        owner = self.pb.nid2partid(top_gid)
        masks, asks = [], []
        for m in ([] if self.from_histories else torch.unique(owner).tolist()):
            mask = owner == m
            asks.append((self.owners.pick(m), Roots(top_gid[mask], self.step_no)))
            masks.append(mask)
        ticket = self.owners.ask(asks)
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
        layers, rows = mids, [cg.leaves[k] for k in mids]
        if self.from_histories:  # the roots too, from this machine's h^(L-1) (one row per root)
            layers, rows = mids + [L - 1], rows + [top.leaves[0]]
        if layers:
            self.owners.ask_local(ticket, HistoryPull(layers, [len(r) for r in rows], torch.cat(rows)))
        self.stats["roots"] += len(top_gid)
        self.stats["cg_nodes"] += cg.num_nodes
        # the local gathers here, not in _complete: owner_wait then measures only the owners
        x = self.local_feat[cg.inner_src[0]].float()
        return Batch(seeds, cg, top_gid, masks, ticket, top_rows, x, self.halo_x[cg.leaves[0]], target)

    def _complete(self, b: Batch):
        """Wait for the batch's answers; returns (cg, input features, leaf rows per block, top rows)."""
        got = self.owners.answers(b.ticket)
        self._store_sync(got.halo)
        hidden = self.cfg.model.hidden
        top_h = torch.zeros(len(b.top_gid), hidden)
        for r, mask in zip(got.lamp, b.masks):
            top_h[mask] = self.codec.decode(r.rows)
            self._count_answer(r)
        leaves = [b.x_leaves]
        if got.pull is not None:
            rows = self.codec.decode(got.pull.rows)
            self._count_ages(ages_summary([self.step_no - got.pull.stamp]))
            parts = list(torch.split(rows, b.ticket.pull.counts))
            if self.from_histories:
                top_h = parts.pop()
            leaves += parts
        if self.push:
            top_h.requires_grad_(True)  # its gradient goes back to the owners
        leaves.append(top_h if b.top_rows is None else top_h[b.top_rows])
        return b.cg, b.x, leaves, top_h

    def _count_ages(self, ages) -> None:
        self.ages[0] += ages[0]
        self.ages[1] += ages[1]
        self.ages[2] = max(self.ages[2], ages[2])

    def _count_answer(self, r) -> None:
        """An owner's answer in the statistics: ages of the history rows it used, the lag of its
        weights behind this step, and its (node, layer) computations."""
        self._count_ages(r.ages)
        lag = self.step_no - r.version
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

    def batches_per_epoch(self) -> Optional[int]:
        return min(self.num_batches, self.cfg.train.batches_per_epoch or self.num_batches)

    def batches_of(self, epoch: int):
        """The asynchronous pipeline: the asks of batch i+k (k = pipeline.prefetch) are in flight
        while batch i trains; batches are trained in the order drawn. With k > 0, history pushes,
        weight shipping and the halo sync are sent without waiting, and their answers collected a
        step later (an owner handles one trainer's messages in order, so a later ask still sees an
        earlier push). Nothing is in flight between epochs (epoch_end)."""
        self.step_no = self.batches
        self._ship_weights(wait=True)  # (after a resume the owners hold the initial weights)
        self.ddp.train()
        order = self.train_ids[..., torch.randperm(self.num_train)]
        seeds_of = list(torch.tensor_split(order, self.num_batches, dim=-1))[:self.batches_per_epoch()]
        yield from pipelined(seeds_of, self.prefetch, self._issue, self._complete, self.timer)

    def step(self, batch) -> float:
        """One step through DDP on a completed batch, then its history pushes (and grad=push:
        the gradient rows of the owners' answers back to them)."""
        b, (cg, x, leaves, top_h) = batch
        # the trainer's forward on train.device; owners, histories and their messages stay on the
        # CPU (a leaf moved to the device still passes its gradient back to top_h)
        blocks, x, leaves, target = self.mover((cg.blocks, x, leaves, b.target))
        with self.timer("compute"):
            # the task's loss of the seeds' top rows (Task.seed_loss), inside the DDP forward
            loss, hidden = self.ddp(blocks, x, leaves, target)
        hidden = [h.cpu() for h in hidden]
        # the owners' gradients join this step's all-reduce (DDP sums into .grad); DDP all-reduces
        # the gradients of the trainer's own sub-graph
        value = self.optimize(loss, before_backward=self._apply_owner_grads if self.push else None)
        self.ctx.counter.add("allreduce", self.allreduce_bytes)
        with self.timer("history"):
            if self.push:
                self._push_grads(b, top_h.grad)
            self._after_step(cg, hidden)
        return value

    def epoch_end(self) -> None:
        with self.timer("history"):
            self._drain_background()
            # every trainer has its answers: every owner's sends of this epoch are done before any
            # machine reads its wire counters (the epoch's window, loop.py)
            dist.barrier()

    def _after_step(self, cg: CompGraph, hidden: List[torch.Tensor]) -> None:
        """History pushes of the batch's fresh rows, the weights every weight_sync_steps steps,
        the halo sync every halo_sync_steps steps; waited for at once with prefetch 0, else in the
        background (collected at the next step)."""
        pcfg = self.cfg.pipeline
        self._drain_background()
        pushes = []
        for k, h in enumerate(hidden[:self.tables]):  # fresh h^(1..L-2) (or L-1) of the batch's boundary nodes
            keep = self.boundary[cg.dst[k]]
            if bool(keep.any()):
                pushes.append(HistoryRows.of(k + 1, cg.dst[k][keep], h[keep], self.step_no, self.codec))
        self.owners.push_history(pushes)
        self.step_no += 1
        if self.step_no % pcfg.weight_sync_steps == 0:
            self._ship_weights(wait=False)
        if self.step_no % pcfg.halo_sync_steps == 0 and self.leader and self.halo.pending is None:
            # (a sync riding on the rounds may still be out: its answers come with a later batch)
            self.owners.sync_halo(self.halo.plan(self.step_no, self.stats["roots"], self.owners.answerers))
        if self.push:  # what the owners here computed for other trainers
            self.owners.ask_owner_grads()
        if self.prefetch == 0:
            self._drain_background()

    def _push_grads(self, b: Batch, grad: Optional[torch.Tensor]) -> None:
        """grad=push: each owner gets the gradient rows of the roots it answered (encoded like
        the answers)."""
        if grad is None:
            return
        pushes = []
        for (answerer, ask), mask in zip(b.ticket.asks, b.masks):
            pushes.append((answerer, GradRows(ask.roots, self.codec.encode(grad[mask]))))
        self.owners.push_grads(pushes)
        self.stats["grad_rows"] += len(grad)

    def _store_sync(self, answers) -> None:
        """The halo sync's answers, when they have come, into this machine's histories."""
        if answers is None or self.halo.pending is None:
            return
        newest = len(self.owners.answerers(self.me)) > 1  # a node written by several answerers: the newest row
        self.owners.store_halo(self.halo.store(answers, self.step_no, newest))

    def _apply_owner_grads(self) -> None:
        self._collect_owner_grads()
        params = dict(self.gnn.named_parameters())
        for name, t in self.owner_grads.items():
            params[name].grad = t.clone()
        self.owner_grads = {}

    def _collect_owner_grads(self) -> None:
        for g in self.owners.owner_grads():
            add_grads(self.owner_grads, zip(g.names, g.tensors))
            self.stats["owner_grad_rows"] += g.rows

    def _drain_background(self) -> None:
        """Collect everything sent in the background: the halo sync's answers (then stored), the
        owners' gradients and the acks of pushes and weights."""
        self._store_sync(self.owners.halo_answers())
        self._collect_owner_grads()
        self.owners.drain()

    def training_done(self) -> None:
        """The histories and the halo features serve training only: on a machine near its memory
        limit the final evaluation needs their room (its tables are one row per node a layer)."""
        self.owners.release()
        self.halo_x = None

    def evaluate(self) -> Tuple[float, float]:
        return self.evaluator()

    def rank_stats(self) -> dict:
        return {"ages": self.ages, "stats": {**self.stats, "rounds": self.owners.rounds, "sync_rows": self.halo.rows},
                "local": self.owners.local_bytes, "fusion": self.fusion,
                "edges": self.kept}

    def summary_extra(self, ranks: List[dict], context: dict) -> LAMPSummary:
        return lamp_summary(ranks, self.cfg.pipeline, bits=self.bits)
