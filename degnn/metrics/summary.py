"""The run summary (summary.json) as one typed record, and the byte categories it adds up.

`RunSummary` defines every key that the shared training loop and the launcher write; a pipeline
adds its own keys through a dataclass of its own (`Pipeline.summary_extra`), so every key of a
summary is defined exactly once, and `to_dict` refuses a key defined twice or a pipeline's keys
that are not a dataclass. docs/design.md lists these keys; tests/test_summary.py checks the list against this file.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Dict, List, Optional

# Byte categories every pipeline may count (degnn.metrics.ByteCounter); a pipeline declares its
# own in `Pipeline.byte_categories`. Only bytes that cross machines are counted here.
BYTE_CATEGORIES = {
    "sampling": "seeds sent to the machine that owns them and the sampled edges back",
    "features": "remote feature rows: the id out, the row back",
    "allreduce": "the gradient all-reduce (a ring sends 2 (W-1)/W of the gradient bytes per rank)",
    "eval": "evaluation traffic (kept out of the per-batch numbers)",
    "setup": "what a trainer reads once before training",
}
NOT_PER_BATCH = ("eval",)  # categories left out of app_bytes_per_batch


@dataclass
class RunSummary:
    # what ran
    pipeline: str
    variant: str
    dataset: str
    task: str
    metric: str
    model: str
    layers: int
    hidden: int
    fanouts: List[int]
    machines: int
    trainers: int
    device: str = "cpu"
    # the evaluation: null = full-neighbour over every node; fan-outs = sampled, validation and
    # test nodes only (train.eval_fanouts)
    eval_fanouts: Optional[List[int]] = None
    eval_max_nodes: int = 0  # with eval_fanouts: validation and test nodes scored at most (0: all)
    # how it did (the test metric at the best validation point, and at the end)
    best_val: Optional[float] = None
    test: Optional[float] = None
    test_final: Optional[float] = None
    best_epoch: Optional[int] = None
    # time: training only (evaluation excluded) and wall time from the loop's start
    train_time_s: float = 0.0
    wall_s: float = 0.0
    # epochs (TMA: averaging rounds) finished
    epochs: int = 0
    epoch_time_s: Optional[float] = None
    epoch_times_s: List[float] = field(default_factory=list)
    # training steps of all trainers together
    batches: int = 0
    # application bytes (counted where they are sent), summed over trainers, per batch
    app_bytes_per_batch: Optional[float] = None
    allreduce_bytes_per_batch: Optional[float] = None
    app_bytes_by_category: Dict[str, int] = field(default_factory=dict)
    eval_bytes_total: int = 0
    # wire bytes (netns: the veth counters) of the training phase; total: the launcher's
    net_bytes_train: Optional[int] = None
    net_bytes_per_batch: Optional[float] = None
    net_bytes_total: Optional[int] = None
    # seconds per batch by phase, mean over trainers (degnn.metrics.PhaseTimer)
    time_per_batch_s: Optional[Dict[str, float]] = None
    # host-to-device copies of a training step, per batch over all trainers: {"tensors", "bytes"}
    # (degnn.runtime.device.DeviceMover; 0 on the CPU)
    device_copies_per_batch: Optional[Dict[str, float]] = None
    peak_rss_mb_trainer: Optional[float] = None
    # set-up, before the first training batch (slowest trainer; bytes of all; largest peak RSS)
    setup_s: Optional[float] = None
    setup_bytes: Optional[int] = None
    setup_net_bytes: Optional[int] = None
    setup_peak_rss_mb: Optional[float] = None
    # synchronous pipelines: whether every trainer ends with bit-identical parameters (what a
    # gradient all-reduce guarantees; false means a trainer stepped on gradients of its own)
    params_agree: Optional[bool] = None
    # what the task adds: node, the classes; link, negatives per training positive (measured)
    # and the held-out edges with their negatives
    num_classes: Optional[int] = None
    train_neg_per_pos: Optional[float] = None
    eval_num_neg: Optional[int] = None
    eval_edges: Optional[Dict[str, int]] = None
    # ok | failed; a failed run says why in one line
    status: str = "ok"
    error: Optional[str] = None


# keys only the launcher writes (after the trainers, or instead of them when the run failed)
LAUNCHER_KEYS = ("net_tx_bytes_per_machine", "net_rx_bytes_per_machine", "trainers_died",
                 "stopped_by", "failed_process", "peak_rss_mb_per_process", "peak_rss_mb_server",
                 "peak_pss_mb_per_process", "peak_uss_mb_per_process",
                 "memory_per_machine_mb", "cpus_per_machine", "machine_peak_memory_mb",
                 "machine_memory_split_mb", "graph_mb", "graph_share_mb", "machine_partition_mb",
                 "machine_peak_per_share", "machine_fixed_mb",
                 "partition_s", "partition_load_s", "partition_peak_rss_mb", "partition_edge_cut_fraction",
                 "graph_digest", "partition_digest", "partition_streamed")


def summary_keys(extra=None) -> List[str]:
    keys = [f.name for f in fields(RunSummary)] + list(LAUNCHER_KEYS)
    if extra is not None:
        keys += [f.name for f in fields(extra)]
    return keys


def to_dict(summary: RunSummary, extra=None) -> dict:
    """summary.json's content: the shared keys, then the pipeline's own (`extra`, a dataclass
    instance); a key defined in both is a programming error."""
    out = asdict(summary)
    if out["error"] is None:
        del out["error"]
    if extra is not None:
        if not is_dataclass(extra):
            raise TypeError(f"a pipeline's summary fields must be a dataclass, not {type(extra).__name__}")
        own = asdict(extra)
        twice = sorted(set(own) & set(out))
        if twice:
            raise ValueError(f"summary keys defined twice: {', '.join(twice)}")
        out.update(own)
    return out
