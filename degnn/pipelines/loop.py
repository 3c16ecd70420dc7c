"""The epoch loop: how every epoch-shaped pipeline trains (distdgl, lamp, and any new one).

    setup -> [resume] -> for each epoch: barrier, the pipeline's batches (each: sampling timed,
    step, heartbeat, progress) -> divergence check -> time budget -> evaluation every
    train.eval_every epochs (best model kept) -> curve line -> checkpoint every
    train.checkpoint_every epochs -> early stop -> summary

The pipeline supplies the parts (degnn/pipelines/base.py); the record (record.py) keeps the
counters, the best point, the checkpoints, the curve and the summary.
"""
from __future__ import annotations

import math
import time
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from tqdm import tqdm

from degnn.pipelines.record import RunRecord, param_digest, rng_state, set_rng_state
from degnn.proc import trim_heap
from degnn.runtime.console import progress_bar
from degnn.startup import resume_collector


def diverged(loss: float, batches: int) -> bool:
    """Whether any trainer's epoch loss is not finite (one all-reduce; every rank gets the answer)."""
    flag = torch.tensor([1 if batches and not math.isfinite(loss) else 0])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def broadcast_object(obj, src: int = 0):
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def profiled(p, fn, *args):
    """fn(*args), under cProfile on rank 0 when train.profile is set (cumulative over epochs):
    <run dir>/profile_rank0.txt (top functions) and .prof (`python -m pstats`)."""
    if not (p.cfg.train.profile and p.ctx.is_rank0):
        return fn(*args)
    import cProfile
    import io
    import pstats

    if not hasattr(p, "_profile"):
        p._profile = cProfile.Profile()
    p._profile.enable()
    try:
        return fn(*args)
    finally:
        p._profile.disable()
        out = io.StringIO()
        pstats.Stats(p._profile, stream=out).sort_stats("cumulative").print_stats(40)
        (p.ctx.run_dir / "profile_rank0.txt").write_text(out.getvalue())
        p._profile.dump_stats(str(p.ctx.run_dir / "profile_rank0.prof"))  # for pstats


class EpochLoop:
    def __init__(self, pipeline):
        self.p = pipeline
        self.ctx, self.cfg = pipeline.ctx, pipeline.cfg
        self.record = RunRecord(pipeline)

    # --- one epoch -------------------------------------------------------------------------------
    def train_epoch(self, epoch: int, progress: Optional[tqdm]) -> Tuple[float, int]:
        """The pipeline's batches of one epoch: (mean loss, number of batches)."""
        p, timer, heartbeat = self.p, self.p.timer, self.ctx.heartbeat
        total, n = 0.0, 0
        batches = iter(p.batches_of(epoch))
        while True:
            with timer("sampling"):  # building the batch: sampling, requests to other machines
                batch = next(batches, None)
            if batch is None:
                break
            loss = p.step(batch)
            total += loss
            n += 1
            heartbeat.beat()
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss:.3f}", refresh=False)
        p.epoch_end()
        return (total / n if n else float("nan")), n

    def timed_epoch(self, epoch: int) -> Tuple[float, int, float]:
        p, cfg = self.p, self.cfg
        progress = None
        if self.ctx.is_rank0:
            progress = progress_bar(p.batches_per_epoch(), f"epoch {epoch}/{cfg.train.epochs}")
        dist.barrier()
        wire0, t0 = p.wire.read(), time.time()
        loss, nb = profiled(p, self.train_epoch, epoch, progress)
        dt = time.time() - t0
        wire1 = p.wire.read()
        if wire0 is not None:
            p.wire_train_bytes += wire1 - wire0
        if progress is not None:
            progress.close()
        return loss, nb, dt

    # --- the run ---------------------------------------------------------------------------------
    def resume(self) -> None:
        ckpt = self.record.load_resume()
        if ckpt is None:
            return
        state = self.record.state
        self.record.restore_model(ckpt)
        state.update(ckpt["state"])
        set_rng_state(ckpt["rng"][self.ctx.rank])
        self.record.restore_counters(state)
        self.record.continue_curve("epoch", state["epoch"])
        if self.ctx.is_rank0:
            self.p.log.info("resumed from %s after epoch %d", self.cfg.resume, state["epoch"])

    def trim(self, phase: str) -> None:
        """Free heap pages back to the kernel before the next phase allocates (proc.trim_heap)."""
        freed = trim_heap()
        if freed >= 2**24:
            self.p.log.info("after the %s: %.0f MB of freed heap handed back to the kernel", phase, freed / 2**20)

    def run(self) -> dict:
        p, ctx, cfg, rec = self.p, self.ctx, self.cfg, self.record
        state = rec.state
        p.setup()
        resume_collector()  # start-up is over (degnn/startup.py)
        self.trim("set-up")
        rec.mark_setup()
        self.resume()
        rec.write_config()
        wall0 = time.time() - state["wall_s"]  # wall time continues after a resume
        ctx.heartbeat.progress_mode()  # from here a trainer that stops beating is hung
        for epoch in range(state["epoch"] + 1, cfg.train.epochs + 1):
            loss, nb, dt = self.timed_epoch(epoch)
            if diverged(loss, nb):
                rec.diverged("epoch", epoch, f"diverged at epoch {epoch}: the training loss is not finite; "
                                             f"lower train.lr or check the data", time.time() - wall0)
                break  # the last checkpoint stays the last good state
            if self.after_epoch(epoch, loss, nb, dt, wall0):
                break
        if state["best_val"] is None and not state.get("error"):  # e.g. resumed a finished run
            val, test = p.evaluate()
            state.update(best_val=val, best_test=test, test_final=test, best_epoch=state["epoch"])
        ranks = [None] * ctx.world_size
        dist.all_gather_object(ranks, {**rec.rank_stats(), "param_digest": param_digest(p.model)})
        return rec.summary(ranks, wall0)

    def after_epoch(self, epoch: int, loss: float, nb: int, dt: float, wall0: float) -> bool:
        """Counters, the time budget, evaluation, the curve line and the checkpoint of a finished
        epoch; True when training stops here."""
        p, ctx, cfg, rec = self.p, self.ctx, self.cfg, self.record
        state = rec.state
        p.batches += nb
        p.timed["batches"] += nb
        p.timed["train_s"] += dt
        state["train_time_s"] += dt
        state["epoch_times"].append(dt)
        state["epoch"] = epoch
        state["wall_s"] = time.time() - wall0
        record = {"epoch": epoch, "train_time_s": round(state["train_time_s"], 3),
                  "wall_s": round(state["wall_s"], 3), "loss": loss}
        stop = False
        ctx.heartbeat.beat()
        # the wall-time budget; ranks measure slightly different times: rank 0 decides for all
        over = cfg.train.time_limit_s > 0 and broadcast_object(state["train_time_s"] >= cfg.train.time_limit_s)
        if epoch == cfg.train.epochs or over:
            p.training_done()
        if epoch % cfg.train.eval_every == 0 or epoch == cfg.train.epochs or over:
            self.trim("epoch")
            t_eval = time.time()
            val, test = p.evaluate()
            record.update(val=val, test=test, eval_s=round(time.time() - t_eval, 3))
            rec.keep_best(val, test, epoch, cfg.train.min_delta)
            stop = cfg.train.patience > 0 and state["bad_evals"] >= cfg.train.patience
            # time to accuracy: rank 0's metric decides for all, as for the time budget
            if cfg.train.target_val is not None and broadcast_object(val >= cfg.train.target_val):
                stop = True
                if ctx.is_rank0:
                    p.log.info("target reached: validation %.4f >= %.4f", val, cfg.train.target_val)
        if over:
            stop = True
            if ctx.is_rank0:
                p.log.info("time limit: %.1fs of training", state["train_time_s"])
        rec.curve(record)
        if ctx.is_rank0:
            msg = f"epoch {epoch}: loss {loss:.4f}, {dt:.1f}s"
            if "val" in record:
                msg += f", val {record['val']:.4f}, test {record['test']:.4f}"
            p.log.info(msg)
        state["batches"] = p.batches
        state["bytes"] = ctx.counter.as_dict()
        state["wire_train_bytes"] = p.wire_train_bytes
        if epoch % cfg.train.checkpoint_every == 0 or stop or epoch == cfg.train.epochs:
            rngs = [None] * ctx.world_size
            dist.all_gather_object(rngs, rng_state())
            rec.checkpoint(p.optimizer.state_dict(), rngs)
        if stop and state["bad_evals"] >= cfg.train.patience > 0:
            p.log.info("early stop: no better validation%s for %d evaluations",
                       f" by more than {cfg.train.min_delta:g}" if cfg.train.min_delta else "", cfg.train.patience)
        return stop
