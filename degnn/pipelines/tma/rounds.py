"""TMA's driver: wall-clock rounds instead of epochs, over the pipeline's own parts
(`batches_of`, `step`, `evaluate`) and the same RunRecord as the epoch loop.

One round r (service.py has the protocol on graph server 0):

    train: the pipeline's steps for `sync_every_s` seconds of wall time (the step under way is finished)
    -> submit the flat parameters and this trainer's stats -> poll until the round closes and
    take the mean of whoever submitted in time -> the evaluation (`evaluate_round`; every
    `train.eval_every`-th round and the last, the others are only recorded and released): every
    live trainer computes the units of it the coordinator hands out (layer rows, then scores; LLCG:
    once the round's lead, the lowest contributing rank, has corrected the mean); the lead gets
    the metric over every unit, writes the curve line, the best model and the shared checkpoint,
    and releases the round (a dead lead or worker is replaced) -> each trainer saves its own
    model and optimizer -> poll until every live trainer has the released weights, and the next
    round starts.

Round 0 only hands every trainer the lowest rank's initial weights and starts the clocks
together. The last round's evaluator writes the summary from the coordinator's stats.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Dict, Optional

import torch

from degnn.pipelines.record import RunRecord, rng_state, save_atomic, set_rng_state

from .service import end_diverged

# round 0 waits this long for every trainer to come up (DGL start-up on a loaded machine)
START_TIMEOUT_S = 180.0
# the first wait between two asks for evaluation work (doubling up to the client's poll_s)
EVAL_POLL_MIN_S = 0.005


def rank_file(rank: int) -> str:
    return f"tma_rank{rank}.pt"


class Replaced(Exception):
    """The coordinator gave this round's evaluation to another trainer (we were too slow)."""


class RoundLoop:
    def __init__(self, pipeline):
        self.p = pipeline
        self.ctx, self.cfg = pipeline.ctx, pipeline.cfg
        self.record = RunRecord(pipeline)
        self.client = None  # the pipeline's coordinator client, once it is set up
        self.summary: Optional[dict] = None

    # --- local training ------------------------------------------------------------------------
    def train_for(self, seconds: float, batches) -> tuple:
        """The pipeline's steps until `seconds` of wall time have passed: (steps, mean loss)."""
        if batches is None:
            time.sleep(seconds)
            return 0, float("nan")
        t_end = time.time() + seconds
        total, n = 0.0, 0
        while time.time() < t_end:
            total += self.p.step(next(batches))
            n += 1
        return n, (total / n if n else float("nan"))

    # --- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        p, ctx = self.p, self.ctx
        p.setup()
        self.record.mark_setup()
        self.client = p.client
        self.wall0 = time.time()
        state = self.record.state
        state.update(trainers_alive=None, coordinator_log=[], eval_counts={})
        start_round = self.resume()
        self.client.call("hello", 0, meta=p.coordinator_settings(START_TIMEOUT_S))
        if p.dropped:
            # the paper's simulated failure: this partition is never trained; wait for the end
            self.client.poll_s = 1.0
            rel = self.client.wait("poll_release", p.rounds_total, ("released",))
            p.all_trainers_alive = bool(rel.meta["state"].get("all_alive"))
            p.log.info("partition %d was dropped (pipeline.drop_parts): the run is over", p.part)
            return {"status": "ok"}
        self.record.writer = ctx.rank == min(p.active)  # before round 1: the lowest rank writes
        self.record.write_config()
        self.record.writer = None
        # round 0: the lowest rank's weights to everyone; the clocks start together
        self.client.call("submit", 0, p.flat(), {"stats": self.stats()})
        p.load_flat(self.client.wait("poll_mean", 0, ("mean",)).tensor)
        self.client.wait("poll_start", 0, ("go",), category=None)
        batches = iter(p.batches_of(0)) if p.loader is not None else None
        for r in range(start_round + 1, p.rounds_total + 1):
            if not self.one_round(r, batches):
                return self.summary
            if r < p.rounds_total:
                self.client.wait("poll_start", r, ("go",), category=None)
        return self.summary or {"status": "ok"}

    def one_round(self, r: int, batches) -> bool:
        """One round; False when the run ends with it (diverged)."""
        p, ctx = self.p, self.ctx
        state = self.record.state
        budget = min(p.sync_s, p.limit_s - (r - 1) * p.sync_s)
        t0 = time.time()
        w0, steps0 = p.wire.read(), p.batches
        _, loss = self.train_for(budget, batches)
        p.train_s += time.time() - t0
        if w0 is not None:
            p.wire_train_bytes += p.wire.read() - w0
        # the stats travel with the submission, so they count this round's averaging traffic in
        # advance: parameters up, the mean down (LLCG: the corrected weights down too)
        self.ctx.counter.add("averaging", p.round_bytes())
        stats = {**self.stats(), "round_steps": p.batches - steps0, "loss": loss}
        self.client.call("submit", r, p.flat(), {"weight": p.weight, "stats": stats}, category=None)
        res = self.client.wait("poll_mean", r, ("mean",), category=None)
        if res.meta.get("diverged"):  # every live trainer's loss is not finite (the coordinator's verdict)
            self.summary = end_diverged(ctx, r, res.meta, self.wall0)
            return False
        round_s = time.time() - t0
        p.load_flat(res.tensor)
        self.evaluate_round(r, round_s)
        self.save_own(r)
        p.all_trainers_alive = bool(state.get("all_alive"))
        return True

    def stats(self) -> dict:
        return self.record.rank_stats()

    @staticmethod
    def mean_loss(stats: Dict) -> Optional[float]:
        losses = [s["loss"] for s in stats.values() if isinstance(s.get("loss"), float) and not math.isnan(s["loss"])]
        return sum(losses) / len(losses) if losses else None

    # --- the evaluation -------------------------------------------------------------------------
    def evaluate_round(self, r: int, round_s: float) -> None:
        """Round r's evaluation as the coordinator directs it, until the round is released."""
        p, ctx = self.p, self.ctx
        told = False  # logged that this trainer took the lead over
        idle_s = EVAL_POLL_MIN_S  # waits grow while there is nothing to do (a phase's stragglers)
        while True:
            res = self.client.call("eval_poll", r, category=None)
            if res.status in ("lead", "scored") and res.meta["first_evaluator"] != ctx.rank and not told:
                told = True
                p.log.warning("round %d: taking over evaluation from rank %s", r, res.meta["first_evaluator"])
            if res.status == "wait":
                time.sleep(idle_s)
                idle_s = min(2 * idle_s, self.client.poll_s)
                continue
            idle_s = EVAL_POLL_MIN_S
            if res.status == "lead":  # open the evaluation (LLCG: with the corrected mean)
                p.load_flat(res.tensor)
                try:
                    self.open_evaluation(r)
                except Replaced:
                    p.log.warning("round %d: evaluation handed to another trainer", r)
                finally:
                    p.eval_round = None
            elif res.status == "work":
                if res.tensor.numel():
                    p.load_flat(res.tensor)  # LLCG's corrected weights: the evaluated model
                phase, unit = res.meta["phase"], res.meta["unit"]
                partial = p.eval_unit(r, phase, unit)
                if partial is None:
                    p.log.warning("round %d: unit %d of phase %d handed to another trainer", r, unit, phase)
                else:
                    # with this trainer's fresh stats: the summary counts everyone's evaluation bytes
                    self.client.call("eval_done", r, meta={"phase": phase, "unit": unit, "partial": partial,
                                                           "stats": self.stats()}, category=None)
            elif res.status == "scored":
                if res.tensor.numel():
                    p.load_flat(res.tensor)
                try:
                    self.lead_round(r, res.meta, round_s)
                    return
                except Replaced:
                    p.log.warning("round %d: evaluation handed to another trainer", r)
                finally:
                    p.eval_round = None
            else:  # released
                if res.tensor.numel():
                    p.load_flat(res.tensor)  # LLCG's corrected weights
                self.record.state.update(res.meta["state"])
                return

    def open_evaluation(self, r: int) -> None:
        """The lead opens round r's evaluation: LLCG corrects the mean first (its time counts as
        training), and the corrected weights go to every trainer with its first unit."""
        p = self.p
        p.eval_round, p.last_beat = r, 0.0
        t0 = time.time()
        corrected = p.correct()
        corr_s = time.time() - t0 if corrected is not None else 0.0
        # (the corrected weights were counted in advance as every trainer's download)
        res = self.client.call("eval_open", r, corrected, {"corr_s": corr_s}, category=None)
        if res.status != "ok":
            raise Replaced()

    def lead_round(self, r: int, meta: dict, round_s: float) -> None:
        """Record round r (with its evaluation's metric over every unit, when the round was
        evaluated) and release it."""
        p, rec = self.p, self.record
        state = rec.state
        p.eval_round = r
        corr_s = meta["corr_s"]  # correction is LLCG's training
        state["train_time_s"] += round_s + corr_s
        state["epoch_times"].append(round_s + corr_s)
        state["epoch"] = r
        state["trainers_alive"] = len(meta["contributors"])
        state["all_alive"] = sorted(meta["contributors"]) == sorted(p.active) and not meta["dead"]
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
                       "averaging_bytes": p.round_bytes() * len(meta["contributors"]),
                       "loss": self.mean_loss(stats)})
        if evaluated:
            # the evaluation: nodes (link task: edges) scored, who computed units, how many units
            # a trainer computed for another partition's, its wall time
            record.update(eval_counts=state["eval_counts"], eval_trainers=meta["workers"],
                          eval_handed_on=meta["handed_on"], eval_s=round(meta["eval_s"], 3))
            p.log.info("round %d/%d: val %.4f, test %.4f, %d trainers (%s steps), %.1fs%s; evaluated by %s in %.1fs",
                       r, p.rounds_total, val, test, len(meta["contributors"]), record["steps"], round_s + corr_s,
                       f", llcg correction {corr_s:.2f}s" if corr_s else "", meta["workers"], meta["eval_s"])
        else:
            p.log.info("round %d/%d: %d trainers (%s steps), %.1fs%s; not evaluated (train.eval_every=%d)",
                       r, p.rounds_total, len(meta["contributors"]), record["steps"], round_s + corr_s,
                       f", llcg correction {corr_s:.2f}s" if corr_s else "", self.cfg.train.eval_every)
        rec.curve(record)
        for line in meta.get("log", [])[len(state.get("coordinator_log", [])):]:
            p.log.warning("coordinator: %s", line)
        state["coordinator_log"] = list(meta.get("log", []))
        # the shared checkpoint has the layout resume= checks (degnn/runtime/checkpoint.py); the
        # optimizer and RNG states are each trainer's own (tma_rank<r>.pt)
        rec.checkpoint({}, None)
        if r == p.rounds_total:
            self.final_summary(meta)
        shared = {k: state[k] for k in ("train_time_s", "best_val", "best_test", "best_epoch", "test_final",
                                        "epoch", "epoch_times", "trainers_alive", "all_alive",
                                        "coordinator_log", "eval_counts")}
        res = self.client.call("release", r, None, {"state": shared}, category=None)
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
        p = self.p
        save_atomic(self.ctx.run_dir / rank_file(self.ctx.rank), {
            "round": r, "model": p.model.state_dict(), "optimizer": p.optimizer.state_dict(),
            "rng": rng_state(), "steps": p.batches, "train_s": p.train_s,
            "wire_train_bytes": p.wire_train_bytes, "bytes": self.ctx.counter.as_dict()})

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
                p.model.load_state_dict(mine["model"])
                p.optimizer.load_state_dict(mine["optimizer"])
                set_rng_state(mine["rng"])
                p.train_s = mine["train_s"]
                rec.restore_counters({"batches": mine["steps"], "wire_train_bytes": mine["wire_train_bytes"],
                                      "bytes": mine["bytes"]})
        rec.writer = self.ctx.rank == min(p.active)
        rec.continue_curve("round", done)
        rec.writer = None
        p.log.info("resumed from %s after round %d", self.cfg.resume, done)
        return done
