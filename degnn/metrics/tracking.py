"""TensorBoard event files next to curve.jsonl: every curve line as scalars, at its epoch (or TMA's
round), plus what the writing trainer measured since its previous line: application bytes per
batch by category and seconds per batch by phase (degnn.metrics.PhaseTimer).

On when the `tensorboard` package is installed and `train.tensorboard` is true (the default);
without the package one info line says so and nothing else changes. Open with
`tensorboard --logdir runs/`: each run directory is one run.

Scalar tags:
  * ``train/loss``, ``eval/val_<metric>``, ``eval/test_<metric>``;
  * ``run/<key>`` for every other number of the curve line (train_time_s, wall_s; TMA:
    round_time_s, averaging_bytes, local_epochs);
  * ``bytes_per_batch/<category>`` and ``bytes_per_batch/app`` (their sum, evaluation
    excluded as in the summary's app_bytes_per_batch), ``bytes/eval`` (evaluation bytes since the
    previous line); the writing trainer's own counters, not the sum over trainers;
  * ``time_per_batch_s/<phase>`` and ``time_per_batch_s/other`` (the writing trainer's).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, Iterable, Optional

from degnn.metrics.summary import NOT_PER_BATCH

NOT_SCALARS = ("epoch", "round", "loss", "val", "test")


def summary_writer_class():
    """torch's SummaryWriter, or None where the tensorboard package is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter


def _number(v) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class Tracker:
    """One process's event file in `run_dir`, opened at its first line (only the process that
    writes the run's files ever opens one)."""

    def __init__(self, run_dir: Path, enabled: bool, metric: str, log=None):
        self.run_dir, self.enabled, self.metric, self.log = Path(run_dir), enabled, metric, log
        self.writer = None
        self.purge_step: Optional[int] = None
        self.base_bytes: Dict[str, int] = {}
        self.base_phases: Dict[str, float] = {}
        self.base_batches, self.base_train_s = 0, 0.0

    def _open(self) -> bool:
        if self.writer is None and self.enabled:
            cls = summary_writer_class()
            if cls is None:
                self.enabled = False
                if self.log is not None:
                    self.log.info("tensorboard is not installed: no event files "
                                  "(pip install tensorboard, or train.tensorboard=false to silence this)")
            else:
                self.writer = cls(log_dir=str(self.run_dir), purge_step=self.purge_step)
        return self.writer is not None

    # --- what the run directory already holds ----------------------------------------------------
    def resumed(self, resume_dir: Path, records: Iterable[dict], key: str, upto: int) -> None:
        """A resumed run: into its own directory, TensorBoard drops the old file's steps after
        `upto` (purge_step); into a new one, the resumed run's curve lines are written again."""
        if Path(resume_dir).resolve() == self.run_dir.resolve():
            self.purge_step = upto + 1
        elif self._open():
            for rec in records:
                self._scalars(rec, key)
            self.writer.flush()

    def baseline(self, counters: Dict[str, int], phases: Dict[str, float], batches: int, train_s: float) -> None:
        """The counters the next line's per-batch numbers start from."""
        self.base_bytes, self.base_phases = dict(counters), dict(phases)
        self.base_batches, self.base_train_s = batches, train_s

    # --- one curve line ----------------------------------------------------------------------------
    def _scalars(self, record: dict, key: str) -> Optional[int]:
        step = record.get(key)
        if not isinstance(step, int):
            return None
        add = self.writer.add_scalar
        for name, tag in (("loss", "train/loss"), ("val", f"eval/val_{self.metric}"),
                          ("test", f"eval/test_{self.metric}")):
            v = _number(record.get(name))
            if v is not None:
                add(tag, v, step)
        for name, value in record.items():
            v = _number(value)
            if name not in NOT_SCALARS and v is not None:
                add(f"run/{name}", v, step)
        return step

    def line(self, record: dict, counters: Dict[str, int], phases: Dict[str, float], batches: int,
             train_s: float) -> None:
        """A curve line and the writing trainer's counters now (bytes by category, PhaseTimer
        totals, training steps, training seconds)."""
        if not self._open():
            return
        key = "round" if "round" in record else "epoch"
        step = self._scalars(record, key)
        nb = batches - self.base_batches
        if step is not None and nb > 0:
            add = self.writer.add_scalar
            delta = {k: v - self.base_bytes.get(k, 0) for k, v in counters.items()}
            for cat, v in sorted(delta.items()):
                if cat in NOT_PER_BATCH:
                    add(f"bytes/{cat}", v, step)
                else:
                    add(f"bytes_per_batch/{cat}", v / nb, step)
            add("bytes_per_batch/app", sum(v for k, v in delta.items() if k not in NOT_PER_BATCH) / nb, step)
            per = {k: (v - self.base_phases.get(k, 0.0)) / nb for k, v in phases.items()}
            if sum(per.values()) > 0:
                for phase, v in per.items():
                    add(f"time_per_batch_s/{phase}", v, step)
                if train_s > self.base_train_s:
                    add("time_per_batch_s/other",
                        max((train_s - self.base_train_s) / nb - sum(per.values()), 0.0), step)
        self.writer.flush()
        self.baseline(counters, phases, batches, train_s)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
