"""A calibrated projection of an epoch's time to other clusters (docs/benchmarks.md, "Projection to
real clusters").

One measured run calibrates a pipeline; the projection then predicts its epoch time at another
bandwidth, latency and compute speed. Per batch and trainer, for each phase p of
degnn.metrics.PhaseTimer (summary `time_per_batch_s`):

    t_p = cpu_p / speed + bytes_p / bandwidth + round_trips_p * latency

* `bytes_p` (measured): the application bytes of the phase's categories per batch
  (`app_bytes_by_category` / `batches`), times the wire overhead (`net_bytes_per_batch` /
  `app_bytes_per_batch`). netns caps each machine's link in both directions (tc tbf), so the
  machine with the most bytes sets the pace: what the busiest machine moves beyond the mean (its
  larger of sent and received bytes over the mean machine's) is waited for in the all-reduce, the
  first step every trainer takes together.
* `round_trips_p` (counted, not measured): distdgl's sampler one per layer, its feature pull one,
  lamp's `rpc_round_trips_per_batch`, the ring all-reduce 2 (W - 1).
* `cpu_p` (derived): the measured phase time less its byte and latency terms at the calibration
  run's link (netns adds no delay: latency 0). Everything that is not bytes on the link counts as
  CPU and scales with the speed, the all-reduce's wait for the slowest trainer included.

Link efficiency: a netns link (tc tbf) does not give DistDGL's pull, several TCP flows at once, its
nominal rate (and gives a transfer shorter than its burst more). benchmarks.link_probe measures
the delivered share by bandwidth and bytes per peer (`benchmarks/records/network.jsonl`); a netns
run's bytes take its rate times that efficiency (`Efficiencies.at`, at each phase's bytes over the
W - 1 peers), in the calibration and in the check. The grid's links (real ones) run at their
nominal rate.

Overlap: lamp with `prefetch` >= 1 has the owners' round of the next batch in flight while the
trainer trains, so its wait is max(0, owners' bytes and round trips - the rest of the batch) plus
the owner wait's CPU part. distdgl calibrated on a synchronous run can be predicted with a
prefetching loader (`prefetch=1`): sampling and the feature pull overlap the model's step, but the
all-reduce that ends the step shares the machine's link with the pull in flight and waits behind
it (a link's queue is first in, first out), so a batch takes the longer of loader and step, then
the all-reduce; where the loader shares the machine's CPU, at least every CPU part together. A
prefetching distdgl run calibrates the same model inverted: its loader thread's own times
(`prefetch_sampling_s_per_batch`, `prefetch_pull_s_per_batch`) are the loader, its compute and
other phases the step, and the all-reduce what the batch took beyond the longer of the two (a run
without the loader's times: its phases as they are, the pull hidden). distdgl's default loader
only samples (`prefetch_pull` false): the trainer pulls, then steps while the thread samples, so
a batch takes pull + max(sampling, step with its all-reduce), on a shared CPU at least all its
CPU; a run of it calibrates with the thread's sampling time as sampling. The check predicts a
prefetching run from the synchronous runs of its setting where there are any (its loader
modelled): that tests the overlap model the grid uses. Whatever overlaps, a batch cannot be faster
than its machine's link carrying every byte of it.

Speed 1x is one core of the calibrating host per machine: a run at `cluster.cpus_per_machine` c
calibrates at speed c. An epoch is the run's batches per trainer times the batch time.

TMA (local training plus model averaging every `sync_every_s`) is modelled from a TMA run's
seconds per step (1 / its trainers' mean steps per second; no remote sampling or all-reduce), or,
without one, from distdgl's compute and other phases; averaging sends the parameters to the
service on machine 0 and the mean back, (W - 1) parameter copies each way on that machine's link.

The check (`checks`): every distdgl and lamp run is predicted from each other run of its group
(same config but for the link, the CPU budget and distdgl's loop; synchronous distdgl runs
calibrate where the group has any), with the target's speed from its CPU budget and from its
compute phase against the calibration's (the speed it got; a shared host may deliver less than
the budget). The projected grid (`calibrations`) uses, per pipeline, the run of its defaults
(distdgl: synchronous first) whose compute took the fewest CPU-seconds a batch.

`python -m benchmarks.projection <results folder>` writes projection.md and projection.png there.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .records import bandwidth, batches_per_epoch, loader_label, pulls_ahead

# which phase each byte category's time falls in
CATEGORY_PHASE = {"sampling": "sampling", "features": "owner_wait", "allreduce": "allreduce",
                  "lamp_request": "owner_wait", "lamp_response": "owner_wait",
                  "history_sync": "history", "grad_push": "history"}
PHASES = ("sampling", "owner_wait", "compute", "allreduce", "history", "other")
LOADER = ("sampling", "owner_wait")  # what distdgl's prefetch overlaps with training
TOLERANCE = 0.20  # the quality bar: a prediction within 20% of the measured epoch
BANDWIDTHS = ("100mbit", "1gbit", "10gbit", "100gbit")  # the crossover table's columns
SPEEDS = (1, 2, 5, 10, 20, 50)  # the crossover table's rows
MODEL_SPEEDS = (20, 50, 100)  # the GPU table's rows: the model's step alone (bench=compute's range)
LATENCY_S = 0.0002  # a datacenter TCP round trip for the projection's grid


def rate(text) -> float:
    """A tc rate ("100mbit", "1gbit") -> bytes per second."""
    from degnn.launch.netns import parse_rate

    return parse_rate(str(text))


@dataclass
class Calibration:
    """A pipeline's per-batch costs, from one measured run (see the module docstring)."""

    pipeline: str
    source: str
    speed: float  # the calibration run's compute speed (its per-machine CPUs; 1 where unlimited)
    batches_per_epoch: float  # per trainer
    machines: int
    cpu_s: Dict[str, float]  # seconds per batch at `speed`, bytes and round trips taken out
    bytes: Dict[str, float]  # busiest machine's wire bytes per batch
    round_trips: Dict[str, float] = field(default_factory=dict)
    prefetch: int = 0
    param_bytes: Optional[float] = None  # TMA: one copy of the model
    sync_every_s: Optional[float] = None
    exposed: bool = False  # distdgl measured with its prefetch (calibrate: its loader thread's times)
    prefetch_pull: bool = True  # distdgl's loader pulls too (False: it samples, the trainer pulls)
    hidden_bytes: Dict[str, float] = field(default_factory=dict)  # exposed: the loader's, for the link bound


def net_s(by: Dict[str, float], bandwidth: float, peers: int, links=None) -> Dict[str, float]:
    """Seconds each phase's bytes take on a link of `bandwidth` bytes/s: at the efficiency `links`
    (benchmarks.link_probe.Efficiencies) measured for its bytes per peer, else at the rate."""
    if math.isinf(bandwidth):
        return {p: 0.0 for p in by}
    return {p: b / (bandwidth * (links.at(bandwidth, b / max(1, peers)) if links else 1.0)) for p, b in by.items()}


def phase_bytes(s: dict) -> Dict[str, float]:
    """Wire bytes per batch by phase (measured; module docstring): the mean machine's in each
    phase, and what the busiest machine has more in the all-reduce, where the others wait for it."""
    batches = s.get("batches") or 0
    if not batches:
        return {}
    app = s.get("app_bytes_per_batch") or 0.0
    wire = (s["net_bytes_per_batch"] / app) if app and s.get("net_bytes_per_batch") else 1.0
    skew = busiest_share(s)
    out: Dict[str, float] = {}
    for cat, total in (s.get("app_bytes_by_category") or {}).items():
        phase = CATEGORY_PHASE.get(cat)
        if phase is None:
            continue
        mean = total / batches * wire
        out[phase] = out.get(phase, 0.0) + mean
        if cat != "allreduce" and skew > 1:
            # the mean trainer waits for its own bytes, then in the all-reduce for the busiest's
            out["allreduce"] = out.get("allreduce", 0.0) + mean * (skew - 1)
    return out


def busiest_share(s: dict) -> float:
    """The busiest machine's bytes over the mean machine's (sent or received, whichever is more)."""
    tx, rx = s.get("net_tx_bytes_per_machine") or [], s.get("net_rx_bytes_per_machine") or []
    both = [max(a, b) for a, b in zip(tx, rx)]
    mean = sum(tx + rx) / (len(tx) + len(rx)) if tx and rx else 0
    return max(1.0, max(both) / mean) if both and mean else 1.0


def round_trips(s: dict) -> Dict[str, float]:
    w = s.get("machines") or 1
    out = {"allreduce": 2.0 * (w - 1)} if w > 1 else {}
    if s.get("pipeline") == "distdgl":
        out.update(sampling=float(s.get("layers") or 1), owner_wait=1.0)
    elif s.get("rpc_round_trips_per_batch") is not None:
        out["owner_wait"] = float(s["rpc_round_trips_per_batch"])
    return out


def tma_phases(s: dict) -> Optional[Dict[str, float]]:
    """A TMA run's seconds per step, all local (1 / its trainers' mean steps per second)."""
    rates = [v for v in (s.get("steps_per_s_per_trainer") or {}).values() if v]
    return {"compute": len(rates) / sum(rates)} if s.get("pipeline") == "tma" and rates else None


def calibrate(s: dict, latency_s: float = 0.0, links=None) -> Calibration:
    """Per-batch CPU, bytes and round trips of run `s` (a summary.json dict); `latency_s`: the
    round trip of the run's own links (netns: 0); `links`: their measured efficiency."""
    phases = s.get("time_per_batch_s") or tma_phases(s)
    if not phases or not s.get("batches"):
        raise ValueError(f"run {s.get('_rel', s.get('pipeline'))} has no time_per_batch_s or batches: "
                         "it cannot calibrate a projection")
    bw = bandwidth(s)
    b = rate(bw) if bw else math.inf
    by = phase_bytes(s)
    rt = round_trips(s)
    prefetch = int(s.get("prefetch") or 0)
    exposed = _exposed(s)
    hidden = {}
    loader = (s.get("prefetch_sampling_s_per_batch"), s.get("prefetch_pull_s_per_batch"))
    pull = pulls_ahead(s)
    if exposed and not pull and loader[0] is not None:
        phases = {**phases, "sampling": loader[0]}  # the loader samples only; the rest as measured
    elif exposed and None not in loader:
        # the loader thread's own times stand for the loop's sampling and pull; the all-reduce is
        # what the batch took beyond the longer of loader and step (batch_time's overlap, inverted)
        total = sum(phases.get(p, 0.0) for p in PHASES)
        step = sum(phases.get(p, 0.0) for p in PHASES if p not in LOADER and p != "allreduce")
        phases = {**phases, "sampling": loader[0], "owner_wait": loader[1],
                  "allreduce": max(0.0, total - max(sum(loader), step))}
    elif exposed:
        prefetch = 0  # its phases are what the overlap left exposed: predicted as they are
        hidden = {p: by.pop(p) for p in LOADER if p in by}  # the pull overlapped: only the link bound sees it
    machines = int(s.get("machines") or 1)
    link_s = net_s(by, b, machines - 1, links)
    cpu = {}
    for p in PHASES:
        net = link_s.get(p, 0.0) + rt.get(p, 0.0) * latency_s
        cpu[p] = max(0.0, phases.get(p, 0.0) - net)
    if s.get("pipeline") == "lamp" and prefetch:
        # the owner wait measured is what the rest of the batch left of the owners' round
        rest = sum(phases.get(p, 0.0) for p in PHASES if p != "owner_wait")
        net = link_s.get("owner_wait", 0.0) + rt.get("owner_wait", 0.0) * latency_s
        cpu["owner_wait"] = max(0.0, phases.get("owner_wait", 0.0) - max(0.0, net - rest))
    return Calibration(pipeline=s.get("pipeline", "?"), source=s.get("_rel", "?"),
                       speed=float(s.get("cpus_per_machine") or 1.0),
                       batches_per_epoch=batches_per_epoch(s), machines=machines,
                       cpu_s=cpu, bytes=by, round_trips=rt, prefetch=prefetch,
                       param_bytes=s.get("param_bytes"), sync_every_s=s.get("sync_every_s"), exposed=exposed,
                       hidden_bytes=hidden, prefetch_pull=pull)


def batch_time(c: Calibration, bandwidth: float, speed: float, latency_s: float = 0.0,
               prefetch: Optional[int] = None, shared_cpu: bool = True,
               model_speed: Optional[float] = None, links=None, pull: Optional[bool] = None) -> float:
    """Predicted seconds per batch at `bandwidth` (bytes/s), compute `speed` (1 = one core of the
    calibrating host) and `latency_s` per round trip. `shared_cpu`: the loader and the trainer
    share the machine's CPU (netns budgets); a real machine gives the loader cores of its own.
    `model_speed`: the model's step (the compute phase) alone at this speed, e.g. on a GPU, the
    rest (sampling, LAMP's owners, histories) at `speed`. `links`: the measured efficiency of the
    links at `bandwidth` (netns; None: the nominal rate). `pull`: distdgl's prefetching loader pulls
    the features too (None: as the calibration run did)."""
    prefetch = c.prefetch if prefetch is None or c.exposed else prefetch
    pull = c.prefetch_pull if pull is None or c.exposed else pull
    peers = c.machines - 1
    link_s = net_s(c.bytes, bandwidth, peers, links)
    net = {p: link_s.get(p, 0.0) + c.round_trips.get(p, 0.0) * latency_s for p in PHASES}
    cpu = {p: c.cpu_s.get(p, 0.0) * c.speed / (model_speed if p == "compute" and model_speed else speed)
           for p in PHASES}
    link = sum(link_s.values()) + sum(net_s(c.hidden_bytes, bandwidth, peers, links).values())
    if c.pipeline == "tma":
        return sum(cpu.values())
    if c.pipeline == "lamp" and prefetch:
        rest = sum(cpu[p] + net[p] for p in PHASES if p != "owner_wait")
        t = rest + cpu["owner_wait"] + max(0.0, net["owner_wait"] - rest)
    elif c.pipeline == "distdgl" and prefetch and not pull:
        # the loader samples the next batch during the step; the trainer pulls before it, the
        # link to itself: pull, then the longer of sampling and step with its all-reduce
        step = sum(cpu[p] + net[p] for p in PHASES if p not in LOADER)
        t = cpu["owner_wait"] + net["owner_wait"] + max(cpu["sampling"] + net["sampling"], step)
        t = max(t, sum(cpu.values()) if shared_cpu and not c.exposed else 0.0)
    elif c.pipeline == "distdgl" and prefetch:
        loader = sum(cpu[p] + net[p] for p in LOADER)
        step = sum(cpu[p] + net[p] for p in PHASES if p not in LOADER and p != "allreduce")
        # the all-reduce ends the step and waits behind the pull in flight on the same link; a
        # shared CPU runs loader and step one after the other (a loader timed in its thread beside
        # the step, c.exposed, holds that already)
        shared = shared_cpu and not c.exposed
        t = max(max(loader, step) + cpu["allreduce"] + net["allreduce"], sum(cpu.values()) if shared else 0.0)
    else:
        t = sum(cpu[p] + net[p] for p in PHASES)
    return max(t, link)


def epoch_time(c: Calibration, bandwidth: float, speed: float, latency_s: float = 0.0,
               prefetch: Optional[int] = None, shared_cpu: bool = True,
               batches: Optional[float] = None, model_speed: Optional[float] = None, links=None,
               pull: Optional[bool] = None) -> float:
    """Predicted seconds of one epoch (`batches` per trainer; default the calibration run's).
    TMA adds an averaging round every `sync_every_s` seconds of training."""
    n = c.batches_per_epoch if batches is None else batches
    train = n * batch_time(c, bandwidth, speed, latency_s, prefetch, shared_cpu, model_speed, links, pull)
    if c.pipeline == "tma" and c.param_bytes and c.sync_every_s:
        per_round = (c.machines - 1) * c.param_bytes / bandwidth + 2 * latency_s
        train += train / c.sync_every_s * per_round
    return train


def tma_from_distdgl(c: Calibration, param_bytes: float, sync_every_s: float) -> Calibration:
    """A TMA calibration from a distdgl one: its compute and other phases, no sampling, no pull,
    no all-reduce (what a TMA trainer does on its own partition)."""
    cpu = {"compute": c.cpu_s.get("compute", 0.0), "other": c.cpu_s.get("other", 0.0)}
    return Calibration(pipeline="tma", source=f"{c.source} (distdgl's compute)", speed=c.speed,
                       batches_per_epoch=c.batches_per_epoch, machines=c.machines, cpu_s=cpu, bytes={},
                       param_bytes=param_bytes, sync_every_s=sync_every_s)


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def verdict(err: float, tolerance: float = TOLERANCE) -> str:
    return f"within {tolerance:.0%}" if abs(err) <= tolerance else f"over {tolerance:.0%}"


def crossing(xs: Sequence[float], ys: Sequence[float], level: float = 1.0) -> Optional[float]:
    """The first x where ys crosses `level` (linear in log x between grid points), or None."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if (y0 - level) * (y1 - level) <= 0 and y0 != y1:
            f = (level - y0) / (y1 - y0)
            return math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))
    return None


def log_grid(lo: float, hi: float, n: int) -> List[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def ratio_grid(num: Calibration, den: Calibration, bandwidths: Sequence[float], speeds: Sequence[float],
               latency_s: float = LATENCY_S, shared_cpu: bool = False,
               den_prefetch: Optional[int] = None, model_speed: Optional[float] = None) -> List[List[float]]:
    """[speed][bandwidth] -> epoch(num) / epoch(den), both at the same batches per epoch."""
    n = den.batches_per_epoch
    return [[epoch_time(num, b, s, latency_s, shared_cpu=shared_cpu, batches=n, model_speed=model_speed)
             / epoch_time(den, b, s, latency_s, den_prefetch, shared_cpu=shared_cpu, batches=n, model_speed=model_speed)
             for b in bandwidths] for s in speeds]


def fmt_rate(bps: float) -> str:
    bits = bps * 8
    for unit, size in (("gbit", 1e9), ("mbit", 1e6)):
        if bits >= size:
            v = bits / size
            return f"{v:.0f} {unit}" if v >= 10 else f"{v:.2g} {unit}"
    return f"{bits / 1e3:.0f} kbit"


# ---------------------------------------------------------------- the check against measurement

def _group_key(s: dict):
    """Runs of one group differ in their link and CPU budget only, and distdgl's in its loop
    (`prefetch`: the model predicts one loop from the other) (their dataset and config.yaml
    otherwise: a record's settings leave the dataset out)."""
    distdgl = s.get("pipeline") == "distdgl"
    cfg = s.get("_config")
    if cfg:
        cfg = json.loads(json.dumps(cfg, default=str))
        for key in ("bandwidth", "cpus_per_machine"):
            (cfg.get("cluster") or {}).pop(key, None)
        if distdgl:
            for key in ("prefetch", "prefetch_pull"):
                (cfg.get("pipeline") or {}).pop(key, None)
        return json.dumps([s.get("dataset"), cfg], sort_keys=True)
    return (s.get("pipeline"), s.get("variant"), s.get("dataset"), s.get("layers"),
            tuple(s.get("fanouts") or ()), s.get("machines"), s.get("trainers"), s.get("bits"),
            None if distdgl else s.get("prefetch"), s.get("halo_cache"), s.get("roots"), s.get("engine"))


def _exposed(s: dict) -> bool:
    return s.get("pipeline") == "distdgl" and bool(s.get("prefetch"))


def _setting(s: dict) -> str:
    cpus = s.get("cpus_per_machine")
    loop = f" prefetch {s['prefetch']}" if s.get("pipeline") == "distdgl" and s.get("prefetch") is not None else ""
    loop += loader_label(s) if loop else ""
    loop += " halo cache" if s.get("halo_cache") else ""
    loop += f" roots={s['roots']}" if s.get("roots", "owners") != "owners" else ""
    return (f"{s.get('pipeline')}{loop} {s.get('dataset')} L{s.get('layers')} {bandwidth(s) or 'unlimited'} "
            f"{cpus if cpus is not None else '-'} CPUs")


def measured_epoch(s: dict) -> Optional[float]:
    times = s.get("epoch_times_s") or []
    if times:
        return sum(times) / len(times)
    return s.get("epoch_time_s")


def usable(runs: List[dict]) -> List[dict]:
    # a prefetch_auto run mixes two loops (its choice per trainer): no model of it
    return [s for s in runs if s.get("status") == "ok" and s.get("time_per_batch_s") and s.get("batches")
            and s.get("pipeline") in ("distdgl", "lamp") and bandwidth(s) and measured_epoch(s)
            and not s.get("prefetch_auto")]


def delivered_speed(target: dict, cal: Calibration) -> Optional[float]:
    """The compute speed the target run got, from its compute phase (forward, backward, step: the
    same work a batch at any bandwidth) against the calibration's; None without one."""
    t = (target.get("time_per_batch_s") or {}).get("compute")
    return cal.speed * cal.cpu_s["compute"] / t if t and cal.cpu_s.get("compute") else None


def checks(runs: List[dict], links=None) -> List[dict]:
    """Every run predicted from every other run of its group (same config but for the link, the
    CPU budget and distdgl's loop; a prefetching distdgl run from the synchronous ones where its
    group has any, its loader modelled): one row each, with the speed from the target's CPU budget
    (`predicted`) and from its compute phase (`predicted_delivered`; not where the loops differ:
    a prefetching run's compute phase holds the loader thread's share of the CPU too). `links`:
    the netns links' measured efficiency (benchmarks.link_probe)."""
    groups: Dict[object, List[dict]] = {}
    for s in usable(runs):
        groups.setdefault(_group_key(s), []).append(s)
    rows = []
    for members in groups.values():
        synchronous = [s for s in members if not _exposed(s)]
        for target in members:
            for src in (synchronous or members):
                if src is target:
                    continue
                cal = calibrate(src, links=links)
                bw, n, meas = rate(bandwidth(target)), batches_per_epoch(target), measured_epoch(target)
                loop = int(target.get("prefetch") or 0) if target.get("pipeline") == "distdgl" else None
                pull = pulls_ahead(target)
                pred = epoch_time(cal, bw, float(target.get("cpus_per_machine") or 1.0), batches=n,
                                  prefetch=loop, links=links, pull=pull)
                speed = delivered_speed(target, cal) if _exposed(src) == _exposed(target) else None
                got = epoch_time(cal, bw, speed, batches=n, prefetch=loop, links=links, pull=pull) if speed else None
                rows.append({"target": target, "source": src, "measured": meas, "predicted": pred,
                             "error": error(pred, meas), "predicted_delivered": got,
                             "error_delivered": error(got, meas) if got else None,
                             "kind": _kind(src, target)})
    return sorted(rows, key=lambda r: (_setting(r["target"]), r["kind"], _setting(r["source"])))


def _kind(src: dict, target: dict) -> str:
    same_bw = bandwidth(src) == bandwidth(target)
    same_cpu = src.get("cpus_per_machine") == target.get("cpus_per_machine")
    if same_bw and same_cpu:
        return "same link and CPU"
    return "CPU" if same_bw else ("bandwidth" if same_cpu else "bandwidth + CPU")


def _summary_line(rows: List[dict], key: str, what: str) -> str:
    errs = [r[key] for r in rows if r[key] is not None]
    if not errs:
        return ""
    inside = sum(abs(e) <= TOLERANCE for e in errs)
    return (f"{what}: {inside} of {len(errs)} predictions within {TOLERANCE:.0%}, "
            f"largest error {100 * max(abs(e) for e in errs):.0f}%, median |error| "
            f"{100 * sorted(abs(e) for e in errs)[len(errs) // 2]:.0f}%.")


# ---------------------------------------------------------------- the projection's report

# a pipeline's defaults, preferred when a results folder holds ablations too
DEFAULTS = {"distdgl": {"halo_cache": False}, "tma": {"variant": "random"},
            "lamp": {"bits": 8, "prefetch": 1, "fusion": True, "engine": "trainer", "roots": "owners",
                     "grad": "stop"}}


def _pick(runs: List[dict], pipeline: str, like: Optional[dict] = None) -> Optional[dict]:
    """The run a pipeline's projection calibrates on: its defaults, the same dataset, model and
    machines as `like`, then the most compute per CPU budget."""
    cands = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") == pipeline
             and (s.get("time_per_batch_s") or tma_phases(s)) and s.get("batches")]
    if like is not None:
        same = ("dataset", "layers", "fanouts", "hidden", "machines", "trainers")
        cands = [s for s in cands if all(s.get(k) == like.get(k) for k in same)]
    if not cands:
        return None

    def rank(s):
        # then the run whose machines got most of their CPU budget: the least CPU-seconds a
        # batch's compute took (a host shared with other jobs delivers less than the budget)
        # distdgl: the synchronous loop first (its phases part the pull's CPU from its bytes)
        defaults = sum(s.get(k, v) == v for k, v in DEFAULTS.get(pipeline, {}).items())
        compute = (s.get("time_per_batch_s") or tma_phases(s))["compute"]
        return (not _exposed(s), defaults, -compute * (s.get("cpus_per_machine") or 1.0))

    return max(cands, key=rank)


def calibrations(runs: List[dict], sync_every_s: float = 5.0, links=None) -> Dict[str, Calibration]:
    """distdgl, lamp and tma calibrations of one dataset and model for the projection's grid (tma:
    a RandomTMA run's time per batch, else distdgl's compute); `links`: the efficiency of the
    calibrating runs' links (the grid's links are then nominal)."""
    linked = [s for s in runs if bandwidth(s)]
    # a distdgl run with a lamp run alike first (a bench whose largest graph only distdgl finished)
    base = _pick([s for s in linked if _pick(runs, "lamp", like=s)], "distdgl") or _pick(linked, "distdgl")
    if base is None:
        return {}
    out = {"distdgl": calibrate(base, links=links)}
    for name in ("lamp", "tma"):
        s = _pick(runs, name, like=base)
        if s is not None:
            out[name] = calibrate(s, links=links)
    if "tma" in out and out["tma"].sync_every_s is None:
        out["tma"].sync_every_s = sync_every_s
    if "tma" not in out:
        w = base.get("machines") or 2
        params = (base.get("allreduce_bytes_per_batch") or 0) / (2 * (w - 1) / w)
        out["tma"] = tma_from_distdgl(out["distdgl"], params, sync_every_s)
    return out


# the projected ratios: (title, numerator, distdgl's prefetch)
RATIOS = (("lamp/distdgl", "lamp", None), ("lamp/distdgl with a prefetching loader (modelled)", "lamp", 1),
          ("tma/distdgl", "tma", None))


def crossover_rows(num: Calibration, den: Calibration, latency_s: float = LATENCY_S,
                   den_prefetch: Optional[int] = None, gpu: bool = False) -> List[str]:
    """Per speed: the ratio at each table bandwidth, and the bandwidth where it crosses 1. `gpu`:
    the speeds are the model step's alone (MODEL_SPEEDS), everything else at 1x."""
    fine = log_grid(rate("100mbit"), rate("100gbit"), 61)
    rows = []
    for sp in (MODEL_SPEEDS if gpu else SPEEDS):
        speed, model = (1.0, sp) if gpu else (sp, None)
        vals = ratio_grid(num, den, [rate(b) for b in BANDWIDTHS], [speed], latency_s, den_prefetch=den_prefetch,
                          model_speed=model)[0]
        curve = ratio_grid(num, den, fine, [speed], latency_s, den_prefetch=den_prefetch, model_speed=model)[0]
        x = crossing(fine, curve)
        where = fmt_rate(x) if x else ("none (below 1 throughout)" if curve[0] < 1 else "none (above 1 throughout)")
        rows.append(f"| {sp}x{' (model step), 1x (rest)' if gpu else ''} | " + " | ".join(f"{v:.2f}" for v in vals)
                    + f" | {where} |")
    return rows


def _median(values: List[float]) -> float:
    v = sorted(values)
    return (v[len(v) // 2] + v[(len(v) - 1) // 2]) / 2


KINDS = ("bandwidth", "CPU", "bandwidth + CPU", "same link and CPU")


def compact_table(rows: List[dict]) -> List[str]:
    """One line per measured setting: its measured epochs, and per kind of prediction the median
    error with the speed from the budget / delivered, and the verdict on the worst delivered one."""
    by: Dict[str, List[dict]] = {}
    for r in rows:
        by.setdefault(_setting(r["target"]), []).append(r)
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    out = ["| setting | runs | measured epoch s | " + " | ".join(f"from other {k}" if k != KINDS[-1] else f"from the {k}"
                                                      for k in kinds) + " | abs error | |",
           "|---|---|---|" + "---|" * (len(kinds) + 2)]
    for setting, rs in sorted(by.items()):
        targets = {id(r["target"]): r["measured"] for r in rs}
        meas = sorted(targets.values())
        cells = []
        for k in kinds:
            ks = [r for r in rs if r["kind"] == k]
            if not ks:
                cells.append("-")
                continue
            budget = _median([r["error"] for r in ks])
            got = [r["error_delivered"] for r in ks if r["error_delivered"] is not None]
            cells.append(f"{100 * budget:+.0f}% / " + (f"{100 * _median(got):+.0f}%" if got else "-"))
        errs = [abs(r["error_delivered"] if r["error_delivered"] is not None else r["error"]) for r in rs]
        spread = f"{meas[0]:.2f}" if len(meas) == 1 else f"{_median(meas):.2f} ({meas[0]:.2f}-{meas[-1]:.2f})"
        out.append(f"| {setting} | {len(meas)} | {spread} | " + " | ".join(cells)
                   + f" | {100 * _median(errs):.0f}% ({100 * max(errs):.0f}%) | {verdict(_median(errs))} |")
    return out + ["", "Each cell: the median error of the predictions of that kind, with the speed from the CPU "
                  "budget / the speed delivered; |error|: the median (largest) over all the setting's "
                  "predictions with the speed delivered, and the verdict on that median.", ""]


def projection_section(runs: List[dict], out: Optional[Path] = None, detail: bool = False,
                       links=None) -> List[str]:
    """The report's section: measured against predicted epochs, then the projected ratios and
    their crossovers (and projection.png in `out` where matplotlib is there); `detail`: every
    prediction, one line each; `links`: the netns links' measured efficiency
    (benchmarks.link_probe.Efficiencies; None: nominal rates)."""
    rows = checks(runs, links)
    cals = calibrations(runs, links=links)
    if not rows and not ("distdgl" in cals and "lamp" in cals):
        return []
    lines = ["## Projection to real clusters", "",
             "benchmarks.projection (docs/benchmarks.md): per-batch CPU, bytes and round trips from one "
             "measured run predict another run's epoch. Each row predicts the target from one other run "
             "(across: CPU = same link, other CPU budget; bandwidth = same budget, other link); a "
             "prefetching distdgl run from the synchronous runs of its setting, its loader modelled. "
             "Measured = mean epoch (training only) of the target. The compute speed of the target is its "
             "CPU budget, or the speed it got: its compute phase against the calibration's (a host shared "
             "with other jobs may deliver less than the budget; not where the loops differ); the verdict is "
             "on the latter. Bytes take "
             + ("their link's rate times its measured efficiency (bench=network) on the netns links, the "
                "nominal rate on the grid's." if links else "their link's nominal rate.") , ""]
    if rows:
        lines += compact_table(rows)
        if detail:
            lines += ["| target | calibrated on | across | measured s | predicted s (speed: CPU budget) | error | "
                      "predicted s (speed: delivered) | error | |", "|---|---|---|---|---|---|---|---|---|"]
            for r in rows:
                got = r["predicted_delivered"]
                lines.append(f"| {_setting(r['target'])} ({r['target'].get('_rel')}) | {_setting(r['source'])} "
                             f"({r['source'].get('_rel')}) | {r['kind']} | {r['measured']:.2f} | {r['predicted']:.2f} | "
                             f"{100 * r['error']:+.0f}% | "
                             + (f"{got:.2f} | {100 * r['error_delivered']:+.0f}% | {verdict(r['error_delivered'])} |"
                                if got else f"- | - | {verdict(r['error'])} |"))
            lines.append("")
        lines += [_summary_line(rows, "error", "Speed from the CPU budget"),
                  _summary_line(rows, "error_delivered", "Speed delivered (the target's compute phase)"), ""]
    if "distdgl" in cals and "lamp" in cals:
        d = cals["distdgl"]
        lines += [f"Projected epoch-time ratios (below 1: faster than distdgl), latency {1e3 * LATENCY_S:.1f} ms a "
                  f"round trip, speed 1x = one core of this host per machine, distdgl "
                  f"{_loop_words(d)}; "
                  f"calibrated on {d.source} and {cals['lamp'].source}"
                  + (f" and {cals['tma'].source}" if "tma" in cals else "") + ".", ""]
        head = "| speed | " + " | ".join(BANDWIDTHS) + " | ratio = 1 at |"
        sep = "|---|" + "---|" * (len(BANDWIDTHS) + 1)
        for title, name, pre in RATIOS:
            if name in cals and not (pre and d.exposed):
                lines += [f"{title}:", "", head, sep] + crossover_rows(cals[name], d, den_prefetch=pre) + [""]
        lines += ["With the model's step on a GPU and the rest on one core a machine (bench=compute measures "
                  "the GPU's factor on these batches; sampling, the loader, LAMP's owners and histories stay "
                  "on the CPU), LAMP against distdgl:", "",
                  head.replace("| speed |", "| speed (model step; rest) |"), sep]
        lines += crossover_rows(cals["lamp"], d, den_prefetch=None if d.exposed else 1, gpu=True) + [""]
        if out is not None:
            png = plot_projection(cals, Path(out) / "projection.png")
            if png:
                lines += [f"![projection]({png.name})", ""]
    return lines


def _loop_words(d: Calibration) -> str:
    if not d.exposed:
        return "synchronous, as measured (and a modelled prefetching loader on cores of its own)"
    return ("with its prefetching loader, calibrated on the loader thread's times" if d.prefetch
            else "with its prefetching loader, its phases as measured")


def plot_projection(cals: Dict[str, Calibration], path: Path) -> Optional[Path]:
    """Heat maps of lamp/distdgl and tma/distdgl over bandwidth and speed, ratio 1 drawn."""
    from .report.mpl import pyplot

    plt = pyplot()
    if plt is None or "distdgl" not in cals:
        return None
    panels = [r for r in RATIOS if r[1] in cals and not (r[2] and cals["distdgl"].exposed)]
    bws = log_grid(rate("100mbit"), rate("100gbit"), 61)
    sps = log_grid(1, 50, 41)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.4), squeeze=False)
    for ax, (title, name, pre) in zip(axes[0], panels):
        z = ratio_grid(cals[name], cals["distdgl"], bws, sps, den_prefetch=pre)
        bits = [8 * b for b in bws]
        mesh = ax.pcolormesh(bits, sps, [[math.log2(v) for v in row] for row in z], cmap="RdBu_r",
                             vmin=-3, vmax=3, shading="auto")
        ax.contour(bits, sps, z, levels=[1.0], colors="k", linewidths=1.5)
        ax.contour(bits, sps, z, levels=[0.25, 0.5, 2.0], colors="k", linewidths=0.5, linestyles="dotted")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link bandwidth per machine (bit/s)")
        ax.set_ylabel("compute speed (1x = one core of this host)")
        ax.set_title(f"{title}\nepoch-time ratio (solid: 1; dotted: 1/4, 1/2, 2)", fontsize=9)
        cb = fig.colorbar(mesh, ax=ax)
        cb.set_label("log2 ratio (below 0: faster than distdgl)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(results: Path) -> Path:
    from .link_probe import Efficiencies
    from .report.summaries import collect

    results = Path(results)
    runs = collect(results)
    lines = projection_section(runs, results, detail=True, links=Efficiencies.committed())
    if not lines:
        raise SystemExit(f"benchmarks.projection: no distdgl or lamp run with time_per_batch_s under {results}; "
                         "run `python -m benchmarks bench=projection out=DIR` first")
    path = results / "projection.md"
    path.write_text("# degnn: projection to real clusters\n\n" + "\n".join(lines[2:]) + "\n")
    return path


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m benchmarks.projection <results folder>   writes projection.md (+ .png) there",
              file=sys.stderr)
        return 2
    if not Path(argv[0]).is_dir():
        print(f"benchmarks.projection: {argv[0]} is not a folder; give a bench results folder", file=sys.stderr)
        return 2
    print(write(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
