"""The interface every pipeline implements, and the epoch loop they share.

A pipeline supplies `setup`, `train_epoch` and `evaluate`; `run` does the rest the same way for
all of them: evaluation every N epochs, best-validation model, early stop, checkpoints that a
later run can resume from, curve.jsonl and summary.json. A pipeline whose training is not
epoch-shaped (TMA's time-based rounds) overrides `run`.
"""
from __future__ import annotations

import math
import os
import random
import resource
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tqdm import tqdm

from degnn.metrics import (PhaseTimer, WireCounter, append_curve, breakdown_per_batch, read_curve,
                           write_curve, write_summary)
from degnn.runtime.checkpoint import (BEST_MODEL, CHECKPOINT, CheckpointError, check_resume,
                                      config_identity)


def rng_state() -> dict:
    # tensors and plain numbers only: checkpoints are read with torch.load(weights_only=True)
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, words, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "gauss": float(gauss)},
            "python": {"version": version, "state": torch.tensor(words, dtype=torch.int64),
                       "gauss": gauss_next}}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["gauss"]))
    py = state["python"]
    random.setstate((py["version"], tuple(int(w) for w in py["state"].tolist()), py["gauss"]))


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


TASKS = {"node": "node classification", "link": "link prediction"}


class Pipeline:
    name = "base"
    # the dataset tasks (dataset.task) it trains; the launcher refuses others before anything starts
    tasks: Tuple[str, ...] = ("node",)
    # The launcher's fault policy is the pipeline's to declare. False: trainers meet in gloo
    # collectives (all-reduce, barrier, all_gather), which hang or abort on a dead peer, so one dead
    # process stops the cluster. True (TMA): trainers never use torch.distributed (entry.py does not
    # even create the process group) and coordinate through an RPC service with deadlines; the
    # launcher lets the others finish when a trainer dies, still stops on a dead server, and stops
    # the servers when the trainers are done (DGL's servers would wait for the dead client forever).
    tolerates_trainer_faults = False
    # (tolerates_trainer_faults only) whether every trainer was alive at the end, so that DGL's
    # exit barrier can complete (entry.py)
    all_trainers_alive = False

    @classmethod
    def check_task(cls, cfg) -> None:
        """ValueError (one line) when this pipeline does not train the dataset's task."""
        task = cfg.dataset.task
        if task not in cls.tasks:
            what = " and ".join(TASKS.get(t, t) for t in cls.tasks)
            others = "pipeline=distdgl or pipeline=tma" if task == "link" else "another pipeline"
            raise ValueError(f"pipeline={cls.name} trains {what} only; dataset {cfg.dataset.name} is a "
                             f"{TASKS.get(task, task)} task (dataset.task={task}): use {others}")

    @classmethod
    def prepare_launch(cls, cfg, task_overrides) -> List[str]:
        """The launcher's preflight for this pipeline, before anything starts.

        Raise ValueError (one line) for a config that cannot run; may adjust `cfg` and return
        overrides that every process of the run must also get (e.g. the partition a variant implies).
        """
        return []

    def __init__(self, ctx):
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.log = ctx.log
        self.model: Optional[torch.nn.Module] = None  # the unwrapped model (checkpointed)
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.batches = 0  # training steps taken by this trainer
        self.wire = WireCounter.from_env() if ctx.local_rank == 0 else WireCounter(None)
        self.wire_train_bytes = 0
        # the per-batch time breakdown (summary: time_per_batch_s), over this run's epochs only
        self.timer = PhaseTimer()
        self.timed = {"batches": 0, "train_s": 0.0}

    # --- what each pipeline provides -------------------------------------------------------
    def setup(self) -> None:
        raise NotImplementedError

    def train_epoch(self, epoch: int, progress: Optional[tqdm]) -> Tuple[float, int]:
        """Train one epoch; return (mean loss, number of batches)."""
        raise NotImplementedError

    def evaluate(self) -> Tuple[float, float]:
        """(validation metric, test metric), identical on every rank."""
        raise NotImplementedError

    def extra_summary(self) -> Dict[str, object]:
        return {}

    # --- shared ------------------------------------------------------------------------------
    def batches_per_epoch(self) -> Optional[int]:
        return None

    def _profiled(self, fn, *args):
        """fn(*args), under cProfile on rank 0 when train.profile is set (cumulative over epochs):
        <run dir>/profile_rank0.txt (top functions) and .prof (`python -m pstats`)."""
        if not (self.cfg.train.profile and self.ctx.is_rank0):
            return fn(*args)
        import cProfile
        import io
        import pstats

        if not hasattr(self, "_profile"):
            self._profile = cProfile.Profile()
        self._profile.enable()
        try:
            return fn(*args)
        finally:
            self._profile.disable()
            out = io.StringIO()
            pstats.Stats(self._profile, stream=out).sort_stats("cumulative").print_stats(40)
            (self.ctx.run_dir / "profile_rank0.txt").write_text(out.getvalue())
            self._profile.dump_stats(str(self.ctx.run_dir / "profile_rank0.prof"))  # for pstats

    def _checkpoint(self, path: Path, state: dict) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def _load_resume(self) -> Optional[dict]:
        if not self.cfg.resume:
            return None
        # the launcher ran the same checks before starting anything (DGL's launch.py does not)
        return check_resume(self.cfg, self.ctx.world_size)

    # --- the steps of a training loop (the epoch loop below and TMA's rounds use them) -------
    @property
    def is_writer(self) -> bool:
        """The process that writes the run's shared files (curve, best model, checkpoint, summary)."""
        return self.ctx.is_rank0

    def new_state(self) -> dict:
        return {"epoch": 0, "best_val": None, "best_test": None, "best_epoch": None, "test_final": None,
                "train_time_s": 0.0, "epoch_times": [], "batches": 0, "bad_evals": 0, "bytes": {},
                "wire_train_bytes": 0, "wall_s": 0.0}

    def continue_curve(self, key: str, upto: int) -> None:
        """Resume step of a loop that is not the epoch loop: the curve continues with the records
        (`key` <= `upto`) of the run we resume."""
        if self.is_writer:
            for rec in read_curve(Path(self.cfg.resume)):
                if rec.get(key, 0) <= upto:
                    append_curve(self.ctx.run_dir, rec)

    def keep_best(self, state: dict, val: float, test: float, at: int) -> bool:
        """Evaluation step: test_final, best validation (and its test and model); True if better."""
        state["test_final"] = test
        if state["best_val"] is None or val > state["best_val"]:
            state.update(best_val=val, best_test=test, best_epoch=at, bad_evals=0)
            if self.is_writer:
                self._checkpoint(self.ctx.run_dir / BEST_MODEL, {"model": self.model.state_dict(), "epoch": at})
            return True
        state["bad_evals"] += 1
        return False

    def run(self) -> dict:
        ctx, cfg = self.ctx, self.cfg
        run_dir = ctx.run_dir
        self.setup()
        state = self.new_state()
        ckpt = self._load_resume()
        if ckpt is not None:
            try:
                self.model.load_state_dict(ckpt["model"])
                self.optimizer.load_state_dict(ckpt["optimizer"])
            except (RuntimeError, ValueError, KeyError) as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise CheckpointError(f"resume={cfg.resume}: {CHECKPOINT} does not fit this model "
                                      f"({first[:150]}); resume with the config of the run that "
                                      f"wrote it") from None
            state.update(ckpt["state"])
            set_rng_state(ckpt["rng"][ctx.rank])
            self.batches = state["batches"]
            self.wire_train_bytes = state["wire_train_bytes"]
            for k, v in state["bytes"].items():
                ctx.counter.add(k, v)
            if ctx.is_rank0:
                # the curve continues: the finished epochs of the run we resume, each once (also
                # when resuming into its own directory, whose curve may hold later epochs)
                kept = {rec["epoch"]: rec for rec in read_curve(Path(cfg.resume))
                        if rec["epoch"] <= state["epoch"]}
                write_curve(run_dir, [kept[e] for e in sorted(kept)])
                self.log.info("resumed from %s after epoch %d", cfg.resume, state["epoch"])
        if ctx.is_rank0:
            (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))

        wall0 = time.time() - state["wall_s"]  # wall time continues after a resume
        ctx.heartbeat.progress_mode()  # from here a trainer that stops beating is hung
        start_epoch = state["epoch"]
        for epoch in range(start_epoch + 1, cfg.train.epochs + 1):
            progress = None
            if ctx.is_rank0:
                progress = tqdm(total=self.batches_per_epoch(), desc=f"epoch {epoch}/{cfg.train.epochs}",
                                unit="batch", leave=False, mininterval=1.0)
            dist.barrier()
            wire0, t0 = self.wire.read(), time.time()
            loss, nb = self._profiled(self.train_epoch, epoch, progress)
            dt = time.time() - t0
            wire1 = self.wire.read()
            if wire0 is not None:
                self.wire_train_bytes += wire1 - wire0
            if progress is not None:
                progress.close()
            if diverged(loss, nb):
                state["error"] = (f"diverged at epoch {epoch}: the training loss is not finite; "
                                  f"lower train.lr or check the data")
                self.log.error(state["error"])
                if ctx.is_rank0:
                    append_curve(run_dir, {"epoch": epoch, "loss": None, "diverged": True,
                                           "wall_s": round(time.time() - wall0, 3)})
                break  # the last checkpoint stays the last good state
            self.batches += nb
            self.timed["batches"] += nb
            self.timed["train_s"] += dt
            state["train_time_s"] += dt
            state["epoch_times"].append(dt)
            state["epoch"] = epoch
            state["wall_s"] = time.time() - wall0
            record = {"epoch": epoch, "train_time_s": round(state["train_time_s"], 3),
                      "wall_s": round(state["wall_s"], 3), "loss": loss}
            stop = False
            ctx.heartbeat.beat()
            # the wall-time budget; ranks measure slightly different times: rank 0 decides for all
            over = cfg.train.time_limit_s > 0 and broadcast_object(
                state["train_time_s"] >= cfg.train.time_limit_s)
            if epoch % cfg.train.eval_every == 0 or epoch == cfg.train.epochs or over:
                val, test = self.evaluate()
                record.update(val=val, test=test)
                if not self.keep_best(state, val, test, epoch):
                    stop = cfg.train.patience > 0 and state["bad_evals"] >= cfg.train.patience
            if over:
                stop = True
                if ctx.is_rank0:
                    self.log.info("time limit: %.1fs of training", state["train_time_s"])
            if ctx.is_rank0:
                append_curve(run_dir, record)
                msg = f"epoch {epoch}: loss {loss:.4f}, {dt:.1f}s"
                if "val" in record:
                    msg += f", val {record['val']:.4f}, test {record['test']:.4f}"
                self.log.info(msg)
            state["batches"] = self.batches
            state["bytes"] = ctx.counter.as_dict()
            state["wire_train_bytes"] = self.wire_train_bytes
            if epoch % cfg.train.checkpoint_every == 0 or stop or epoch == cfg.train.epochs:
                rngs = [None] * ctx.world_size
                dist.all_gather_object(rngs, rng_state())
                if ctx.is_rank0:
                    self._checkpoint(run_dir / CHECKPOINT, {
                        "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "state": dict(state), "rng": rngs, "config": config_identity(cfg)})
            if stop:
                if state["bad_evals"] >= cfg.train.patience > 0:
                    self.log.info("early stop: no better validation for %d evaluations", cfg.train.patience)
                break
        if state["best_val"] is None and not state.get("error"):  # e.g. resumed a finished run
            val, test = self.evaluate()
            state.update(best_val=val, best_test=test, test_final=test, best_epoch=state["epoch"])
        return self._summary(state)

    def rank_stats(self) -> dict:
        """This trainer's part of the summary (added up over trainers by `_summary`)."""
        return {"bytes": self.ctx.counter.as_dict(), "batches": self.batches, "wire": self.wire_train_bytes,
                "has_wire": self.wire.path is not None,
                "timing": {"phases": dict(self.timer.total), **self.timed},
                "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}

    def gather_rank_stats(self) -> list:
        ranks = [None] * self.ctx.world_size
        dist.all_gather_object(ranks, self.rank_stats())
        return ranks

    def _summary(self, state: dict) -> dict:
        ctx, cfg = self.ctx, self.cfg
        # one gather: bytes by category, batches and wire bytes add up over trainers; memory is the max
        ranks = self.gather_rank_stats()
        cats: Dict[str, int] = {}
        for r in ranks:
            for k, v in r["bytes"].items():
                cats[k] = cats.get(k, 0) + v
        batches = sum(r["batches"] for r in ranks)
        wire = sum(r["wire"] for r in ranks)
        on_netns = any(r["has_wire"] for r in ranks)
        app = sum(v for k, v in cats.items() if k != "eval")  # evaluation is not per-batch traffic
        allreduce = cats.get("allreduce", 0)
        times = state["epoch_times"]
        summary = {
            "pipeline": cfg.pipeline.name, "variant": cfg.pipeline.variant,
            "dataset": cfg.dataset.name, "task": cfg.dataset.task,
            "metric": getattr(self, "metric", "acc"),
            "model": cfg.model.name, "layers": cfg.model.layers, "hidden": cfg.model.hidden,
            "machines": ctx.machines, "trainers": ctx.world_size,
            "best_val": state["best_val"], "test": state["best_test"], "test_final": state["test_final"],
            "best_epoch": state["best_epoch"],
            "train_time_s": round(state["train_time_s"], 3), "epochs": state["epoch"],
            "epoch_time_s": round(sum(times) / len(times), 3) if times else None,
            "epoch_times_s": [round(t, 3) for t in times],
            "batches": int(batches),
            "app_bytes_per_batch": app / batches if batches else None,
            "allreduce_bytes_per_batch": allreduce / batches if batches else None,
            "app_bytes_by_category": cats,
            "eval_bytes_total": int(cats.get("eval", 0)),
            "net_bytes_train": int(wire) if on_netns else None,
            "net_bytes_per_batch": wire / batches if (on_netns and batches) else None,
            "net_bytes_total": None,  # filled in by the launcher from the veth counters
            # seconds per batch by phase, mean over trainers (degnn.metrics.PhaseTimer)
            "time_per_batch_s": breakdown_per_batch([r["timing"] for r in ranks if "timing" in r]),
            "peak_rss_mb_trainer": round(max(r["rss_mb"] for r in ranks), 1),
            "wall_s": round(state["wall_s"], 3),
            # a run whose processes fail never gets here (the launcher writes its summary); one
            # that stops on its own (diverged) says why
            "status": "failed" if state.get("error") else "ok",
        }
        if state.get("error"):
            summary["error"] = state["error"]
        summary.update(self.extra_summary())
        if self.is_writer:
            write_summary(ctx.run_dir, summary)
        return summary
