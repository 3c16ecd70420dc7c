"""Where a batch's time goes: milliseconds per batch by phase (summary `time_per_batch_s`) for
every run that has them. Its figure is plots.plot_breakdown."""
from __future__ import annotations

from typing import List

from ..records import bandwidth, repeat_of
from .runs import fmt


PHASES = ("sampling", "owner_wait", "compute", "allreduce", "history", "other")


def _short(s: dict) -> str:
    """A run's name in the breakdown: suite, dataset, and the lamp knobs that set it apart."""
    text = f"{s['_rel'].split('/')[0]} {s.get('dataset')}"
    if repeat_of(s["_rel"]) or s["_rel"].split("/")[1:2] == ["r0"]:
        text += f" (repeat {repeat_of(s['_rel']) + 1})"
    if s.get("pipeline") == "lamp":
        text += f" b{s.get('bits')}"
        for key, tag in (("prefetch", "k"), ("fusion", "fusion=")):
            if key in s:
                text += f" {tag}{int(s[key]) if isinstance(s[key], bool) else s[key]}"
        if "sync_budget" in s and s["sync_budget"] is None:
            text += " sync=all"
        if s.get("engine", "server") != "server":
            text += f" engine={s['engine']}"
        if s.get("roots", "owners") != "owners":
            text += f" roots={s['roots']}"
    elif s.get("halo_cache"):
        text += " halo cache"
    if bandwidth(s):
        text += f" {bandwidth(s)}"
    return text


def breakdown_section(runs: List[dict]) -> List[str]:
    """Per-batch time by phase (summary `time_per_batch_s`) for every run that has it."""
    rows = [s for s in runs if s.get("status") == "ok" and s.get("time_per_batch_s")]
    if not rows:
        return []
    quota = int(any(s.get("cpu_throttled_share") is not None for s in rows))  # a column where measured
    out = ["## Where a batch's time goes", "",
           "Milliseconds per batch and trainer, mean over trainers (degnn.metrics.PhaseTimer): sampling "
           "= building the computation graph (distdgl: DGL's sampler and its RPCs), owner wait = blocked "
           "on other machines' data (distdgl: the feature pull; lamp: the owners' answers), compute = "
           "forward, backward and step without the all-reduce, history = lamp's history pushes, weight "
           "shipping and halo sync, other = the rest of the epoch."
           + (" CPU-bound = share of the run's 100 ms CFS periods (set-up and evaluation included) in "
              "which a machine used up its CPU quota (summary `cpu_throttled_share`, all machines): "
              "near 100%, the machines had no idle CPU for an overlap to use." if quota else ""), "",
           "| run | " + " | ".join(PHASES) + " | total |" + (" CPU-bound |" if quota else ""),
           "|---|" + "---|" * (len(PHASES) + 1 + quota)]
    for s in sorted(rows, key=lambda s: (s.get("dataset"), s.get("layers"), s["_rel"])):
        t = s["time_per_batch_s"]
        share = s.get("cpu_throttled_share")
        out.append(f"| {_short(s)} | " + " | ".join(fmt(1000 * t.get(p, 0.0), ".1f") for p in PHASES)
                   + f" | {1000 * sum(t.values()):.1f} |"
                   + ((f" {100 * share:.0f}% |" if share is not None else " – |") if quota else ""))
    return out + [""]
