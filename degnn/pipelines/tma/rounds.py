"""TMA's driver: wall-clock rounds instead of epochs, over a pipeline that implements the round
contract (contract.py: `RoundPipeline`), and the same RunRecord as the epoch loop.

One round r (the messages are service.py's, their state machine coordinator.py's, on graph
server 0):

    train: `train_for` the round's budget of wall time (the step under way is finished)
    -> `Submit` the exported weights and this trainer's stats -> `PollMean` until the round
    closes and load the mean of whoever submitted in time -> the evaluation (`evaluate_round`;
    every `train.eval_every`-th round and the last, the others are only recorded and released):
    every live trainer computes the units of it the coordinator hands out (`eval_unit`: layer
    rows, then scores; LLCG: once the round's lead, the lowest contributing rank, has corrected
    the mean); the lead gets the metric over every unit, writes the curve line, the best model and
    the shared checkpoint through the RunRecord, and `Release`s the round (a dead lead or worker
    is replaced) -> each trainer saves its own state (`own_state`) -> `PollStart` until every live
    trainer has the released weights, and the next round starts.

Round 0 only hands every trainer the lowest rank's initial weights and starts the clocks
together. Every ending goes through the RunRecord: the last round's lead writes the summary
(status ok, with the live and dead ranks), and a diverged round's lead writes its curve line
and the failed summary.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from degnn.pipelines.record import RunRecord, rng_state, set_rng_state
from degnn.runtime.checkpoint import save_atomic
from degnn.startup import resume_collector

from .contract import Replaced, RoundPipeline
from .service import (Beat, CoordinatorClient, EvalDone, EvalOpen, EvalPoll, Hello, PollMean, PollRelease,
                      PollStart, Release, Submit)

# round 0 waits this long for every trainer to come up (DGL start-up on a loaded machine)
START_TIMEOUT_S = 180.0
# the first wait between two asks for evaluation work (doubling up to the client's poll_s)
EVAL_POLL_MIN_S = 0.005
# the lead's heartbeat while it corrects the mean (the coordinator's evaluator_timeout_s is longer)
BEAT_EVERY_S = 2.0


def rank_file(rank: int) -> str:
    return f"tma_rank{rank}.pt"


class RoundLoop:
    """Drives a RoundPipeline (contract.py) through the coordinator's rounds; `client` is the
    coordinator's client (a test may give one that answers in-process)."""

    def __init__(self, pipeline: RoundPipeline, client: Optional[CoordinatorClient] = None):
        self.p = pipeline
        self.ctx, self.cfg = pipeline.ctx, pipeline.cfg
        self.log = self.ctx.log
        self.record = RunRecord(pipeline)
        self.record.writer = False  # the round's lead writes, when the driver says so
        self.client = client  # the coordinator's client (made after set-up unless given)
        self.summary: Optional[dict] = None
        # read by the entry: whether DGL's exit barrier of all clients can complete
        self.all_trainers_alive = False

    # --- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        p, ctx, rec = self.p, self.ctx, self.record
        p.setup()
        resume_collector()  # start-up is over (degnn/startup.py)
        rec.mark_setup()
        plan = p.plan
        if self.client is None:
            self.client = CoordinatorClient(ctx.rank, ctx.counter)
        self.wall0 = time.time()
        rec.state.update(trainers_alive=None, coordinator_log=[], eval_counts={})
        start_round = self.resume()
        self.client.call(Hello(ctx.rank, plan.active, START_TIMEOUT_S, plan.round_timeout_s, plan.evaluator_timeout_s,
                               plan.homes, plan.phases, plan.corrects, plan.eval_every, plan.rounds), category=None)
        if not plan.trains:
            # the paper's simulated failure: this partition is never trained; wait for the end
            self.client.poll_s = 1.0
            rel = self.client.wait(PollRelease(plan.rounds, ctx.rank), ("released",))
            self.all_trainers_alive = bool(rel.meta["state"].get("all_alive"))
            self.log.info("rank %d: its partition was dropped (pipeline.drop_parts): the run is over", ctx.rank)
            return {"status": "ok"}
        rec.writer = ctx.rank == min(plan.active)  # before round 1: the lowest rank writes
        rec.write_config()
        rec.writer = False
        # round 0: the lowest rank's weights to everyone; the clocks start together
        self.client.call(Submit(0, ctx.rank, p.export_weights(), stats=self.stats()))
        p.load_weights(self.client.wait(PollMean(0, ctx.rank), ("mean",)).weights)
        self.client.wait(PollStart(0, ctx.rank), ("go",), category=None)
        for r in range(start_round + 1, plan.rounds + 1):
            if not self.one_round(r):
                return self.summary
            if r < plan.rounds:
                self.client.wait(PollStart(r, ctx.rank), ("go",), category=None)
        return self.summary or {"status": "ok"}

    def one_round(self, r: int) -> bool:
        """One round; False when the run ends with it (diverged)."""
        p, ctx, plan = self.p, self.ctx, self.p.plan
        t0 = time.time()
        steps, loss = p.train_for(plan.budget(r))
        # the stats travel with the submission, so they count this round's averaging traffic in
        # advance: parameters up, the mean down (LLCG: the corrected weights down too)
        ctx.counter.add("averaging", plan.round_bytes)
        stats = {**self.stats(), "round_steps": steps, "loss": loss}
        self.client.call(Submit(r, ctx.rank, p.export_weights(), plan.weight, stats), category=None)
        res = self.client.wait(PollMean(r, ctx.rank), ("mean",), category=None)
        if res.meta.get("diverged"):  # every live trainer's loss is not finite (the coordinator's verdict)
            self.end_diverged(r, res.meta)
            return False
        round_s = time.time() - t0
        p.load_weights(res.weights)
        self.evaluate_round(r, round_s)
        self.save_own(r)
        self.all_trainers_alive = bool(self.record.state.get("all_alive"))
        return True

    def end_diverged(self, r: int, meta: dict) -> None:
        """A diverged round ends the run: every trainer returns the failed status (its exit code
        is then 1); the round's lead records it through the RunRecord (a `diverged` curve line,
        the summary with status failed)."""
        error = meta["diverged"]
        self.all_trainers_alive = not meta["dead"]
        self.summary = {"status": "failed", "error": error}
        lead = meta.get("evaluator") == self.ctx.rank
        self.record.writer = lead
        try:
            self.record.diverged("round", r, error, time.time() - self.wall0)
            if lead:
                self.final_summary(meta)
        finally:
            self.record.writer = False

    def stats(self) -> dict:
        return self.record.rank_stats()

    @staticmethod
    def mean_loss(stats: Dict) -> Optional[float]:
        losses = [s["loss"] for s in stats.values() if isinstance(s.get("loss"), float) and not math.isnan(s["loss"])]
        return sum(losses) / len(losses) if losses else None

    # --- the evaluation -------------------------------------------------------------------------
    def evaluate_round(self, r: int, round_s: float) -> None:
        """Round r's evaluation as the coordinator directs it, until the round is released."""
        p, rank = self.p, self.ctx.rank
        told = False  # logged that this trainer took the lead over
        idle_s = EVAL_POLL_MIN_S  # waits grow while there is nothing to do (a phase's stragglers)
        while True:
            res = self.client.call(EvalPoll(r, rank), category=None)
            if res.status in ("lead", "scored") and res.meta["first_evaluator"] != rank and not told:
                told = True
                self.log.warning("round %d: taking over evaluation from rank %s", r, res.meta["first_evaluator"])
            if res.status == "wait":
                time.sleep(idle_s)
                idle_s = min(2 * idle_s, self.client.poll_s)
                continue
            idle_s = EVAL_POLL_MIN_S
            if res.weights.numel():
                p.load_weights(res.weights)  # the mean to correct, or LLCG's corrected weights
            if res.status == "lead":  # open the evaluation (LLCG: with the corrected mean)
                try:
                    self.open_evaluation(r)
                except Replaced:
                    self.log.warning("round %d: evaluation handed to another trainer", r)
            elif res.status == "work":
                self.eval_unit(r, res.meta["phase"], res.meta["unit"])
            elif res.status == "scored":
                try:
                    self.lead_round(r, res.meta, round_s)
                    return
                except Replaced:
                    self.log.warning("round %d: evaluation handed to another trainer", r)
                finally:
                    self.record.writer = False
            else:  # released
                self.record.state.update(res.meta["state"])
                return

    def eval_unit(self, r: int, phase: int, unit: int) -> None:
        """One unit handed to this trainer, reported with its fresh stats (the summary counts
        everyone's evaluation bytes)."""
        rank = self.ctx.rank

        def still_mine() -> bool:
            return self.client.call(Beat(r, rank, unit), category=None).status == "ok"

        partial = self.p.eval_unit(r, phase, unit, still_mine)
        if partial is None:
            self.log.warning("round %d: unit %d of phase %d handed to another trainer", r, unit, phase)
        else:
            self.client.call(EvalDone(r, rank, phase, unit, partial, self.stats()), category=None)

    def lead_beat(self, r: int) -> Callable[[], None]:
        """The lead's heartbeat while it corrects round r's mean: Replaced once the round went
        to another trainer."""
        last = [0.0]

        def beat() -> None:
            now = time.time()
            if now - last[0] >= BEAT_EVERY_S:
                last[0] = now
                if self.client.call(Beat(r, self.ctx.rank), category=None).status != "ok":
                    raise Replaced()
        return beat

    def open_evaluation(self, r: int) -> None:
        """The lead opens round r's evaluation: LLCG corrects the mean first (its time counts as
        training), and the corrected weights go to every trainer with its first unit."""
        t0 = time.time()
        corrected = self.p.correct(self.lead_beat(r))
        corr_s = time.time() - t0 if corrected is not None else 0.0
        # (the corrected weights were counted in advance as every trainer's download)
        weights = corrected if corrected is not None else torch.zeros(0)
        res = self.client.call(EvalOpen(r, self.ctx.rank, weights, corr_s), category=None)
        if res.status != "ok":
            raise Replaced()

    def lead_round(self, r: int, meta: dict, round_s: float) -> None:
        """Record round r (with its evaluation's metric over every unit, when the round was
        evaluated) and release it."""
        plan, rec = self.p.plan, self.record
        state = rec.state
        rec.writer = True  # the lead writes the shared files (curve, best model, checkpoint, summary)
        corr_s = meta["corr_s"]  # correction is LLCG's training
        state["train_time_s"] += round_s + corr_s
        state["epoch_times"].append(round_s + corr_s)
        state["epoch"] = r
        state["trainers_alive"] = len(meta["contributors"])
        state["all_alive"] = sorted(meta["contributors"]) == sorted(plan.active) and not meta["dead"]
        stats = meta["stats"]
        record = {"round": r, "local_epochs": round(min(s.get("local_epochs", 0.0) for s in stats.values()), 3),
                  "train_time_s": round(state["train_time_s"], 3), "wall_s": round(time.time() - self.wall0, 3)}
        evaluated = meta["evaluated"]
        if evaluated:
            sums = meta["sums"]
            val, test = (sums[k][0] / sums[k][1] if sums[k][1] else 0.0 for k in ("val", "test"))
            rec.keep_best(val, test, r)
            state["eval_counts"] = {k: int(sums[k][1]) for k in ("val", "test")}
            record.update(val=val, test=test)
        record.update({"trainers": meta["contributors"],
                       "steps": {str(k): s.get("round_steps", 0) for k, s in stats.items()},
                       "round_time_s": round(round_s + corr_s, 3),
                       # parameters up and the mean down per contributor (LLCG: the corrected weights too)
                       "averaging_bytes": plan.round_bytes * len(meta["contributors"]),
                       "loss": self.mean_loss(stats)})
        if evaluated:
            # the evaluation: nodes (link task: edges) scored, who computed units, how many units
            # a trainer computed for another partition's, its wall time
            record.update(eval_counts=state["eval_counts"], eval_trainers=meta["workers"],
                          eval_handed_on=meta["handed_on"], eval_s=round(meta["eval_s"], 3))
            self.log.info("round %d/%d: val %.4f, test %.4f, %d trainers (%s steps), %.1fs%s; evaluated by %s in %.1fs",
                          r, plan.rounds, val, test, len(meta["contributors"]), record["steps"], round_s + corr_s,
                          f", llcg correction {corr_s:.2f}s" if corr_s else "", meta["workers"], meta["eval_s"])
        else:
            self.log.info("round %d/%d: %d trainers (%s steps), %.1fs%s; not evaluated (train.eval_every=%d)",
                          r, plan.rounds, len(meta["contributors"]), record["steps"], round_s + corr_s,
                          f", llcg correction {corr_s:.2f}s" if corr_s else "", plan.eval_every)
        rec.curve(record)
        for line in meta.get("log", [])[len(state.get("coordinator_log", [])):]:
            self.log.warning("coordinator: %s", line)
        state["coordinator_log"] = list(meta.get("log", []))
        # the shared checkpoint has the layout resume= checks (degnn/runtime/checkpoint.py); the
        # optimizer and RNG states are each trainer's own (tma_rank<r>.pt)
        rec.checkpoint({}, None)
        if r == plan.rounds:
            self.final_summary(meta)
        shared = {k: state[k] for k in ("train_time_s", "best_val", "best_test", "best_epoch", "test_final",
                                        "epoch", "epoch_times", "trainers_alive", "all_alive",
                                        "coordinator_log", "eval_counts")}
        res = self.client.call(Release(r, self.ctx.rank, torch.zeros(0), shared), category=None)
        if res.status != "ok":
            raise Replaced()

    def final_summary(self, meta: dict) -> None:
        """The summary, from the coordinator's latest stats of every trainer (dead ones too)."""
        ranks = {int(k): v for k, v in meta["all_stats"].items()}
        ranks[self.ctx.rank] = self.stats()  # fresh: includes this trainer's evaluation bytes
        self.record.state["wall_s"] = time.time() - self.wall0
        context = {"alive_ranks": meta["contributors"], "dead_ranks": meta["dead"]}
        self.summary = self.record.summary([ranks[k] for k in sorted(ranks)], self.wall0, context)

    # --- checkpoints -----------------------------------------------------------------------------
    def save_own(self, r: int) -> None:
        save_atomic(self.ctx.run_dir / rank_file(self.ctx.rank), {
            "round": r, **self.p.own_state(), "rng": rng_state(), "bytes": self.ctx.counter.as_dict()})

    def resume(self) -> int:
        """The shared state and averaged model, then this trainer's own model and optimizer if it
        checkpointed the same round (a trainer that died earlier starts from the averaged model
        with a fresh optimizer). Returns the last finished round."""
        p, rec = self.p, self.record
        ckpt = rec.load_resume()
        if ckpt is None:
            return 0
        rec.state.update(ckpt["state"])
        rec.restore_model(ckpt, optimizer=False)
        done = int(rec.state["epoch"])
        own = Path(self.cfg.resume) / rank_file(self.ctx.rank)
        if own.is_file():
            mine = torch.load(own, map_location="cpu", weights_only=True)  # tensors and numbers only
            if mine["round"] == done:
                p.load_own_state(mine)
                set_rng_state(mine["rng"])
                rec.restore_counters({"batches": mine["steps"], "wire_train_bytes": mine["wire_train_bytes"],
                                      "bytes": mine["bytes"]})
        rec.writer = self.ctx.rank == min(p.plan.active)
        rec.continue_curve("round", done)
        rec.writer = False
        self.log.info("resumed from %s after round %d", self.cfg.resume, done)
        return done
