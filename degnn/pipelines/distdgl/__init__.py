"""DistDGL baseline: trainers sample through the graph servers, pull the raw features of every
sampled node from the KVStore, and synchronise gradients with DDP (one step per batch).

One batch (`batches_of` -> `step`): DGL's distributed loader samples the multi-hop
neighbourhood of the seeds (sampling RPCs to the machines that own them; the loop times it as
sampling) -> the features of all input nodes are pulled (remote rows cross the network) ->
forward/backward through the DDP wrapper -> gradient all-reduce -> Adam step.

The task decides what a batch is (degnn/tasks): node classification samples around training
nodes; link prediction (the TMA paper's synchronous baseline) takes mini-batches of training
edges with one uniform negative each and the MLP decoder, evaluated by MRR.

`pipeline.prefetch=k` (default 1, one batch ahead like LAMP's): a background thread samples
the next k batches (prefetch.py `Prefetcher`) while the main thread trains on the current one;
the loop's `sampling` time is then the main thread's wait for a batch, and the thread's own time
per batch is in the summary (`prefetch_sampling_s_per_batch`, `prefetch_pull_s_per_batch`). By
default (`pipeline.prefetch_pull=false`) the main thread pulls each batch's rows (`owner_wait`)
and only then lets the thread sample the next batch, which it does during the step (one RPC
client, used by one thread at a time; the pull never queues on the link behind the all-reduce or
in front of it). With `prefetch_pull=true` the thread pulls the rows too and `owner_wait` is
zero. The bytes are the same either way: they are counted from the batch by the main thread.
prefetch=0 is the synchronous loop. With `pipeline.prefetch_auto=true` each trainer trains the
first half of its first epoch with the loader and the second half synchronously, and the cluster
keeps the loop whose median batch, summed over the trainers, was faster (one choice for all:
`prefetch.cluster_prefetch_is_faster`): on a machine whose CPU is its bottleneck the thread's
work slows the step by what it hides. Both tasks prefetch (a link batch
is sampled and pulled the same way). DGL's own sampler processes (DGL_NUM_SAMPLER > 0) are not
used (each is a process with its own RPC connections, docs/pipelines.md); prefetch_pull=false is
their layout (sampling ahead, the pull in the trainer) in a thread.

`pipeline.halo_cache=true` (an ablation of LAMP's halo replica, bench=lamp's ablation-owners):
the features of the machine's 1-hop halo nodes (the nodes of other machines its DGL partition
holds as halo, the same set LAMP's trainer copies) are copied once at setup, in pieces
(`setup_bytes`); sampling still goes through the graph servers, and a batch pulls only its other
remote input nodes' rows (`HaloCache`). The `features` bytes count those rows only.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Iterator, List, Optional

import dgl
import torch
from torch.nn.parallel import DistributedDataParallel

from degnn.metrics import ID_BYTES, ring_allreduce_bytes, sampling_bytes, timed_allreduce_hook
from degnn.pipelines.base import Pipeline
from degnn.pipelines.distdgl.config import DistDGLConfig
from degnn.pipelines.distdgl.prefetch import (Prefetcher, cluster_prefetch_is_faster, prefetch_is_faster,
                                              probe_median)

CACHE_CHUNK_BYTES = 32 * 2**20  # the halo copy is read in pieces of about this much


class HaloCache:
    """Feature rows by global id: those of `gids` (the machine's halo nodes) from a local copy
    made here, in pieces of CACHE_CHUNK_BYTES; every other row from `feat` (the DistTensor: own
    rows from shared memory, remote ones pulled from their owners)."""

    def __init__(self, feat, gids: torch.Tensor):
        self.feat = feat
        self.gids = torch.sort(gids.long()).values
        dim = feat.shape[1]
        self.rows = torch.empty(len(self.gids), dim, dtype=torch.float32)
        step = max(1, CACHE_CHUNK_BYTES // (4 * dim))
        for lo in range(0, len(self.gids), step):
            self.rows[lo:lo + step] = feat[self.gids[lo:lo + step]].float()
        self.shape = feat.shape

    def find(self, ids: torch.Tensor):
        """(mask of the `ids` the copy holds, their rows' positions in it)."""
        if not len(self.gids):
            return torch.zeros(len(ids), dtype=torch.bool), torch.zeros(len(ids), dtype=torch.int64)
        at = torch.searchsorted(self.gids, ids).clamp(max=len(self.gids) - 1)
        return self.gids[at] == ids, at

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        hit, at = self.find(ids)
        out = torch.empty(len(ids), self.shape[1], dtype=torch.float32)
        out[hit] = self.rows[at[hit]]
        if not bool(hit.all()):
            out[~hit] = self.feat[ids[~hit]].float()
        return out


@dataclass
class DistDGLSummary:
    """distdgl's own summary keys."""

    halo_cache: bool
    # halo_cache: rows in the copy (all trainers), and per batch of a trainer the remote input
    # rows read from it and those still pulled from their owners
    halo_cache_rows: Optional[int]
    halo_cache_hit_rows_per_batch: Optional[float]
    remote_feature_rows_per_batch: float
    # batches built ahead by the background thread (0: synchronous), and that thread's own time
    # per batch sampling and pulling (None with prefetch 0: the loop's sampling and owner_wait)
    prefetch: int
    prefetch_pull: bool  # the thread pulls too (else the main thread does: owner_wait)
    prefetch_sampling_s_per_batch: Optional[float]
    prefetch_pull_s_per_batch: Optional[float]
    # prefetch_auto: trainers that kept the loader after their first epoch (None: no choice made),
    # and the first epoch's median seconds per batch of each half (mean over trainers)
    prefetch_auto: bool
    prefetch_kept: Optional[int]
    prefetch_probe_s_per_batch: Optional[dict]


def check_distdgl_config(pcfg) -> None:
    if int(pcfg.prefetch) < 0:
        raise ValueError(f"pipeline.prefetch must be >= 0 (batches built ahead by a background thread; "
                         f"0 = synchronous), got {pcfg.prefetch}")


class DistDGLPipeline(Pipeline):
    name = "distdgl"
    tasks = ("node", "link")
    shortens_epochs = True
    config_schema = DistDGLConfig

    @classmethod
    def prepare_launch(cls, cfg, task_overrides) -> List[str]:
        check_distdgl_config(cfg.pipeline)
        return []

    def setup(self) -> None:
        ctx, cfg, task = self.ctx, self.cfg, self.task
        check_distdgl_config(cfg.pipeline)
        self.prefetch = int(cfg.pipeline.prefetch)
        # the prefetch thread pulls too (else: the main thread pulls, then the thread samples on)
        self.prefetch_pull = bool(cfg.pipeline.prefetch_pull)
        # prefetch_auto: None until the first epoch has timed both loops, then whether to prefetch
        self.prefetch_auto = bool(cfg.pipeline.prefetch_auto) and self.prefetch > 0
        self.keep_prefetch: Optional[bool] = None if self.prefetch_auto else self.prefetch > 0
        self.probe: Optional[dict] = None  # the first epoch's median batch, each half
        self._rpc = threading.Lock()  # DGL's RPC client: one thread at a time
        self._prefetcher: Optional[Prefetcher] = None
        self.background = {"sampling": 0.0, "pull": 0.0, "batches": 0}  # the prefetch thread's own time
        g = ctx.graph
        self.pb = g.get_partition_book()
        task.prepare(ctx)
        self.train_ids = task.dist_ids(g, self.pb)
        in_dim = g.ndata["feat"].shape[1]
        self.feat_row_bytes = in_dim * 4
        self.build_model(in_dim)
        self.feat = g.ndata["feat"]
        self.cache: Optional[HaloCache] = None
        self.rows = {"cached": 0, "pulled": 0}  # remote input rows: read from the halo copy, pulled
        if cfg.pipeline.halo_cache:
            part = g.local_partition
            halo = part.ndata[dgl.NID][~part.ndata["inner_node"].bool()]
            self.cache = self.feat = HaloCache(g.ndata["feat"], halo)
            self.setup_bytes = len(halo) * (self.feat_row_bytes + ID_BYTES)
        # Every forward goes through the DDP wrapper: calling submodules directly would skip
        # DDP's gradient hooks silently (docs/design.md, "Pitfalls the code relies on").
        self.ddp = DistributedDataParallel(self.model)
        self.ddp.register_comm_hook(None, timed_allreduce_hook(self.timer))  # DDP's averaging, timed
        self.allreduce_bytes = ring_allreduce_bytes(self.param_bytes(), ctx.world_size)
        self.loader = task.dist_loader(g, self.train_ids, cfg.train.batch_size)
        self.evaluator = task.evaluator(ctx, self.model)
        self._batch_iter = None  # train.batches_per_epoch: the pass under way
        self.log.info("distdgl: %d train %s on this trainer, %s, %d parameters", len(self.train_ids),
                      task.unit, task.describe(), sum(p.numel() for p in self.model.parameters()))

    def batches_per_epoch(self) -> Optional[int]:
        return self.cfg.train.batches_per_epoch or -(-len(self.train_ids) // self.cfg.train.batch_size)

    def batches_of(self, epoch: int) -> Iterator:
        """The epoch's batches: as sampled (synchronous; `step` pulls their inputs), or from a
        background thread up to `pipeline.prefetch` batches ahead (with their inputs where
        `prefetch_pull`; the thread has ended when the epoch's last batch is taken, or when training
        stops early); with prefetch_auto, until the first epoch has chosen, half of each."""
        self.ddp.train()
        if self.keep_prefetch is None:
            yield from self._probed()
        elif self.keep_prefetch:
            yield from self._prefetched(self._sampled())
        else:
            yield from self._sampled()

    def _prefetched(self, batches: Iterator) -> Iterator:
        # without prefetch_pull the thread's next batch waits until the step has pulled (`_step`)
        self._prefetcher = Prefetcher(self._fetched(batches), self.prefetch, release_on_take=self.prefetch_pull)
        try:
            yield from self._prefetcher
        finally:
            self._close_prefetcher()

    def _probed(self) -> Iterator:
        """prefetch_auto's first epoch: its first half from the loader, the rest synchronous, each
        batch timed from one resumption to the next (its wait and its step); then the choice. The
        loader goes first: what is left of the warm-up (DGL's first RPCs, shared-memory pages
        touched for the first time) then counts against it, and a close call goes to the
        synchronous loop."""
        batches, half = self._sampled(), (self.batches_per_epoch() or 0) // 2
        times: dict = {"sync": [], "prefetch": []}
        t = time.perf_counter()
        # the thread's source ends after `half` batches: the synchronous half goes on from there
        for loop, items in (("prefetch", self._prefetched(itertools.islice(batches, half))), ("sync", batches)):
            for item in items:
                yield item
                now = time.perf_counter()
                times[loop].append(now - t)
                t = now
        self.probe = {k: probe_median(v) for k, v in times.items()}
        mine = prefetch_is_faster(times["sync"], times["prefetch"])  # None: too few batches a half
        faster = cluster_prefetch_is_faster(None if mine is None else self.probe)  # one choice for all
        self.keep_prefetch = True if faster is None else faster
        self.log.info("distdgl prefetch_auto: median batch %s synchronous, %s with the loader on this "
                      "trainer (%s); the cluster's sum: %s",
                      *(f"{v * 1000:.0f} ms" if v else "-" for v in (self.probe["sync"], self.probe["prefetch"])),
                      "too few to tell" if mine is None else "loader faster" if mine else "synchronous faster",
                      "too few batches to tell, prefetching" if faster is None
                      else "prefetching" if faster else "synchronous from now on")

    def _sampled(self) -> Iterator:
        """One pass over the loader, or (train.batches_per_epoch=N) the next N batches of it,
        starting a new pass whenever one ends. Every rank takes the same number of steps (DDP)."""
        n = self.cfg.train.batches_per_epoch
        if not n:
            yield from self.loader
            return
        for _ in range(n):
            batch = None if self._batch_iter is None else next(self._batch_iter, None)
            if batch is None:  # no pass under way yet, or it ended
                self._batch_iter = iter(self.loader)
                batch = next(self._batch_iter)
            yield batch

    def _fetched(self, batches: Iterator) -> Iterator:
        """The prefetch thread's work: every batch sampled, and with prefetch_pull its inputs
        pulled, (batch, x, y); else the batch alone (the trainer pulls)."""
        bg = self.background
        while True:
            t0 = time.perf_counter()
            with self._rpc:
                batch = next(batches, None)
            t1 = time.perf_counter()
            if batch is None:
                return
            bg["sampling"] += t1 - t0
            bg["batches"] += 1
            if not self.prefetch_pull:
                yield batch
                continue
            with self._rpc:
                x, y = self.task.inputs(batch, self.feat)
            bg["pull"] += time.perf_counter() - t1
            yield batch, x, y

    def _close_prefetcher(self) -> None:
        pre, self._prefetcher = self._prefetcher, None
        if pre is not None and not pre.close():
            self.log.warning("distdgl: the prefetch thread is still waiting on another machine; "
                             "leaving it behind (a daemon thread)")

    def step(self, item) -> float:
        try:
            return self._step(item)
        except BaseException:
            self._close_prefetcher()  # no DGL RPC of the thread outlives a failed step
            raise

    def _step(self, item) -> float:
        task, counter = self.task, self.ctx.counter
        # the thread brought the rows with the batch
        pulled = self._prefetcher is not None and self.prefetch_pull
        batch = item[0] if pulled else item
        input_nodes, blocks = batch[0], batch[-1]
        remote = self.pb.nid2partid(input_nodes) != self.pb.partid
        counter.add("sampling", sampling_bytes(remote, blocks) + task.lookup_bytes(self.pb, batch))
        if self.cache is not None:  # halo rows come from the local copy
            cached = remote & self.cache.find(input_nodes.long())[0]
            self.rows["cached"] += int(cached.sum())
            remote = remote & ~cached
        self.rows["pulled"] += int(remote.sum())
        # remote feature rows pulled: 8 bytes of id out, one feature row back
        counter.add("features", int(remote.sum()) * (self.feat_row_bytes + ID_BYTES))
        task.observe(batch)
        if pulled:
            x, y = item[1], item[2]
        else:
            with self.timer("owner_wait"), self._rpc:  # the feature (and label) pulls from the rows' owners
                x, y = task.inputs(batch, self.feat)
            if self._prefetcher is not None:
                self._prefetcher.release()  # the thread samples the next batch during this step
        batch, x, y = self.mover((batch, x, y))
        with self.timer("compute"):
            loss = task.loss(self.ddp, batch, x, y)
        value = self.optimize(loss)  # DDP all-reduces the gradients in backward (timed by the hook)
        counter.add("allreduce", self.allreduce_bytes)
        return value

    def evaluate(self):
        return self.evaluator()

    def rank_stats(self) -> dict:
        return {"rows": dict(self.rows), "cache_rows": None if self.cache is None else len(self.cache.gids),
                "background": dict(self.background), "kept": self.keep_prefetch if self.probe else None,
                "probe": self.probe}

    def summary_extra(self, ranks: List[dict], context: dict) -> DistDGLSummary:
        batches = sum(r["batches"] for r in ranks) or 1
        on = self.cache is not None
        built = sum(r["background"]["batches"] for r in ranks) or 1

        def per_batch(key: str) -> Optional[float]:
            if not self.prefetch or (key == "pull" and not self.prefetch_pull):
                return None
            return round(sum(r["background"][key] for r in ranks) / built, 5)

        probes = [r["probe"] for r in ranks if r["probe"]]
        probe = None
        if probes:
            probe = {k: round(sum(p[k] for p in probes) / len(probes), 5) if all(p[k] for p in probes) else None
                     for k in ("sync", "prefetch")}
        return DistDGLSummary(on, sum(r["cache_rows"] for r in ranks) if on else None,
                              sum(r["rows"]["cached"] for r in ranks) / batches if on else None,
                              sum(r["rows"]["pulled"] for r in ranks) / batches,
                              self.prefetch, self.prefetch_pull, per_batch("sampling"), per_batch("pull"),
                              self.prefetch_auto, sum(bool(r["kept"]) for r in ranks) if probes else None, probe)
