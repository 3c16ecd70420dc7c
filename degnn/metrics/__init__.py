"""Run output: byte counters, the evaluation curve (curve.jsonl) and the run summary (summary.json).

File names and summary keys are a contract with the launcher, the benchmarks and the tests
(docs/design.md, "The run directory"): keep them stable.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Optional

SUMMARY_FILE = "summary.json"
CURVE_FILE = "curve.jsonl"


ID_BYTES = 8  # an int64 node or edge id on the wire


class ByteCounter:
    """Application-level bytes, by category, counted where degnn sends or requests them.

    The categories are declared (degnn.metrics.summary.BYTE_CATEGORIES, and each pipeline's
    `byte_categories`), so a mistyped one fails at once instead of counting apart."""

    def __init__(self, categories=None):
        from degnn.metrics.summary import BYTE_CATEGORIES

        self.bytes: Dict[str, int] = defaultdict(int)
        self.known = set(BYTE_CATEGORIES) | set(categories or ())

    def declare(self, categories) -> None:
        self.known |= set(categories)

    def add(self, category: str, nbytes: int) -> None:
        if category not in self.known:
            raise KeyError(f"byte category {category!r} is not declared (known: {', '.join(sorted(self.known))})")
        self.bytes[category] += int(nbytes)

    def as_dict(self) -> Dict[str, int]:
        return dict(self.bytes)


def sampling_bytes(remote, blocks) -> int:
    """Bytes of the sampling RPCs a DistGraph batch sent to other machines.

    DGL sends the seeds of each hop to the machine that owns them (8 bytes per id) and gets back
    the sampled edges as (src, dst, eid) int64 triples; seeds owned by this machine are sampled
    locally and never cross the network. `remote` flags the batch's input nodes owned elsewhere:
    every block's destination nodes are a prefix of them (DGL's block layout), so one ownership
    lookup per batch serves every hop and the feature pull.
    """
    total = 0
    for block in blocks:
        seeds_remote = remote[:block.num_dst_nodes()]
        if not bool(seeds_remote.any()):
            continue
        # the edges sampled for remote seeds are their in-edges in the block (no COO needed)
        total += ID_BYTES * int(seeds_remote.sum()) + 3 * ID_BYTES * int(block.in_degrees()[seeds_remote].sum())
    return total


class PhaseTimer:
    """Where a trainer's training time goes, in seconds summed over its batches, by phase:

    * ``sampling``: building the batch's computation graph (distdgl: DGL's sampler, with its
      sampling RPCs to other machines; lamp: the locality-aware graph on the trainer's partition
      and sending the owners' requests);
    * ``owner_wait``: blocked on data other machines hold (distdgl: the feature pull; lamp: the
      owners' prepared hidden states and the local history rows not yet back);
    * ``compute``: forward, backward and optimizer step, the all-reduce taken out;
    * ``allreduce``: the gradient all-reduce (timed by a DDP communication hook, see
      `timed_allreduce_hook`, so it includes waiting for the slowest trainer);
    * ``history``: lamp's history pushes, weight shipping and halo sync (what the trainer spends
      on them; with `pipeline.prefetch` > 0 their answers are collected later, in the background).

    The summary reports each per batch, plus ``other`` (the rest of the epoch: progress bar,
    loss.item, heartbeats)."""

    PHASES = ("sampling", "owner_wait", "compute", "allreduce", "history")

    def __init__(self):
        self.total: Dict[str, float] = dict.fromkeys(self.PHASES, 0.0)
        self._inner = [0.0]  # per open phase: the time its nested phases took

    def add(self, phase: str, seconds: float) -> None:
        self.total[phase] += seconds

    @contextmanager
    def __call__(self, phase: str):
        """Time a phase; a phase opened inside another counts for itself only (the loop times
        a whole next(batches) as sampling, a pipeline may time parts of it as owner_wait)."""
        t0 = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - t0
            nested = self._inner.pop()
            self.total[phase] += elapsed - nested
            self._inner[-1] += elapsed


def timed_allreduce_hook(timer: PhaseTimer):
    """A DDP communication hook doing what DDP's default does (average the bucket over the ranks
    with one all-reduce) and adding its time, from launch to completion, to `timer`'s
    ``allreduce``. DDP waits for the returned future before backward() returns, so the time is in
    by then."""
    import torch.distributed as dist

    def hook(_state, bucket):
        t0 = time.perf_counter()
        buf = bucket.buffer().div_(dist.get_world_size())
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f):
            timer.add("allreduce", time.perf_counter() - t0)
            return f.value()[0]

        return fut.then(done)

    return hook


def breakdown_per_batch(ranks: list) -> Optional[Dict[str, float]]:
    """Mean over trainers of each phase's seconds per batch (`ranks`: each trainer's
    {"phases": PhaseTimer.total, "batches": n, "train_s": its training time}); ``other`` is
    the training time no phase covers."""
    rows = [r for r in ranks if r.get("batches")]
    if not rows:
        return None
    out: Dict[str, float] = {}
    for r in rows:
        per = {k: v / r["batches"] for k, v in r["phases"].items()}
        per["other"] = max(r["train_s"] / r["batches"] - sum(per.values()), 0.0)
        for k, v in per.items():
            out[k] = out.get(k, 0.0) + v / len(rows)
    return {k: round(v, 5) for k, v in out.items()}


def ring_allreduce_bytes(payload_bytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of `payload_bytes`: 2 (W-1)/W of the payload."""
    if world_size <= 1:
        return 0
    return int(2 * (world_size - 1) * payload_bytes / world_size)


class WireCounter:
    """Bytes this machine sent on the interface its cluster traffic uses, read from sysfs.

    That interface is the one named by GLOO_SOCKET_IFNAME (on netns machines: the machine's own
    veth, so the count is exact); `read()` returns None where it is not set.
    """

    def __init__(self, iface: Optional[str]):
        self.path = Path(f"/sys/class/net/{iface}/statistics/tx_bytes") if iface else None
        if self.path is not None and not self.path.exists():
            self.path = None

    def read(self) -> Optional[int]:
        if self.path is None:
            return None
        return int(self.path.read_text())

    @classmethod
    def from_env(cls) -> "WireCounter":
        return cls(os.environ.get("GLOO_SOCKET_IFNAME"))


def finite_or_none(value):
    """JSON has no NaN/Infinity: a non-finite number is written as null (also inside lists/dicts)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def _line(record: dict) -> str:
    return json.dumps(finite_or_none(record), allow_nan=False) + "\n"


def append_curve(run_dir: Path, record: dict) -> None:
    with open(Path(run_dir) / CURVE_FILE, "a") as f:
        f.write(_line(record))


def write_curve(run_dir: Path, records: list) -> None:
    """Replace curve.jsonl with `records` (a resumed run's finished epochs)."""
    path = Path(run_dir) / CURVE_FILE
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(_line(r) for r in records))
    os.replace(tmp, path)


def read_curve(run_dir: Path) -> list:
    path = Path(run_dir) / CURVE_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def progress_of(run_dir: Path) -> dict:
    """What curve.jsonl says a run got done: the summary keys of a run that stopped early.

    `epochs` counts finished epochs (a diverged epoch is logged but not finished); best_val and
    test are taken at the best validation point, as the pipelines do. A curve of rounds
    (pipeline=tma: each line has `round`, and `epoch` is the local epochs then) counts rounds, as
    a finished TMA run's summary does."""
    try:
        curve = read_curve(run_dir)
    except (OSError, ValueError):
        return {}
    key = "round" if any("round" in r for r in curve) else "epoch"
    done = [r for r in curve if not r.get("diverged") and key in r]
    if not done:
        return {}
    evals = [r for r in done if r.get("val") is not None]
    out = {"epochs": done[-1][key], "train_time_s": done[-1].get("train_time_s"),
           "wall_s": done[-1].get("wall_s")}
    if evals:
        best = max(evals, key=lambda r: r["val"])  # the first of equal values
        out.update(best_val=best["val"], test=best.get("test"), best_epoch=best[key],
                   test_final=evals[-1].get("test"))
    return out


def write_json_atomic(path: Path, data: dict) -> None:
    """Strict JSON written to a temporary sibling and renamed into place: `path` is never empty or
    half written (a full disk raises OSError and leaves `path` as it was)."""
    path = Path(path)
    text = json.dumps(finite_or_none(data), indent=2, sort_keys=True, allow_nan=False) + "\n"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / SUMMARY_FILE).read_text())


def write_summary(run_dir: Path, summary: dict) -> None:
    write_json_atomic(Path(run_dir) / SUMMARY_FILE, summary)


def result_line(s: dict) -> str:
    """The one-line result every run ends with (printed by the launcher, or by rank 0 without it)."""

    def fmt(key, spec):
        v = s.get(key)
        return "-" if v is None else format(v, spec)

    pipeline = s.get("pipeline")
    if s.get("variant") not in (None, "default"):
        pipeline = f"{pipeline}/{s['variant']}"
    return (
        f"result: pipeline={pipeline} dataset={s.get('dataset')} machines={s.get('machines')} "
        f"trainers={fmt('trainers', '')} status={s.get('status')} "
        f"best_val={fmt('best_val', '.4f')} test={fmt('test', '.4f')} metric={s.get('metric', '-')} "
        f"epochs={fmt('epochs', '')} train_time_s={fmt('train_time_s', '.1f')} "
        f"app_bytes_per_batch={fmt('app_bytes_per_batch', '.0f')} "
        f"net_bytes_per_batch={fmt('net_bytes_per_batch', '.0f')}"
    )
