"""pipeline=tma: RandomTMA, SuperTMA, PSGD-PA and LLCG (arXiv 2305.09887; docs/background.md, "TMA").

One model per machine, trained only on the subgraph its machine owns (local.py: cross-partition
edges dropped, no feature traffic), replaced by the mean of the live trainers' models every
`sync_every` of wall time. The variants differ only in the partition and in LLCG's correction:

| variant    | partition (unless `partition=` is given) | after each averaging                  |
|------------|------------------------------------------|---------------------------------------|
| random     | random (each node to a random part)      | -                                     |
| supernode  | supernode (METIS clusters dealt at random)| -                                    |
| psgd-pa    | metis (one edge-balanced part each)      | -                                     |
| llcg       | metis                                    | `corr_steps` whole-graph Adam steps   |

A round (service.py has the protocol): every trainer trains for `sync_every` of wall time at its
own pace (finishing its current step), submits its parameters to the averaging service on graph
server 0 and gets the (by default unweighted) mean of whoever submitted by the deadline; its Adam
state stays its own. The lowest contributing rank then evaluates the averaged model on the whole
graph (whole.py) while the others wait, so evaluation is outside everyone's training clock (the
paper's clock), and releases the round. Round 0 only hands every trainer the lowest rank's
initial weights and starts the clocks together. The last round ends at `time_limit`.

No torch.distributed at all (Pipeline.tolerates_trainer_faults): a trainer that dies is left out of
the next deadline, a dead evaluator is replaced, and the launcher lets the run finish and stops the
servers. `drop_parts` is the paper's simulated failure: those machines' trainers never train.

Link task (the paper's own task): each trainer's supervision edges are its subgraph's edges (one
uniform local negative each, BCE, the MLP decoder; degnn/pipelines/link.py); the evaluator ranks
the held-out edges carried with the partition against their 1000 negatives (MRR).

Checkpoints: after every round each trainer writes its own model and optimizer
(`tma_rank<r>.pt`, the models are equal right after an averaging but the Adam states are not),
and the evaluator writes `checkpoint.pt` (the averaged model and the run's state); `resume=`
restores both and continues with the rounds left in the budget.
"""
from __future__ import annotations

import logging
import math
import os
import re
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional

import dgl
import torch
from omegaconf import OmegaConf
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from degnn.config import CONF_DIR
from degnn.metrics import append_curve
from degnn.models import build_link_model, build_model
from degnn.pipelines.base import CHECKPOINT, Pipeline, rng_state, set_rng_state
from degnn.runtime.checkpoint import config_identity
from degnn.pipelines.evaluation import dataset_evaluator
from degnn.pipelines.link import batch_loss, load_link_split, local_edge_loader, negatives_per_positive
from degnn.runtime.compat import NeighborSampler


from .local import build_local_data
from .service import CoordinatorClient, end_diverged

VARIANT_PARTITION = {"random": "random", "supernode": "supernode", "psgd-pa": "metis", "llcg": "metis"}
WEIGHTINGS = ("uniform", "train_nodes")
# round 0 waits this long for every trainer to come up (DGL start-up on a loaded machine)
START_TIMEOUT_S = 180.0
BEAT_EVERY_S = 2.0

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|sec|secs|m|min|mins|h|hr|hrs)?\s*$")
_UNIT_S = {None: 1, "s": 1, "sec": 1, "secs": 1, "m": 60, "min": 60, "mins": 60, "h": 3600, "hr": 3600,
           "hrs": 3600}


def parse_duration(value, key: str = "duration") -> float:
    """'30s', '2min', '1.5h' or a number of seconds -> seconds (ValueError naming `key`)."""
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"{key}={value!r} is not a duration: write e.g. 30s, 2min or 1h")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def rank_file(rank: int) -> str:
    return f"tma_rank{rank}.pt"


class Replaced(Exception):
    """The coordinator gave this round's evaluation to another trainer (we were too slow)."""


class TMAPipeline(Pipeline):
    name = "tma"
    metric = "acc"
    tasks = ("node", "link")
    tolerates_trainer_faults = True

    # --- the launcher's preflight ---------------------------------------------------------------
    @classmethod
    def prepare_launch(cls, cfg, task_overrides) -> List[str]:
        p = cfg.pipeline
        if p.variant not in VARIANT_PARTITION:
            raise ValueError(f"pipeline.variant={p.variant!r}: choose one of {', '.join(VARIANT_PARTITION)}")
        sync = parse_duration(p.sync_every, "pipeline.sync_every")
        limit = parse_duration(p.time_limit, "pipeline.time_limit")
        for key in ("round_timeout", "evaluator_timeout"):
            if parse_duration(p[key], f"pipeline.{key}") <= 0:
                raise ValueError(f"pipeline.{key} must be positive")
        if sync <= 0 or limit <= 0:
            raise ValueError("pipeline.sync_every and pipeline.time_limit must be positive")
        if p.weighting not in WEIGHTINGS:
            raise ValueError(f"pipeline.weighting={p.weighting!r}: choose uniform or train_nodes")
        if p.grad_clip < 0 or p.corr_steps < 0:
            raise ValueError("pipeline.grad_clip and pipeline.corr_steps must be >= 0")
        cls.check_task(cfg)
        if cfg.cluster.trainers_per_machine != 1:
            raise ValueError("pipeline=tma trains one model per machine (its partition): set "
                             "cluster.trainers_per_machine=1")
        from degnn.runtime.cluster import machines_of

        k = len(machines_of(cfg.cluster))
        drop = list(p.drop_parts)
        bad = [d for d in drop if not 0 <= d < k]
        if bad or len(set(drop)) != len(drop):
            raise ValueError(f"pipeline.drop_parts={drop}: give distinct partition indices 0..{k - 1}")
        if len(drop) >= k:
            raise ValueError(f"pipeline.drop_parts={drop} drops every partition: nothing would train")
        parse_duration(p.kill_at, "pipeline.kill_at")
        if p.kill_during not in ("train", "eval"):
            raise ValueError(f"pipeline.kill_during={p.kill_during!r}: choose train or eval")
        if p.kill_rank is not None and not 0 <= p.kill_rank < k:
            raise ValueError(f"pipeline.kill_rank={p.kill_rank}: give a trainer rank 0..{k - 1}")
        # the variant picks the partition unless the user chose one
        user = {o.split("=", 1)[0].lstrip("+~") for o in task_overrides}
        if user & {"partition", "partition.method"}:
            return []
        method = VARIANT_PARTITION[p.variant]
        option = OmegaConf.load(Path(CONF_DIR, "partition", f"{method}.yaml"))
        for key, value in option.items():
            if f"partition.{key}" not in user:
                cfg.partition[key] = value
        return [f"partition={method}"]

    # --- set-up -----------------------------------------------------------------------------------
    def setup(self) -> None:
        ctx, cfg = self.ctx, self.cfg
        p = cfg.pipeline
        g = ctx.graph
        self.pb = g.get_partition_book()
        self.part = int(self.pb.partid)
        self.sync_s = parse_duration(p.sync_every)
        self.limit_s = parse_duration(p.time_limit)
        self.rounds_total = max(1, math.ceil(self.limit_s / self.sync_s - 1e-9))
        tpm = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", cfg.cluster.trainers_per_machine)))
        self.active = [r for r in range(ctx.world_size) if r // tpm not in set(p.drop_parts)]
        self.dropped = self.part in set(p.drop_parts)
        self.evaluate_fn = dataset_evaluator(cfg.dataset)
        self.link = cfg.dataset.task == "link"
        self.link_split = None  # loaded when this trainer first evaluates
        self.link_info = {}
        self.client = CoordinatorClient(ctx.rank, ctx.counter)
        self.local = build_local_data(g, str(ctx.part_config), self.log, link=self.link)
        in_dim = self.local.graph.ndata["feat"].shape[1]
        self.in_dim = in_dim
        torch.manual_seed(cfg.train.seed)  # the same initial weights everywhere (round 0 makes sure)
        if self.link:
            self.metric = "mrr"
            self.num_classes = None
            self.model = build_link_model(cfg.model, in_dim)
        else:
            self.num_classes = self._num_classes(g)
            self.model = build_model(cfg.model, in_dim, self.num_classes)
        torch.manual_seed(cfg.train.seed + 1000 * (ctx.rank + 1))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.param_bytes = sum(t.numel() * t.element_size() for t in self.model.parameters())
        n_train = len(self.local.train_ids)  # train nodes, or (link task) local edges
        self.steps_per_epoch = max(1, -(-n_train // cfg.train.batch_size))
        self.loader = None
        if n_train and self.link:
            self.loader = local_edge_loader(self.local.graph, self.local.train_ids, cfg.model.fanouts,
                                            cfg.train.batch_size)
        elif n_train:
            self.loader = dgl.dataloading.DataLoader(
                self.local.graph, self.local.train_ids, NeighborSampler(list(cfg.model.fanouts)),
                batch_size=cfg.train.batch_size, shuffle=True, drop_last=False)
        self.batch_iter = None
        self.weight = 1.0 if p.weighting == "uniform" else float(n_train)
        self.steps = 0  # local steps of this trainer (== self.batches)
        self.train_s = 0.0  # this trainer's own time in local training steps
        self.whole = None  # built when this trainer first evaluates
        self.corrector = None
        self.last_beat = 0.0
        self.eval_round = None
        self.kill_at = parse_duration(p.kill_at) if p.kill_rank == ctx.rank else None
        g_local = self.local.graph
        self.log.info("tma/%s: partition %d%s: %d nodes, %d of %d edges kept (cross-partition edges "
                      "dropped), %d train %s; %s, %d parameters; %d rounds of %.0fs",
                      p.variant, self.part, " (dropped: never trains)" if self.dropped else "",
                      g_local.num_nodes(), g_local.num_edges(), self.local.edges_total, n_train,
                      "edges" if self.link else "nodes", "MRR" if self.link else f"{self.num_classes} classes",
                      sum(t.numel() for t in self.model.parameters()), self.rounds_total, self.sync_s)

    def _num_classes(self, g) -> int:
        """Classes over the whole graph's train labels (as distdgl counts them), without a collective."""
        n = g.num_nodes()
        top = 0
        for start in range(0, n, 65536):
            nids = torch.arange(start, min(n, start + 65536))
            mask = g.ndata["train_mask"][nids].bool()
            if mask.any():
                top = max(top, int(g.ndata["label"][nids][mask].max()))
            remote = int((self.pb.nid2partid(nids) != self.pb.partid).sum())
            self.ctx.counter.add("setup", remote * (8 + 8 + 1))
        return top + 1

    # --- the model as one flat tensor --------------------------------------------------------------
    def _flat(self) -> torch.Tensor:
        return parameters_to_vector(self.model.parameters()).detach().clone()

    def _load_flat(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            vector_to_parameters(flat.to(torch.float32), self.model.parameters())

    # --- local training ------------------------------------------------------------------------------
    def _next_batch(self):
        if self.batch_iter is None:
            self.batch_iter = iter(self.loader)
        try:
            return next(self.batch_iter)
        except StopIteration:
            self.batch_iter = iter(self.loader)
            return next(self.batch_iter)

    def train_for(self, seconds: float) -> tuple:
        """Local steps until `seconds` of wall time have passed (the step under way is finished)."""
        if self.loader is None:
            time.sleep(seconds)
            return 0, float("nan")
        p = self.cfg.pipeline
        g = self.local.graph
        label = None if self.link else g.ndata["label"]
        self.model.train()
        t_end = time.time() + seconds
        total, n = 0.0, 0
        t_start = time.time()
        while time.time() < t_end:
            if self.cfg.pipeline.kill_during == "train":
                self._maybe_die(self.train_s + time.time() - t_start, "training")
            batch = self._next_batch()
            if self.link and "train_neg_per_pos" not in self.link_info:
                self.link_info["train_neg_per_pos"] = negatives_per_positive(batch)
            loss = batch_loss(self.model, batch, g.ndata["feat"], label)
            self.optimizer.zero_grad()
            loss.backward()
            if p.grad_clip > 0 and self.steps / self.steps_per_epoch >= p.grad_clip_since:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), p.grad_clip)
            self.optimizer.step()
            self.steps += 1
            total += loss.item()
            n += 1
        return n, (total / n if n else float("nan"))

    def _maybe_die(self, trained_s: float, where: str) -> None:
        """Fault injection (pipeline.kill_rank): SIGKILL this process once it trained `kill_at`."""
        if self.kill_at is not None and trained_s >= self.kill_at:
            self.log.warning("pipeline.kill_rank=%d: killing myself (SIGKILL) in %s after %.1fs of "
                             "training", self.ctx.rank, where, trained_s)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def my_stats(self) -> dict:
        return {"rank": self.ctx.rank, "part": self.part, "steps": self.steps, "train_s": round(self.train_s, 3),
                "local_epochs": self.steps / self.steps_per_epoch,
                "train_edges" if self.link else "train_nodes": int(len(self.local.train_ids)),
                "nodes": self.local.graph.num_nodes(),
                "edges": self.local.graph.num_edges(), "edges_total": self.local.edges_total,
                **self.rank_stats()}

    # --- the evaluator's part of a round --------------------------------------------------------------
    def _beat(self) -> None:
        now = time.time()
        if now - self.last_beat >= BEAT_EVERY_S and self.eval_round is not None:
            self.last_beat = now
            if self.client.call("beat", self.eval_round).status != "ok":
                raise Replaced()

    def _whole(self):
        if self.whole is None:
            from .whole import WholeGraph

            self.whole = WholeGraph(self.ctx.graph, self.ctx.counter, self._beat, link=self.link)
            if self.link:
                self.link_split = load_link_split(self.ctx.part_config)
            self.log.info("tma: whole graph fetched for evaluation in %.1fs (%d nodes, %d edges)",
                          self.whole.fetch_s, self.whole.graph.num_nodes(), self.whole.graph.num_edges())
        return self.whole

    def lead_round(self, r: int, mean: torch.Tensor, meta: dict, state: dict, round_s: float,
                   losses: Dict[int, float]) -> None:
        """Evaluate (LLCG: correct first) the averaged model of round r and release the round."""
        cfg, ctx = self.cfg, self.ctx
        self.eval_round, self.last_beat = r, 0.0
        if cfg.pipeline.kill_during == "eval":
            self._maybe_die(self.train_s, f"the evaluation of round {r}")
        whole = self._whole()
        corrected = None
        corr_s = 0.0
        if cfg.pipeline.variant == "llcg" and cfg.pipeline.corr_steps > 0:
            t0 = time.time()
            if self.corrector is None:
                from .whole import Corrector

                self.corrector = Corrector(ctx.graph, cfg, self.in_dim, self.num_classes,
                                           None if self.link else whole.train_nids, ctx.counter, link=self.link)
            corrected = self.corrector.correct(mean, cfg.pipeline.corr_steps, self._beat)
            self._load_flat(corrected)
            corr_s = time.time() - t0  # correction is LLCG's training: on the clock
        state["train_time_s"] += round_s + corr_s
        state["epoch_times"].append(round_s + corr_s)
        val, test = whole.evaluate(self.model, self.evaluate_fn, self.link_split)
        # still this round's evaluator? (a slow one may have been replaced: it writes nothing)
        self.last_beat = 0.0
        self._beat()
        self.keep_best(state, val, test, r)
        state["epoch"] = r
        state["trainers_alive"] = len(meta["contributors"])
        state["all_alive"] = sorted(meta["contributors"]) == sorted(self.active) and not meta["dead"]
        stats = meta["stats"]
        record = {"round": r, "epoch": round(min(s.get("local_epochs", 0.0) for s in stats.values()), 3),
                  "train_time_s": round(state["train_time_s"], 3), "wall_s": round(time.time() - self.wall0, 3),
                  "val": val, "test": test, "trainers": meta["contributors"],
                  "steps": {str(k): s.get("round_steps", 0) for k, s in stats.items()},
                  "round_time_s": round(round_s + corr_s, 3),
                  # parameters up and the mean down per contributor (LLCG: the corrected weights too)
                  "averaging_bytes": self.param_bytes * (3 if corrected is not None else 2) * len(meta["contributors"]),
                  "loss": (sum(losses.values()) / len(losses)) if losses else None}
        append_curve(ctx.run_dir, record)
        self.log.info("round %d/%d: val %.4f, test %.4f, %d trainers (%s steps), %.1fs%s", r, self.rounds_total,
                      val, test, len(meta["contributors"]), record["steps"], round_s + corr_s,
                      f", llcg correction {corr_s:.2f}s" if corrected is not None else "")
        for line in meta.get("log", [])[len(state.get("coordinator_log", [])):]:
            self.log.warning("coordinator: %s", line)
        state["coordinator_log"] = list(meta.get("log", []))
        # the shared checkpoint has the layout resume= checks (degnn/runtime/checkpoint.py); the
        # optimizer and RNG states are each trainer's own (tma_rank<r>.pt)
        self._checkpoint(ctx.run_dir / CHECKPOINT, {"model": self.model.state_dict(), "optimizer": {},
                                                    "state": dict(state), "rng": None,
                                                    "config": config_identity(self.cfg)})
        if r == self.rounds_total:
            self.final_summary(state, meta)
        self._beat_off()
        shared = {k: state[k] for k in ("train_time_s", "best_val", "best_test", "best_epoch", "test_final",
                                        "epoch", "epoch_times", "trainers_alive", "all_alive",
                                        "coordinator_log")}
        # (the corrected weights were counted in advance as every trainer's download)
        res = self.client.call("release", r, corrected, {"state": shared}, category=None)
        if res.status != "ok":
            raise Replaced()

    def _beat_off(self) -> None:
        self.eval_round = None

    # --- the loop -----------------------------------------------------------------------------------------
    written_summary: Optional[dict] = None

    @property
    def is_writer(self) -> bool:
        """The evaluator of the current round writes the shared files (curve, best model, summary)."""
        return self.eval_round is not None or self.written_summary is not None

    def run(self) -> dict:
        ctx, cfg = self.ctx, self.cfg
        self.setup()
        self.wall0 = time.time()
        state = self.new_state()
        state.update(trainers_alive=None, coordinator_log=[])
        start_round = self._resume(state)
        p = cfg.pipeline
        self.client.call("hello", 0, meta={
            "active": self.active, "start_timeout_s": START_TIMEOUT_S,
            "round_timeout_s": parse_duration(p.round_timeout),
            "evaluator_timeout_s": parse_duration(p.evaluator_timeout)})
        if self.dropped:
            # the paper's simulated failure: this partition is never trained; wait for the end
            self.client.poll_s = 1.0
            rel = self.client.wait("poll_release", self.rounds_total, ("released",))
            self.all_trainers_alive = bool(rel.meta["state"].get("all_alive"))
            self.log.info("partition %d was dropped (pipeline.drop_parts): the run is over", self.part)
            return {"status": "ok"}
        if ctx.rank == min(self.active):
            (ctx.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        # round 0: the lowest rank's weights to everyone; the clocks start together
        self.client.call("submit", 0, self._flat(), {"stats": self.my_stats()})
        self._load_flat(self.client.wait("poll_mean", 0, ("mean",)).tensor)
        self.client.wait("poll_start", 0, ("go",), category=None)
        for r in range(start_round + 1, self.rounds_total + 1):
            budget = min(self.sync_s, self.limit_s - (r - 1) * self.sync_s)
            t0 = time.time()
            w0 = self.wire.read()
            steps0 = self.steps
            n, loss = self.train_for(budget)
            t_trained = time.time()
            self.train_s += t_trained - t0
            if w0 is not None:
                self.wire_train_bytes += self.wire.read() - w0
            self.batches = self.steps
            # the stats travel with the submission, so they count this round's averaging traffic
            # in advance: parameters up, the mean down (LLCG: the corrected weights down too)
            round_bytes = self.param_bytes * (3 if p.variant == "llcg" and p.corr_steps > 0 else 2)
            self.ctx.counter.add("averaging", round_bytes)
            stats = {**self.my_stats(), "round_steps": self.steps - steps0, "loss": loss}
            self.client.call("submit", r, self._flat(), {"weight": self.weight, "stats": stats},
                             category=None)
            res = self.client.wait("poll_mean", r, ("mean",), category=None)
            if res.meta.get("diverged"):  # every live trainer's loss is not finite (Coordinator)
                return end_diverged(ctx, r, res.meta, self.wall0)
            round_s = time.time() - t0
            self._load_flat(res.tensor)
            losses = {k: s["loss"] for k, s in res.meta["stats"].items()
                      if isinstance(s.get("loss"), float) and not math.isnan(s["loss"])}
            meta = res.meta
            while True:
                if meta.get("evaluator") == ctx.rank:
                    try:
                        self.lead_round(r, res.tensor, meta, state, round_s, losses)
                        break
                    except Replaced:
                        self._beat_off()
                        self.log.warning("round %d: evaluation handed to another trainer", r)
                        self._load_flat(res.tensor)
                rel = self.client.wait("poll_release", r, ("released", "evaluate"), category=None)
                if rel.status == "evaluate":  # the evaluator died: this trainer takes over
                    self.log.warning("round %d: taking over evaluation from rank %s", r, meta.get("evaluator"))
                    meta = {**rel.meta, "evaluator": ctx.rank}
                    continue
                if rel.tensor.numel():
                    self._load_flat(rel.tensor)  # LLCG's corrected weights
                state.update(rel.meta["state"])
                break
            self._save_own(r)
            self.all_trainers_alive = bool(state.get("all_alive"))
            if r < self.rounds_total:
                self.client.wait("poll_start", r, ("go",), category=None)
        return self.written_summary or {"status": "ok"}

    # --- checkpoints ------------------------------------------------------------------------------------
    def _save_own(self, r: int) -> None:
        self._checkpoint(self.ctx.run_dir / rank_file(self.ctx.rank), {
            "round": r, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "rng": rng_state(), "steps": self.steps, "train_s": self.train_s,
            "wire_train_bytes": self.wire_train_bytes, "bytes": self.ctx.counter.as_dict()})

    def _resume(self, state: dict) -> int:
        """Resume step: the shared state and averaged model, then this trainer's own model and
        optimizer if it checkpointed the same round (a trainer that died earlier starts from the
        averaged model with a fresh optimizer). Returns the last finished round."""
        ckpt = self._load_resume()
        if ckpt is None:
            return 0
        state.update(ckpt["state"])
        self.model.load_state_dict(ckpt["model"])
        done = int(state["epoch"])
        own = Path(self.cfg.resume) / rank_file(self.ctx.rank)
        if own.is_file():
            mine = torch.load(own, map_location="cpu", weights_only=True)  # tensors and numbers only
            if mine["round"] == done:
                self.model.load_state_dict(mine["model"])
                self.optimizer.load_state_dict(mine["optimizer"])
                set_rng_state(mine["rng"])
                self.steps, self.train_s = mine["steps"], mine["train_s"]
                self.wire_train_bytes = mine["wire_train_bytes"]
                for k, v in mine["bytes"].items():
                    self.ctx.counter.add(k, v)
        if self.ctx.rank == min(self.active):
            self.eval_round = -1  # write the curve as the writer
            self.continue_curve("round", done)
            self.eval_round = None
        self.log.info("resumed from %s after round %d", self.cfg.resume, done)
        return done

    # --- the summary (written by the last round's evaluator, from the coordinator's stats) --------------
    def gather_rank_stats(self) -> list:
        ranks = {int(k): v for k, v in self._final_meta["all_stats"].items()}
        ranks[self.ctx.rank] = self.my_stats()  # fresh: includes this trainer's evaluation bytes
        return [ranks[k] for k in sorted(ranks)]

    def final_summary(self, state: dict, meta: dict) -> dict:
        self._final_meta, self._final_state = meta, state
        self.written_summary = self._summary(state)
        return self.written_summary

    def extra_summary(self) -> dict:
        meta = self._final_meta
        p = self.cfg.pipeline
        stats = {int(k): v for k, v in meta["all_stats"].items()}
        stats[self.ctx.rank] = self.my_stats()
        steps = {str(k): s.get("steps", 0) for k, s in sorted(stats.items())}
        per_s = {str(k): (s["steps"] / s["train_s"] if s.get("train_s") else None) for k, s in sorted(stats.items())}
        cats: Dict[str, int] = {}
        for s in stats.values():
            for k, v in s.get("bytes", {}).items():
                cats[k] = cats.get(k, 0) + v
        label_tv = None
        stats_json = Path(self.ctx.part_config).parent / "stats.json"
        if stats_json.is_file():
            import json

            try:
                label_tv = json.loads(stats_json.read_text()).get("label_tv_mean")
            except ValueError:
                pass
        return {
            "rounds": self.rounds_total, "trainers_alive": len(meta["contributors"]),
            "trainers_alive_ranks": meta["contributors"], "trainers_dead_ranks": meta["dead"],
            "drop_parts": list(p.drop_parts), "kill_rank": p.kill_rank,
            "kill_at_s": parse_duration(p.kill_at) if p.kill_rank is not None else None,
            "bandwidth": self.cfg.cluster.bandwidth, "sync_every_s": self.sync_s, "time_limit_s": self.limit_s,
            "weighting": p.weighting, "corr_steps": p.corr_steps if p.variant == "llcg" else 0,
            "partition_method": self.cfg.partition.method, "label_tv_mean": label_tv,
            "steps_per_trainer": steps, "steps_per_s_per_trainer": per_s,
            "net_bytes_train_per_trainer": {str(k): s.get("wire") for k, s in sorted(stats.items())},
            "averaging_bytes": int(cats.get("averaging", 0)), "param_bytes": self.param_bytes,
            "correction_bytes": int(cats.get("correction", 0)),
            "fanouts": list(self.cfg.model.fanouts), "num_classes": self.num_classes,
            "best_round": self._final_state["best_epoch"],
            # what the induced subgraphs keep of the graph's edges (cut edges are dropped)
            "edges_kept_fraction": (sum(s.get("edges", 0) for s in stats.values())
                                    / max(1, sum(s.get("edges_total", 0) for s in stats.values()))),
            **self.link_summary(),
        }

    def link_summary(self) -> dict:
        if not self.link:
            return {}
        return {**self.link_info, "eval_num_neg": int(self.link_split["valid"]["target_node_neg"].shape[1]),
                "eval_edges": {p: len(d["source_node"]) for p, d in self.link_split.items()}}
