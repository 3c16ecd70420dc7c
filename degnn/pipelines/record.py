"""What every training driver records, the same way for every pipeline: the loop's counters,
the best validation point and its model, checkpoints a later run resumes from, curve.jsonl and
the typed run summary (degnn.metrics.summary).

The epoch loop (loop.py) and TMA's rounds (tma/rounds.py) both drive a `RunRecord`, and every
way a run of theirs ends goes through it: the summary (`summary`: status ok, or failed with the
state's `error`) and a run that stops itself (`diverged`: the error and its curve line). Only the
process that `writes` touches the run directory's shared files; a run whose processes fail is
summarised by the launcher (degnn/launch/launcher.py, `write_failure`) from the curve written here.
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from omegaconf import OmegaConf

from degnn.metrics import append_curve, breakdown_per_batch, read_curve, write_curve, write_summary
from degnn.metrics.summary import NOT_PER_BATCH, RunSummary, to_dict
from degnn.metrics.tracking import Tracker
from degnn.runtime.heartbeat import peak_rss_kb
from degnn.runtime.checkpoint import (BEST_MODEL, CHECKPOINT, CheckpointError, check_resume, config_identity,
                                     save_atomic)


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


def param_digest(model: torch.nn.Module) -> str:
    """A fingerprint of a model's parameters, bit for bit."""
    import hashlib

    h = hashlib.sha1()
    for t in model.parameters():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def new_state() -> dict:
    """The driver's counters (checkpointed as they are: plain numbers, lists and dicts).
    `epoch` counts epochs, or averaging rounds for a round driver."""
    return {"epoch": 0, "best_val": None, "best_test": None, "best_epoch": None, "test_final": None,
            "train_time_s": 0.0, "epoch_times": [], "batches": 0, "bad_evals": 0, "bytes": {},
            "wire_train_bytes": 0, "wall_s": 0.0}


def setup_keys(setups: List[dict]) -> dict:
    """The summary's set-up keys from every trainer's `RunRecord.setup`: the slowest trainer's
    seconds, the bytes of all, the largest peak."""
    setups = [s for s in setups if s]
    if not setups:
        return {"setup_s": None, "setup_bytes": None, "setup_net_bytes": None,
                "setup_peak_rss_mb": None}
    net = [s["net"] for s in setups if s.get("net") is not None]
    return {"setup_s": round(max(s["s"] for s in setups), 3),
            "setup_bytes": int(sum(s["bytes"] for s in setups)),
            "setup_net_bytes": int(sum(net)) if net else None,
            "setup_peak_rss_mb": round(max(s["rss_mb"] for s in setups), 1)}


class RunRecord:
    def __init__(self, pipeline):
        self.p = pipeline
        self.ctx, self.cfg = pipeline.ctx, pipeline.cfg
        self.run_dir = self.ctx.run_dir
        self.state = new_state()
        self.writer: Optional[bool] = None  # a driver may say who writes (else the pipeline's is_writer)
        self.wrote_summary = False
        self.setup: dict = {}  # this trainer's set-up: seconds, bytes, peak memory (mark_setup)
        self.tracker = Tracker(self.run_dir, bool(self.cfg.train.tensorboard),
                               pipeline.task.metric, pipeline.log)

    @property
    def writes(self) -> bool:
        return self.p.is_writer if self.writer is None else self.writer

    # --- resume --------------------------------------------------------------------------------
    def load_resume(self) -> Optional[dict]:
        """The checkpoint of `resume=` (None without it); the launcher ran the same checks."""
        return check_resume(self.cfg, self.ctx.world_size) if self.cfg.resume else None

    def restore_model(self, ckpt: dict, optimizer: bool = True) -> None:
        p = self.p
        try:
            p.model.load_state_dict(ckpt["model"])
            if optimizer:
                p.optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(f"resume={self.cfg.resume}: {CHECKPOINT} does not fit this model "
                                  f"({first[:150]}); resume with the config of the run that "
                                  f"wrote it") from None

    def restore_counters(self, counters: dict) -> None:
        """This trainer's own counters from a checkpoint: steps, wire bytes, bytes by category."""
        self.p.batches = counters["batches"]
        self.p.wire_train_bytes = counters["wire_train_bytes"]
        for k, v in counters["bytes"].items():
            self.ctx.counter.add(k, v)
        self.track_from_here()

    def continue_curve(self, key: str, upto: int) -> None:
        """The curve continues with the records (`key` <= `upto`) of the run we resume, each once
        (also when resuming into its own directory, whose curve may hold later records)."""
        if self.writes:
            kept = {rec[key]: rec for rec in read_curve(Path(self.cfg.resume)) if rec.get(key, 0) <= upto}
            write_curve(self.run_dir, [kept[k] for k in sorted(kept)])
            self.tracker.resumed(Path(self.cfg.resume), [kept[k] for k in sorted(kept)], key, upto)

    def mark_setup(self) -> None:
        """The end of this trainer's set-up, before its first training batch (and before a resume
        restores counters): seconds since its DGL initialisation began (partition and DistGraph,
        the pipeline's own set-up, the evaluator's), the bytes counted meanwhile (every category,
        plus what the pipeline counts apart: `Pipeline.setup_bytes`), the bytes its machine sent
        meanwhile (netns, on the machine's first trainer), its peak RSS so far."""
        p, ctx = self.p, self.ctx
        wire = p.wire.read()
        self.setup = {"s": time.time() - (ctx.started or time.time()),
                      "net": wire - ctx.started_wire if None not in (wire, ctx.started_wire) else None,
                      "bytes": sum(ctx.counter.as_dict().values()) + int(p.setup_bytes),
                      "rss_mb": peak_rss_kb() / 1024.0}

    def write_config(self) -> None:
        if self.writes:
            # renamed into place: a process of a later resume=DIR reads it whole
            tmp = self.run_dir / ".config.yaml.tmp"
            tmp.write_text(OmegaConf.to_yaml(self.cfg))
            os.replace(tmp, self.run_dir / "config.yaml")

    # --- progress --------------------------------------------------------------------------------
    def curve(self, record: dict) -> None:
        """One curve.jsonl line, also as TensorBoard scalars (degnn.metrics.tracking)."""
        if self.writes:
            append_curve(self.run_dir, record)
            p = self.p
            self.tracker.line(record, self.ctx.counter.as_dict(), dict(p.timer.total), p.batches,
                              p.timed["train_s"])

    def diverged(self, key: str, at: int, error: str, wall_s: float) -> None:
        """A run that stops itself on a non-finite loss at epoch (round) `at`: the error goes into
        the state (the summary's status is then failed, with it) and the log, and the curve gets
        a `diverged` line; the last checkpoint stays the last good state."""
        self.state["error"] = error
        self.p.log.error(error)
        self.curve({key: at, "loss": None, "diverged": True, "wall_s": round(wall_s, 3)})

    def track_from_here(self) -> None:
        """The per-batch numbers of the next TensorBoard line count from this trainer's counters now."""
        p = self.p
        self.tracker.baseline(self.ctx.counter.as_dict(), dict(p.timer.total), p.batches, p.timed["train_s"])

    def keep_best(self, val: float, test: float, at: int, min_delta: float = 0.0) -> None:
        """An evaluation: test_final, the best validation point (its test and model) and the
        patience count: evaluations since the last one that beat the one before it by more than
        `min_delta` (train.min_delta; with 0, since the best)."""
        state = self.state
        state["test_final"] = test
        ref = state.get("patience_ref", state["best_val"])
        if ref is None or val > ref + min_delta:
            state.update(patience_ref=val, bad_evals=0)
        else:
            state["bad_evals"] += 1
        if state["best_val"] is None or val > state["best_val"]:
            state.update(best_val=val, best_test=test, best_epoch=at)
            if self.writes:
                save_atomic(self.run_dir / BEST_MODEL, {"model": self.p.model.state_dict(), "epoch": at})

    def checkpoint(self, optimizer: dict, rng) -> None:
        if self.writes:
            save_atomic(self.run_dir / CHECKPOINT, {
                "model": self.p.model.state_dict(), "optimizer": optimizer, "state": dict(self.state),
                "rng": rng, "config": config_identity(self.cfg)})

    # --- the summary -----------------------------------------------------------------------------
    def rank_stats(self) -> dict:
        """This trainer's part of the summary (added up over trainers by `summary`)."""
        p = self.p
        return {"bytes": self.ctx.counter.as_dict(), "batches": p.batches, "wire": p.wire_train_bytes,
                "has_wire": p.wire.path is not None,
                "timing": {"phases": dict(p.timer.total), **p.timed},
                "rss_mb": peak_rss_kb() / 1024.0, "setup": self.setup, "copies": p.mover.counts(),
                **p.rank_stats()}

    def summary(self, ranks: List[dict], wall0: float, context: Optional[dict] = None) -> dict:
        """The run summary from every trainer's `rank_stats` (written by the writer); `context`:
        what the driver knows that the pipeline's summary_extra needs."""
        ctx, cfg, state = self.ctx, self.cfg, self.state
        cats: Dict[str, int] = {}
        for r in ranks:
            for k, v in r["bytes"].items():
                cats[k] = cats.get(k, 0) + v
        batches = sum(r["batches"] for r in ranks)
        wire = sum(r["wire"] for r in ranks)
        on_netns = any(r["has_wire"] for r in ranks)
        app = sum(v for k, v in cats.items() if k not in NOT_PER_BATCH)
        times = state["epoch_times"]
        digests = [r.get("param_digest") for r in ranks]
        per_batch: Callable[[float], Optional[float]] = lambda x: x / batches if batches else None  # noqa: E731
        s = RunSummary(
            pipeline=cfg.pipeline.name, variant=cfg.pipeline.variant, dataset=cfg.dataset.name,
            task=cfg.dataset.task, metric=self.p.task.metric, model=cfg.model.name, layers=cfg.model.layers,
            hidden=cfg.model.hidden, fanouts=list(cfg.model.fanouts), machines=ctx.machines,
            trainers=ctx.world_size, device=str(ctx.device),
            eval_fanouts=list(cfg.train.eval_fanouts) if cfg.train.get("eval_fanouts") else None,
            eval_max_nodes=int(cfg.train.get("eval_max_nodes", 0)),
            best_val=state["best_val"], test=state["best_test"], test_final=state["test_final"],
            best_epoch=state["best_epoch"], train_time_s=round(state["train_time_s"], 3),
            wall_s=round(state["wall_s"] if state["wall_s"] else time.time() - wall0, 3),
            epochs=state["epoch"], epoch_time_s=round(sum(times) / len(times), 3) if times else None,
            epoch_times_s=[round(t, 3) for t in times], batches=int(batches),
            app_bytes_per_batch=per_batch(app), allreduce_bytes_per_batch=per_batch(cats.get("allreduce", 0)),
            app_bytes_by_category=cats, eval_bytes_total=int(cats.get("eval", 0)),
            net_bytes_train=int(wire) if on_netns else None,
            net_bytes_per_batch=per_batch(wire) if on_netns else None,
            time_per_batch_s=breakdown_per_batch([r["timing"] for r in ranks if "timing" in r]),
            device_copies_per_batch={k: per_batch(sum(r["copies"][k] for r in ranks)) for k in ("tensors", "bytes")}
            if batches else None,
            peak_rss_mb_trainer=round(max(r["rss_mb"] for r in ranks), 1),
            **setup_keys([r.get("setup") or {} for r in ranks]),
            params_agree=len(set(digests)) == 1 if None not in digests else None,
            # a run whose processes fail never gets here (the launcher writes its summary); one
            # that stops on its own (diverged) says why
            status="failed" if state.get("error") else "ok", error=state.get("error"),
            **self.p.task.summary())
        out = to_dict(s, self.p.summary_extra(ranks, {"state": state, **(context or {})}))
        if self.writes:
            write_summary(self.run_dir, out)
            self.wrote_summary = True
        self.tracker.close()
        return out
