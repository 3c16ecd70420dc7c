"""pipeline=tma's config schema (Pipeline.config_schema of TMAPipeline)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from degnn.config import PipelineConfig


@dataclass
class TMAConfig(PipelineConfig):
    """The keys of pipeline=tma (conf/pipeline/tma.yaml): a mistyped key or a wrong type is
    refused before anything starts (degnn.pipelines.typed_config), and other pipelines have none of them.

    Durations are seconds (`_s`), like every duration key of degnn; the launcher checks them (and
    the rest) before it starts anything (TMAPipeline.prepare_launch).
    """

    name: str = "tma"
    # random (RandomTMA) | supernode (SuperTMA) | psgd-pa | llcg; picks the partition method
    # (random, supernode, metis, metis) unless `partition=` is given on the command line
    variant: str = "random"
    # seconds of wall time of local training between two model averagings
    sync_every_s: float = 30.0
    # seconds of training (evaluation excluded, as in the paper's clock)
    time_limit_s: float = 180.0
    # uniform (the paper's unweighted mean) | train_nodes (weighted by each trainer's train nodes;
    # link task: by its training edges)
    weighting: str = "uniform"
    # gradient clipping by global norm (0 = off), from `grad_clip_since` local epochs on
    grad_clip: float = 1.0
    grad_clip_since: float = 2.0
    # llcg: Adam steps on whole-graph mini-batches after each averaging
    corr_steps: int = 2
    # partitions (0-based, = machine index) whose trainer never trains (the paper's failure simulation)
    drop_parts: List[int] = field(default_factory=list)
    # a round closes without a trainer that has not submitted this long after the first one did
    round_timeout_s: float = 5.0
    # a trainer the evaluation waits for (its lead, a worker holding a unit, the trainer of a
    # partition whose units nobody took) is declared dead after this long without a heartbeat
    evaluator_timeout_s: float = 60.0
    # fault injection (benchmarks, tests): trainer `kill_rank` SIGKILLs itself once it has trained
    # for `kill_at_s` seconds (a real death: no clean-up, nothing said to anyone)
    kill_rank: Optional[int] = None
    kill_at_s: float = 0.0
    # train: at the first step past `kill_at_s`; eval: in the first evaluation after that, holding a
    # unit of its second phase
    kill_during: str = "train"
