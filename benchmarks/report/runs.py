"""What one run is, in words and numbers, as every table reads it: its method, label, injected
failure and suite group; its median epoch, time to a target, steps per second, edges kept and wire
bytes beyond the all-reduce; `fmt`, `kb` and `mb` print a table cell ("–" for a missing value)."""
from __future__ import annotations

from typing import List, Optional

import yaml

from ..records import bandwidth
from ..spread import median


def failure(s: dict) -> Optional[str]:
    """The failure a TMA run injected ('rank 3 killed at 15s', 'part 3 dropped'), or None."""
    parts = []
    if s.get("kill_rank") is not None:
        parts.append(f"rank {s['kill_rank']} killed at {s.get('kill_at_s', 0):.0f}s")
    if s.get("drop_parts"):
        parts.append("part " + ",".join(map(str, s["drop_parts"])) + " dropped")
    return "; ".join(parts) or None


def method(s: dict) -> str:
    name = s.get("pipeline", "?")
    if s.get("variant") not in (None, "default"):
        name += f"/{s['variant']}"
    return name


def train_setting(s: dict, key: str):
    """A `train.` key of the run's config (`train.epochs`, `train.patience`), else of its record's
    overrides (a record keeps only some keys of the config); None without one."""
    value = ((s.get("_config") or {}).get("train") or {}).get(key)
    if value is None:
        for o in (s.get("_record") or {}).get("overrides") or ():
            if o.startswith(f"train.{key}="):
                return yaml.safe_load(o.split("=", 1)[1])
    return value


def hit_epoch_cap(s: dict) -> bool:
    """Whether the run trained all its `train.epochs` (the cap, not patience, stopped it)."""
    cap = train_setting(s, "epochs")
    return cap is not None and (s.get("epochs") or 0) >= cap


def group_key(s: dict) -> tuple:
    """Runs are told apart by pipeline, variant, dataset, layers, machines, bandwidth and failure."""
    return (s.get("pipeline"), s.get("variant"), s.get("dataset"), s.get("layers"), s.get("machines"),
            bandwidth(s), failure(s))


def label(s: dict) -> str:
    text = f"{method(s)} {s.get('dataset')} L{s.get('layers')} M{s.get('machines')}"
    if bandwidth(s):
        text += f" {bandwidth(s)}"
    if failure(s):
        text += f" ({failure(s)})"
    return text


def fmt(v, spec: str = ".4f") -> str:
    return "–" if v is None else format(v, spec)


def kb(v) -> str:
    return "–" if v is None else f"{v / 1024:,.1f}"


def mb(v) -> str:
    return "–" if v is None else f"{v / 1e6:,.2f}"


def median_epoch_s(s: dict) -> Optional[float]:
    """Median epoch time: robust to the first epoch's warm-up and to a noisy neighbour."""
    times = s.get("epoch_times_s") or []
    return median(times) if times else s.get("epoch_time_s")


def time_to(curve: List[dict], target: float) -> Optional[float]:
    """Training time of the first evaluation at or above `target` (None if never)."""
    for r in curve:
        if r.get("val") is not None and r["val"] >= target:
            return r["train_time_s"]
    return None


def time_to_target(s: dict, target: Optional[float]) -> Optional[float]:
    """The run's training time to `target` (evaluation excluded)."""
    return None if target is None else time_to(s["_curve"], target)


def time_from_launch(s: dict, target: Optional[float]) -> Optional[float]:
    """The run's time from launch to `target`: its set-up (`setup_s`: DGL's initialisation with
    the servers' partition load, the pipeline's and the evaluator's set-up) plus its training time
    to the target (docs/benchmarks.md, "Time from launch"); None without a set-up time."""
    t = time_to_target(s, target)
    return None if t is None or s.get("setup_s") is None else t + s["setup_s"]


def steps_per_s(s: dict) -> Optional[float]:
    """Local steps per second of training, per trainer (mean over trainers)."""
    per = s.get("steps_per_s_per_trainer")
    if per:
        vals = [v for v in per.values() if v]
        return sum(vals) / len(vals) if vals else None
    if s.get("batches") and s.get("train_time_s") and s.get("trainers"):
        return s["batches"] / s["trainers"] / s["train_time_s"]
    return None


def edges_kept(s: dict) -> Optional[float]:
    """Share of the graph's edges the run trains on: TMA's induced subgraphs drop the cut ones."""
    if s.get("pipeline") == "distdgl":
        return 1.0
    return s.get("edges_kept_fraction")


def _group(s: dict) -> str:
    """The run's suite without its pipeline suffix: bench=lamp pairs `<group>-distdgl` with
    `<group>-lamp` (same settings otherwise)."""
    suite = s["_rel"].split("/")[0]
    for suffix in ("-distdgl", "-lamp"):
        if suite.endswith(suffix):
            return suite[: -len(suffix)]
    return suite


def _beyond_allreduce(s: dict) -> Optional[float]:
    net, ar = s.get("net_bytes_per_batch"), s.get("allreduce_bytes_per_batch")
    return None if net is None or ar is None else net - ar


def ablated(s: dict) -> bool:
    """A run of an ablation of what the owners add (distdgl with the halo cache, lamp with its
    roots from histories): compared in `owners_section` only."""
    return bool(s.get("halo_cache")) or s.get("roots", "owners") != "owners"
