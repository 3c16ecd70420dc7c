"""What a trainer process knows about its run: config, identity, run directory, graph, counters."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig

from degnn.metrics import ByteCounter
from degnn.runtime.heartbeat import NULL, Heartbeat


@dataclass
class RunContext:
    cfg: DictConfig
    run_dir: Path
    rank: int
    world_size: int
    local_rank: int
    machines: int
    part_config: Path
    graph: object  # dgl.distributed.DistGraph
    log: logging.Logger
    counter: ByteCounter = field(default_factory=ByteCounter)
    # beat() per batch and per epoch: the launcher's hang detection (degnn/runtime/heartbeat.py)
    heartbeat: Heartbeat = NULL
    # train.device (degnn/runtime/device.py)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # unix time this trainer began its set-up (DGL's initialisation): the summary's setup_s
    started: float = 0.0
    # this machine's wire counter (bytes sent) then, on its first trainer: setup_net_bytes
    started_wire: Optional[int] = None

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0
