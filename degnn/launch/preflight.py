"""Checks that run before anything is partitioned or started: each failure is one line that names
the config key the user set (or the file) and the fix.

`check_config(cfg)`: the numbers (train.*, cluster counts, bandwidth, timeouts).
`check_resume_dir(cfg, trainers)`: `resume=` (directory, checkpoint, matching config).
"""
from __future__ import annotations

import math

from .plan import LaunchError


def _int_at_least(cfg, key: str, low: int, why: str = "") -> None:
    value = _value(cfg, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise LaunchError(f"{key}={value}: must be an integer >= {low}{why}")


def _positive(cfg, key: str, allow_zero: bool = False) -> None:
    value = _value(cfg, key)
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (
        value >= 0 if allow_zero else value > 0)
    if not ok:
        raise LaunchError(f"{key}={value}: must be a finite number {'>= 0' if allow_zero else '> 0'}")


def _value(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def check_config(cfg) -> None:
    """The numbers of a launch, before partitioning (one LaunchError naming the key)."""
    _int_at_least(cfg, "train.epochs", 1, " (the number of epochs to train)")
    _int_at_least(cfg, "train.batch_size", 1)
    _int_at_least(cfg, "train.eval_batch_size", 1)
    _int_at_least(cfg, "train.eval_every", 1)
    _int_at_least(cfg, "train.batches_per_epoch", 0, " (0 = one pass over the training data)")
    _int_at_least(cfg, "train.checkpoint_every", 1)
    from degnn.runtime.device import DeviceError, device_of

    try:
        device_of(cfg.train.device)
    except DeviceError as e:
        raise LaunchError(str(e)) from None
    _int_at_least(cfg, "train.patience", 0, " (0 = no early stop)")
    _positive(cfg, "train.lr")
    _positive(cfg, "train.weight_decay", allow_zero=True)
    dropout = cfg.model.dropout
    if not (isinstance(dropout, (int, float)) and 0 <= dropout < 1):
        raise LaunchError(f"model.dropout={dropout}: must be in [0, 1)")
    cl = cfg.cluster
    if cl.get("fault_timeout_s") is not None:
        raise LaunchError("cluster.fault_timeout_s was renamed: it is the grace period between "
                          "SIGTERM and SIGKILL, cluster.stop_grace_s; hangs are "
                          "cluster.hang_timeout_s")
    _int_at_least(cfg, "cluster.machines", 1)
    if cl.kind == "netns" and cl.machines > 99:
        raise LaunchError(f"cluster.machines={cl.machines}: cluster=netns supports 1..99 machines")
    _int_at_least(cfg, "cluster.trainers_per_machine", 1)
    _int_at_least(cfg, "cluster.servers_per_machine", 1)
    if not 1 <= cl.port <= 65535 - cl.servers_per_machine:
        raise LaunchError(f"cluster.port={cl.port}: must be a TCP port with room for "
                          f"cluster.servers_per_machine={cl.servers_per_machine} ports after it")
    _positive(cfg, "cluster.stop_grace_s", allow_zero=True)
    _positive(cfg, "cluster.hang_timeout_s", allow_zero=True)
    if cl.bandwidth is not None:
        if cl.kind != "netns":
            raise LaunchError(f"cluster.bandwidth={cl.bandwidth}: only cluster=netns machines have "
                              f"links to cap; remove it for cluster={cl.kind}")
        from .netns import parse_rate

        if parse_rate(str(cl.bandwidth)) <= 0:
            raise LaunchError(f"cluster.bandwidth={cl.bandwidth}: must be a positive rate")


def check_resume_dir(cfg, trainers: int) -> None:
    """`resume=`: the directory, a checkpoint that loads (weights only), a matching config."""
    if not cfg.get("resume"):
        return
    from degnn.runtime.checkpoint import CheckpointError, check_resume

    try:
        check_resume(cfg, trainers)
    except CheckpointError as e:
        raise LaunchError(str(e)) from None
