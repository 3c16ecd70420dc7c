"""pipeline=tma: RandomTMA, SuperTMA, PSGD-PA and LLCG (arXiv 2305.09887; docs/background.md, "TMA").

One model per machine, trained only on the subgraph its machine owns (local.py: cross-partition
edges dropped, no feature traffic), replaced by the mean of the live trainers' models every
`sync_every_s` seconds of wall time. The variants differ only in the partition and in LLCG's correction:

| variant    | partition (unless `partition=` is given) | after each averaging                  |
|------------|------------------------------------------|---------------------------------------|
| random     | random (each node to a random part)      | -                                     |
| supernode  | supernode (METIS clusters dealt at random)| -                                    |
| psgd-pa    | metis (one edge-balanced part each)      | -                                     |
| llcg       | metis                                    | `corr_steps` whole-graph Adam steps   |

A round (rounds.py drives it through the round contract, contract.py, which this class
implements; service.py has the coordinator's messages, coordinator.py their state machine):
every trainer trains for `sync_every_s` seconds of wall time at its own pace (this class's
`train_for`, finishing the step under way), submits its parameters to the averaging service
on graph server 0 and gets the (by default unweighted) mean of whoever submitted by the
deadline; its Adam state stays its own. Then (every
`train.eval_every`-th round and the last) the live trainers evaluate the averaged model together
(evaluation.py: layer-wise full-neighbour inference on the DistGraph, each trainer computing units
of nodes the coordinator hands out, no process holding the whole graph), outside everyone's
training clock (the paper's clock); the lowest contributing rank leads: it records the round and
releases it. Round 0 only hands every trainer the lowest rank's
initial weights and starts the clocks together. The last round ends at `time_limit_s`.

No torch.distributed at all (Pipeline.tolerates_trainer_faults): a trainer that dies is left out of
the next deadline, its share of an evaluation goes to a live one, a dead lead is replaced, and the
launcher lets the run finish and stops the servers. `drop_parts` is the paper's simulated failure:
those machines' trainers never train (the others evaluate their partitions).

The task (degnn/tasks) decides the supervision: node classification on each subgraph's training
nodes, or link prediction (the paper's own task) on its edges, one uniform local negative each;
the evaluator then ranks the held-out edges carried with the partition against their negatives.

Checkpoints: after every round each trainer writes its own model and optimizer
(`tma_rank<r>.pt`, the models are equal right after an averaging but the Adam states are not),
and the evaluator writes `checkpoint.pt` (the averaged model and the run's state); `resume=`
restores both and continues with the rounds left in the budget.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
from omegaconf import OmegaConf
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from degnn.config import CONF_DIR
from degnn.pipelines.base import Pipeline
from degnn.runtime.device import DeviceMover
from degnn.tasks.evaluation import HIDDEN_DTYPES

from .config import TMAConfig
from .contract import RoundPlan
from .evaluation import SharedEvaluation
from .local import build_local_data
from .rounds import RoundLoop

VARIANT_PARTITION = {"random": "random", "supernode": "supernode", "psgd-pa": "metis", "llcg": "metis"}
WEIGHTINGS = ("uniform", "train_nodes")

@dataclass
class TMASummary:
    """TMA's own summary keys (besides degnn.metrics.summary.RunSummary)."""

    rounds: int
    trainers_alive: int
    trainers_alive_ranks: List[int]
    trainers_dead_ranks: List[int]
    drop_parts: List[int]
    kill_rank: Optional[int]
    kill_at_s: Optional[float]
    bandwidth: Optional[str]
    sync_every_s: float
    time_limit_s: float
    weighting: str
    corr_steps: int
    partition_method: str
    label_tv_mean: Optional[float]
    steps_per_trainer: Dict[str, int]
    steps_per_s_per_trainer: Dict[str, Optional[float]]
    net_bytes_train_per_trainer: Dict[str, Optional[int]]
    averaging_bytes: int
    param_bytes: int
    correction_bytes: int
    best_round: Optional[int]
    # what the induced subgraphs keep of the graph's edges (cut edges are dropped)
    edges_kept_fraction: float
    train_ids_per_trainer: Dict[str, int] = field(default_factory=dict)
    # the last evaluation's scored validation and test nodes (link task: edges), over every unit
    eval_counts: Dict[str, int] = field(default_factory=dict)


class TMAPipeline(Pipeline):
    """The round contract's pipeline (contract.RoundPipeline): `plan`, `train_for`,
    `export_weights` / `load_weights`, `correct`, `eval_unit`, `own_state` / `load_own_state`."""

    name = "tma"
    tasks = ("node", "link")
    config_schema = TMAConfig
    tolerates_trainer_faults = True
    max_trainers_per_machine = 1  # one model per machine (its partition)
    byte_categories = {"averaging": "parameters up to the averaging service and the mean back",
                       "correction": "LLCG's whole-graph correction steps (sampling and features)"}

    @classmethod
    def driver(cls):
        return RoundLoop

    # --- the launcher's preflight ---------------------------------------------------------------
    @classmethod
    def prepare_launch(cls, cfg, task_overrides) -> List[str]:
        p = cfg.pipeline
        if p.variant not in VARIANT_PARTITION:
            raise ValueError(f"pipeline.variant={p.variant!r}: choose one of {', '.join(VARIANT_PARTITION)}")
        for key in ("sync_every_s", "time_limit_s", "round_timeout_s", "evaluator_timeout_s"):
            if p[key] <= 0:
                raise ValueError(f"pipeline.{key}={p[key]}: must be a positive number of seconds")
        if p.weighting not in WEIGHTINGS:
            raise ValueError(f"pipeline.weighting={p.weighting!r}: choose uniform or train_nodes")
        if p.grad_clip < 0 or p.corr_steps < 0:
            raise ValueError("pipeline.grad_clip and pipeline.corr_steps must be >= 0")
        from degnn.runtime.cluster import machines_of

        k = len(machines_of(cfg.cluster))
        drop = list(p.drop_parts)
        bad = [d for d in drop if not 0 <= d < k]
        if bad or len(set(drop)) != len(drop):
            raise ValueError(f"pipeline.drop_parts={drop}: give distinct partition indices 0..{k - 1}")
        if len(drop) >= k:
            raise ValueError(f"pipeline.drop_parts={drop} drops every partition: nothing would train")
        if p.kill_at_s < 0:
            raise ValueError(f"pipeline.kill_at_s={p.kill_at_s}: must be >= 0 seconds")
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
        ctx, cfg, task = self.ctx, self.cfg, self.task
        p = cfg.pipeline
        g = ctx.graph
        self.pb = g.get_partition_book()
        self.part = int(self.pb.partid)
        tpm = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", cfg.cluster.trainers_per_machine)))
        self.active = [r for r in range(ctx.world_size) if r // tpm not in set(p.drop_parts)]
        self.dropped = self.part in set(p.drop_parts)
        task.prepare(ctx, collective=False)  # no torch.distributed here (a trainer may die)
        self.local = build_local_data(g, str(ctx.part_config), self.log, task)
        self.in_dim = self.local.graph.ndata["feat"].shape[1]
        self.build_model(self.in_dim)  # the same initial weights everywhere (round 0 makes sure)
        n_train = len(self.local.train_ids)  # train nodes, or (link task) local edges
        self.steps_per_epoch = max(1, -(-n_train // cfg.train.batch_size))
        self.loader = task.local_loader(self.local.graph, self.local.train_ids, cfg.train.batch_size) if n_train else None
        self.label = task.local_labels(self.local.graph)  # the batches' targets by local node (or None)
        self.weight = 1.0 if p.weighting == "uniform" else float(n_train)
        self.train_s = 0.0  # this trainer's own time in local training steps
        self._batches = None  # the endless iterator over local mini-batches (first train_for)
        self.corrector = None
        self.kill_at = float(p.kill_at_s) if p.kill_rank == ctx.rank else None
        # every trainer makes the evaluation's DistTensors together (a DGL barrier), dropped ones too
        self.evaluation = SharedEvaluation(g, task, ctx.counter, cfg.train.eval_batch_size,
                                           DeviceMover.of(cfg.model.backend, self.device),
                                           hidden_dtype=HIDDEN_DTYPES[str(cfg.train.eval_hidden_dtype)])
        task.evaluate_fn()  # the dataset's evaluator (OGB's), built once before the clocks start
        self.plan = self.round_plan()
        g_local = self.local.graph
        self.log.info("tma/%s: partition %d%s: %d nodes, %d of %d edges kept (cross-partition edges "
                      "dropped), %d train %s; %s, %d parameters; %d rounds of %.0fs",
                      p.variant, self.part, " (dropped: never trains)" if self.dropped else "",
                      g_local.num_nodes(), g_local.num_edges(), self.local.edges_total, n_train,
                      task.unit, task.describe(), sum(t.numel() for t in self.model.parameters()),
                      self.plan.rounds, self.plan.sync_s)

    def round_plan(self) -> RoundPlan:
        """The rounds as the driver runs them (contract.RoundPlan)."""
        p = self.cfg.pipeline
        evaluation = self.evaluation.plan()
        return RoundPlan(
            sync_s=float(p.sync_every_s), limit_s=float(p.time_limit_s), active=list(self.active),
            trains=not self.dropped, homes=evaluation["homes"], phases=evaluation["phases"],
            corrects=self.corrects, eval_every=int(self.cfg.train.eval_every),
            round_timeout_s=float(p.round_timeout_s), evaluator_timeout_s=float(p.evaluator_timeout_s),
            weight=self.weight, round_bytes=self.round_bytes())

    def rank_seed(self) -> int:
        return self.cfg.train.seed + 1000 * (self.ctx.rank + 1)

    @property
    def corrects(self) -> bool:
        p = self.cfg.pipeline
        return p.variant == "llcg" and p.corr_steps > 0

    def round_bytes(self) -> int:
        """Averaging bytes of one trainer a round: parameters up, the mean down (LLCG: the
        corrected weights down too)."""
        return self.param_bytes() * (3 if self.corrects else 2)

    # --- the model as one flat tensor --------------------------------------------------------------
    def export_weights(self) -> torch.Tensor:
        return parameters_to_vector(self.model.parameters()).detach().clone()

    def load_weights(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            vector_to_parameters(flat.to(torch.float32), self.model.parameters())

    def own_state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "steps": self.batches, "train_s": self.train_s, "wire_train_bytes": self.wire_train_bytes}

    def load_own_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.train_s = state["train_s"]

    # --- local training ------------------------------------------------------------------------------
    def train_for(self, seconds: float) -> Tuple[int, float]:
        """Local steps until `seconds` of wall time have passed: (steps, mean loss). The time
        counts as this trainer's training, the wire bytes meanwhile as its training traffic."""
        t0 = time.time()
        w0, steps0 = self.wire.read(), self.batches
        total = 0.0
        if self.loader is None:  # no training nodes (edges) here: the round passes idle
            time.sleep(seconds)
        else:
            if self._batches is None:
                self._batches = iter(self.batches_of(0))
            while time.time() < t0 + seconds:
                total += self.step(next(self._batches))
        self.train_s += time.time() - t0
        if w0 is not None:
            self.wire_train_bytes += self.wire.read() - w0
        n = self.batches - steps0
        return n, (total / n if n else float("nan"))

    def batches_of(self, epoch: int):
        """Local mini-batches without end: a new pass over the loader whenever one ends."""
        while True:
            yield from self.loader

    def step(self, batch) -> float:
        p = self.cfg.pipeline
        if p.kill_during == "train":
            self._maybe_die(self.train_s, "training")
        self.task.observe(batch)
        self.model.train()
        loss = self.task.batch_loss(self.model, batch, self.local.graph.ndata["feat"], self.label, self.mover)
        clip = p.grad_clip if p.grad_clip > 0 and self.batches / self.steps_per_epoch >= p.grad_clip_since else 0.0
        self.batches += 1
        return self.optimize(loss, clip)

    def _maybe_die(self, trained_s: float, where: str) -> None:
        """Fault injection (pipeline.kill_rank): SIGKILL this process once it trained `kill_at_s` seconds."""
        if self.kill_at is not None and trained_s >= self.kill_at:
            self.log.warning("pipeline.kill_rank=%d: killing myself (SIGKILL) in %s after %.1fs of "
                             "training", self.ctx.rank, where, trained_s)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def maybe_die_in_eval(self, r: int, phase: int) -> None:
        """kill_during=eval: in the evaluation's second phase (the first layer's rows are all
        written), once this trainer has written a batch of its unit."""
        if self.cfg.pipeline.kill_during == "eval" and phase == min(1, self.evaluation.phases - 1):
            self._maybe_die(self.train_s, f"the evaluation of round {r}")

    def rank_stats(self) -> dict:
        return {"rank": self.ctx.rank, "part": self.part, "steps": self.batches, "train_s": round(self.train_s, 3),
                "local_epochs": self.batches / self.steps_per_epoch, "train_ids": int(len(self.local.train_ids)),
                "nodes": self.local.graph.num_nodes(),
                "edges": self.local.graph.num_edges(), "edges_total": self.local.edges_total}

    # --- a trainer's part of the evaluation ------------------------------------------------------------
    def correct(self, beat: Callable[[], None]) -> Optional[torch.Tensor]:
        """LLCG: `corr_steps` whole-graph steps on the averaged model (loaded), beating now and
        then; None otherwise."""
        p = self.cfg.pipeline
        if not self.corrects:
            return None
        if self.corrector is None:
            from .evaluation import Corrector

            self.corrector = Corrector(self.ctx.graph, self.cfg, self.in_dim, self.task, self.ctx.counter)
        corrected = self.corrector.correct(self.export_weights(), p.corr_steps, beat)
        self.load_weights(corrected)
        return corrected

    def eval_unit(self, r: int, phase: int, unit: int, still_mine: Callable[[], bool]) -> Optional[dict]:
        """One unit of round r's evaluation: a layer's rows ({}) or the scoring's metric sums;
        None when `still_mine()` says the coordinator gave the unit to another trainer meanwhile."""
        self.model.eval()
        try:
            if phase < self.evaluation.layers:
                done = self.evaluation.layer(self.model, phase, unit, still_mine,
                                             lambda: self.maybe_die_in_eval(r, phase))
                return {} if done else None
            return self.evaluation.score(self.model, unit)
        finally:
            self.model.train()

    # --- the summary (written by the last round's evaluator, from every trainer's stats) -----------------
    def summary_extra(self, ranks: List[dict], context: dict) -> TMASummary:
        p = self.cfg.pipeline
        cats: Dict[str, int] = {}
        for s in ranks:
            for k, v in s.get("bytes", {}).items():
                cats[k] = cats.get(k, 0) + v
        label_tv = None
        stats_json = Path(self.ctx.part_config).parent / "stats.json"
        if stats_json.is_file():
            try:
                label_tv = json.loads(stats_json.read_text()).get("label_tv_mean")
            except ValueError:
                pass
        by_rank = {str(s["rank"]): s for s in ranks}
        return TMASummary(
            rounds=self.plan.rounds, trainers_alive=len(context["alive_ranks"]),
            trainers_alive_ranks=context["alive_ranks"], trainers_dead_ranks=context["dead_ranks"],
            drop_parts=list(p.drop_parts), kill_rank=p.kill_rank,
            kill_at_s=float(p.kill_at_s) if p.kill_rank is not None else None,
            bandwidth=self.cfg.cluster.bandwidth, sync_every_s=self.plan.sync_s, time_limit_s=self.plan.limit_s,
            weighting=p.weighting, corr_steps=p.corr_steps if p.variant == "llcg" else 0,
            partition_method=self.cfg.partition.method, label_tv_mean=label_tv,
            steps_per_trainer={k: s.get("steps", 0) for k, s in by_rank.items()},
            steps_per_s_per_trainer={k: (s["steps"] / s["train_s"] if s.get("train_s") else None)
                                     for k, s in by_rank.items()},
            net_bytes_train_per_trainer={k: s.get("wire") for k, s in by_rank.items()},
            averaging_bytes=int(cats.get("averaging", 0)), param_bytes=self.param_bytes(),
            correction_bytes=int(cats.get("correction", 0)), best_round=context["state"]["best_epoch"],
            edges_kept_fraction=(sum(s.get("edges", 0) for s in ranks)
                                 / max(1, sum(s.get("edges_total", 0) for s in ranks))),
            train_ids_per_trainer={k: s.get("train_ids", 0) for k, s in by_rank.items()},
            eval_counts=dict(context["state"].get("eval_counts") or {}))
