"""The contract of a pipeline: what it declares, and the few parts it supplies to the loop.

A pipeline is its folder under degnn/pipelines/ (or anywhere importable) plus a config file
`conf/pipeline/<name>.yaml` whose `_target_` names its class. The training loop (loop.py) owns
everything the pipelines share: seeding, the model and optimizer, the per-batch tail (phase
timing, heartbeat, progress bar), divergence, evaluation scheduling, the best model,
checkpoints and resume, the time budget, the curve and the summary (record.py). A pipeline
supplies:

    setup()            its data, loaders and wrappers (the loop built model and optimizer)
    batches_of(epoch)  the epoch's training batches (the loop times each next() as sampling)
    step(batch)        one training step; returns the loss as a float
    evaluate()         (validation, test) metric, identical on every rank
    summary_extra()    its own summary keys, as a dataclass instance (or None)

and declares what the launcher reads: `tasks`, `tolerates_trainer_faults`,
`max_trainers_per_machine`, `shortens_epochs`, `byte_categories`, `prepare_launch`. A pipeline
whose training is not epoch-shaped names another driver in `driver` (TMA's rounds) that uses
the same parts and the same RunRecord.
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import torch

from degnn.config import PipelineConfig
from degnn.metrics import PhaseTimer, WireCounter
from degnn.runtime.device import DeviceMover


class Pipeline:
    name = "base"
    # the dataset tasks (dataset.task) it trains; the launcher refuses others before anything starts
    tasks: Tuple[str, ...] = ("node",)
    # the dataclass of its `pipeline.*` keys (a subclass of PipelineConfig in its own folder): an
    # unknown key or a wrong type is refused before anything starts (degnn.pipelines.typed_config)
    config_schema = PipelineConfig
    # The launcher's fault policy is the pipeline's to declare. False: trainers meet in gloo
    # collectives (all-reduce, barrier, all_gather), which hang or abort on a dead peer, so one dead
    # process stops the cluster. True (TMA): trainers never use torch.distributed (the entry does
    # not even create the process group) and coordinate through an RPC service with deadlines; the
    # launcher lets the others finish when a trainer dies, still stops on a dead server, and stops
    # the servers when the trainers are done (DGL's servers would wait for the dead client forever).
    tolerates_trainer_faults = False
    # the most trainers one machine may run (None: any number); checked before anything starts
    max_trainers_per_machine: Optional[int] = None
    # whether train.batches_per_epoch (epochs of N batches) is supported
    shortens_epochs = False
    # byte categories it counts besides degnn.metrics.summary.BYTE_CATEGORIES: name -> what
    byte_categories: Dict[str, str] = {}
    # bytes its set-up moves that it counts apart from ctx.counter (LAMP's halo replica and
    # history fill): added to the summary's setup_bytes
    setup_bytes = 0

    @classmethod
    def prepare_launch(cls, cfg, task_overrides) -> List[str]:
        """The launcher's preflight for this pipeline, before anything starts.

        Raise ValueError (one line) for a config that cannot run; may adjust `cfg` and return
        overrides that every process of the run must also get (e.g. the partition a variant implies).
        """
        return []

    @classmethod
    def driver(cls):
        """The driver that trains it: the epoch loop, unless a pipeline names another."""
        from degnn.pipelines.loop import EpochLoop

        return EpochLoop

    def __init__(self, ctx, task):
        self.ctx, self.cfg, self.log, self.task = ctx, ctx.cfg, ctx.log, task
        self.device = ctx.device
        # what a step computes with goes to the device through this, once per batch
        self.mover = DeviceMover.of(self.cfg.model.backend, self.device)
        self.model: Optional[torch.nn.Module] = None  # the unwrapped model (checkpointed)
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.batches = 0  # training steps taken by this trainer
        self.wire = WireCounter.from_env() if ctx.local_rank == 0 else WireCounter(None)
        self.wire_train_bytes = 0
        # the per-batch time breakdown (summary: time_per_batch_s), over this run's epochs only
        self.timer = PhaseTimer()
        self.timed = {"batches": 0, "train_s": 0.0}
        ctx.counter.declare(self.byte_categories)

    # --- what each pipeline supplies ---------------------------------------------------------
    def setup(self) -> None:
        raise NotImplementedError

    def batches_of(self, epoch: int) -> Iterator:
        raise NotImplementedError

    def step(self, batch) -> float:
        raise NotImplementedError

    def evaluate(self) -> Tuple[float, float]:
        raise NotImplementedError

    def batches_per_epoch(self) -> Optional[int]:
        return None

    def epoch_end(self) -> None:
        """After an epoch's last step (e.g. collect what runs in the background)."""

    def training_done(self) -> None:
        """No batch follows (the last epoch, or the time budget spent): before the final
        evaluation, free what only training reads."""

    def rank_stats(self) -> dict:
        """This trainer's own numbers for `summary_extra` (gathered from every trainer)."""
        return {}

    def summary_extra(self, ranks: List[dict], context: dict):
        """Its own summary keys (a dataclass instance) from every trainer's stats (`ranks`) and
        the driver's `context` (its `state`, ...), or None."""
        return None

    # --- shared parts a pipeline calls ---------------------------------------------------------
    @property
    def is_writer(self) -> bool:
        """The process that writes the run's shared files (curve, best model, checkpoint, summary)."""
        return self.ctx.is_rank0

    def build_model(self, in_dim: int) -> None:
        """The task's model and Adam, with the same initial weights on every trainer (seeded
        with train.seed), on the run's device; afterwards each trainer's own RNG stream."""
        cfg = self.cfg
        torch.manual_seed(cfg.train.seed)
        self.model = self.task.build_model(in_dim).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        torch.manual_seed(self.rank_seed())

    def rank_seed(self) -> int:
        return self.cfg.train.seed + self.ctx.rank

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def optimize(self, loss: torch.Tensor, clip: float = 0.0, before_backward=None) -> float:
        """Backward and an optimizer step of `loss`, timed as compute with the all-reduce (timed
        apart by the DDP hook, when there is one) taken out; returns the loss value.
        `before_backward()` runs after the gradients are zeroed (gradients to add in)."""
        timer = self.timer
        with timer("compute"):
            allreduce0 = timer.total["allreduce"]
            self.optimizer.zero_grad()
            if before_backward is not None:
                before_backward()
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.optimizer.step()
        timer.add("compute", allreduce0 - timer.total["allreduce"])
        return loss.item()
