"""The round driver's contract: what a round-based pipeline gives rounds.py (RoundLoop), and
the driver's exceptions.

The driver owns the rounds (the coordinator's messages, the time budget, the evaluation's
hand-out, the run record, the per-trainer checkpoints); a pipeline owns its model and data and
is asked only for what `RoundPipeline` declares. TMAPipeline (tma/__init__.py) implements it; a
second round-based pipeline would implement the same members and name `RoundLoop` as its
`driver`. Besides these members the pipeline is a degnn Pipeline (degnn/pipelines/base.py): the
driver's RunRecord reads the base's model, optimizer, counters, `rank_stats` and
`summary_extra`, as it does for the epoch loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Tuple, runtime_checkable

import torch


class Replaced(Exception):
    """The coordinator gave this round's evaluation (or the unit under way) to another trainer:
    this one was too slow. Raised by the driver's `beat` inside `RoundPipeline.correct`; the
    pipeline lets it pass."""


@dataclass(frozen=True)
class RoundPlan:
    """The run's rounds as one pipeline sees them, known once it is set up."""

    sync_s: float  # wall-clock seconds of local training a round
    limit_s: float  # the whole run's training budget
    active: List[int]  # the ranks that train (the others only wait for the end)
    trains: bool  # this trainer trains (False: its partition is dropped)
    homes: List[int]  # the evaluation's units: homes[u] is the rank whose partition u covers
    phases: int  # the evaluation's phases (its layers, then the scoring)
    corrects: bool  # the lead corrects the mean before the evaluation (LLCG)
    eval_every: int  # evaluate every eval_every-th round and the last
    round_timeout_s: float
    evaluator_timeout_s: float
    weight: float  # this trainer's weight in the mean
    round_bytes: int  # averaging bytes of one trainer a round (counted in advance)

    @property
    def rounds(self) -> int:
        return max(1, math.ceil(self.limit_s / self.sync_s - 1e-9))

    def budget(self, r: int) -> float:
        """Round r's training seconds (the last round gets what is left of the limit)."""
        return min(self.sync_s, self.limit_s - (r - 1) * self.sync_s)


@runtime_checkable
class RoundPipeline(Protocol):
    """The members the round driver uses (besides `ctx` and `cfg`, the run's context and config)."""

    ctx: object
    cfg: object
    plan: RoundPlan  # set by `setup`

    def setup(self) -> None:
        """Data, loaders, model and optimizer (the same initial weights everywhere)."""

    def train_for(self, seconds: float) -> Tuple[int, float]:
        """Local training steps until `seconds` of wall time have passed (finishing the step
        under way): (steps, mean loss; NaN without a step). Counts its own training time."""

    def export_weights(self) -> torch.Tensor:
        """The model's parameters as one flat float32 tensor (a copy)."""

    def load_weights(self, flat: torch.Tensor) -> None:
        """Replace the model's parameters with `flat` (export_weights' layout)."""

    def correct(self, beat: Callable[[], None]) -> Optional[torch.Tensor]:
        """The lead's correction of the loaded mean (LLCG) and the corrected weights, loaded;
        None when the pipeline does not correct. Calls `beat()` now and then (it may raise
        Replaced)."""

    def eval_unit(self, r: int, phase: int, unit: int, still_mine: Callable[[], bool]) -> Optional[dict]:
        """One unit of round r's evaluation of the loaded model: a layer's rows ({}) or the
        scoring's metric sums ({key: [sum, count]}); None once `still_mine()` says the unit went
        to another trainer."""

    def own_state(self) -> dict:
        """This trainer's own checkpoint: model, optimizer, steps, train_s, wire_train_bytes."""

    def load_own_state(self, state: dict) -> None:
        """Restore `own_state`'s model, optimizer and training time (the RunRecord restores the
        counters)."""
