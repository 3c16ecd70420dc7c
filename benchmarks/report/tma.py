"""bench=tma: TMA against the synchronous baseline under one wall-time budget, per dataset,
machines, bandwidth, layers and model; time to a target over repeats; the runs with an injected
failure beside the same method's run without one."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..records import bandwidth
from ..spread import cell, median, paired, paired_cell, ratio_cell, spread
from .plots import plot_tma
from .runs import edges_kept, failure, fmt, mb, method, steps_per_s, time_from_launch, time_to, time_to_target
from .summaries import label_tv


def tma_baseline(group: List[dict]) -> Tuple[List[dict], Optional[float]]:
    """A TMA setting's distdgl runs without a failure and the target: their best validation (the
    median over repeats) minus one point; None without such runs."""
    bases = [s for s in group if s["pipeline"] == "distdgl" and not failure(s) and s.get("best_val") is not None]
    return bases, (median(s["best_val"] for s in bases) - 0.01 if bases else None)


def tma_settings(runs: List[dict]) -> List[tuple]:
    """(setting key, its runs, the rows compared: every run without a failure, and a failure run
    whose method has no run without one) for each setting with a TMA run."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("tma", "distdgl")]
    out = []
    for key, group in tma_groups(ok):
        if not any(s["pipeline"] == "tma" for s in group):
            continue  # distdgl runs of another bench in the same results folder (bench=quick)
        rows = [s for s in group if not failure(s)
                or not any(method(r) == method(s) and not failure(r) for r in group)]
        out.append((key, group, sorted(rows, key=lambda s: ORDER.get(method(s), 9))))
    return out


ORDER = {"distdgl": 0, "tma/random": 1, "tma/supernode": 2, "tma/psgd-pa": 3, "tma/llcg": 4}


def setting_heading(key: tuple) -> str:
    ds, machines, bw, layers, model = key
    return f"{ds}, {machines} machines, {bw or 'unlimited'} links, {layers} layers, {model}"


def tma_section(runs: List[dict], results: Path, plots: bool = True) -> List[str]:
    """TMA against the synchronous baseline under one wall-time budget (bench=tma), each method's
    time to the target over repeats; `plots`: the validation curves as PNGs into `results`. Every
    run's own row: `tma_runs_section`."""
    settings = tma_settings(runs)
    if not settings:
        return []
    out = ["## TMA against the synchronous baseline (same wall-time budget)", "",
           "Training time excludes evaluation for every method (the paper's clock). Target = the "
           "distdgl runs' best validation (the median over repeats) − 1 point; speed-up = distdgl's "
           "time to the target (the median) / the method's, over repeats, "
           "also from launch (the run's set-up added: docs/benchmarks.md, \"Time from launch\").", ""]
    fails = []
    for key, group, rows in settings:
        ds, _, bw, _, model = key
        bases, target = tma_baseline(group)
        base = bases[0] if bases else None
        t_base = median(t for t in (time_to_target(s, target) for s in bases) if t is not None)
        out += [f"### {setting_heading(key)}", "",
                f"Target validation: {fmt(target)}" + (f" (distdgl reached it at {t_base:.1f}s)" if t_base else ""),
                ""]
        out += tma_repeats(rows, bases, target)
        for s in group:
            if failure(s):
                ref = next((r for r in group if method(r) == method(s) and not failure(r)), None)
                drop = (ref["test"] - s["test"]) * 100 if ref and ref.get("test") is not None else None
                fails.append("| " + " | ".join([
                    f"{ds} {bw or ''}", method(s), failure(s), str(s.get("trainers_alive", "–")),
                    fmt(s.get("test")), fmt(ref.get("test") if ref else None), fmt(drop, "+.2f"),
                    str(s.get("status")), f"`{s['_rel']}`"]) + " |")
        png = plots and plot_tma(group, base, target, results / f"tma-curves-{ds}-{bw or 'unlimited'}-{model}.png")
        if png:
            out += [f"![{ds} {bw}]({png.name})", ""]
    if fails:
        out += ["### Failures", "", "Test at the best validation point; drop = the same method's run without "
                "the failure minus this one (points).", "",
                "| dataset | method | failure | trainers alive | test | test without failure | drop (points) | "
                "status | run |", "|" + "---|" * 9, *fails, ""]
    return out


def tma_runs_section(runs: List[dict]) -> List[str]:
    """Every run of each TMA setting (bench=tma's comparison, `tma_section`): partition, edges kept,
    accuracy, time to the target, steps, rounds and bytes."""
    settings = tma_settings(runs)
    if not settings:
        return []
    out = ["## TMA: every run (same wall-time budget)", "",
           "One row per run of each setting of \"TMA against the synchronous baseline\" (its target and "
           "speed-up: distdgl's median time to the target over the run's). Wire MB: bytes every machine's "
           "link sent over the whole run (netns veth), and "
           "during local training only (TMA: between rounds); averaging MB: parameters up and means "
           "down, counted by degnn. Edges kept: the share of the graph's edges the method trains on "
           "(TMA's induced subgraphs drop every cut edge). Label TV: the partitions' mean label "
           "total-variation distance to the whole graph.", ""]
    for key, group, rows in settings:
        bases, target = tma_baseline(group)
        t_base = median(t for t in (time_to_target(s, target) for s in bases) if t is not None)
        out += [f"### {setting_heading(key)}", "",
                "| method | partition | edges kept | label TV | best val | test (best val) | test (final) | "
                "time to target (s) | speed-up | steps/s per trainer | rounds / epochs | train time (s) | "
                "wire MB | wire MB in training | averaging MB | run |", "|" + "---|" * 16]
        for s in rows:
            t = time_to(s["_curve"], target) if target is not None else None
            speed = f"{t_base / t:.2f}x" if (t and t_base) else "–"
            part = s.get("partition_method") or (s.get("_config", {}).get("partition") or {}).get("method")
            out.append("| " + " | ".join([
                method(s) + (f" ({failure(s)})" if failure(s) else ""), str(part or "–"), fmt(edges_kept(s), ".3f"), fmt(label_tv(s), ".3f"), fmt(s.get("best_val")),
                fmt(s.get("test")),
                fmt(s.get("test_final")), fmt(t, ".1f"), speed, fmt(steps_per_s(s), ".1f"),
                str(s.get("rounds", s.get("epochs", "–"))), fmt(s.get("train_time_s"), ".1f"),
                mb(s.get("net_bytes_total")), mb(s.get("net_bytes_train")), mb(s.get("averaging_bytes")),
                f"`{s['_rel']}`"]) + " |")
        out.append("")
    return out


def by_method(rows: List[dict]) -> Dict[str, List[dict]]:
    """A setting's rows by method (a failure run under its own name), in the rows' order."""
    by: Dict[str, List[dict]] = defaultdict(list)
    for s in rows:
        by[method(s) + (f" ({failure(s)})" if failure(s) else "")].append(s)
    return by


def tma_repeats(rows: List[dict], bases: List[dict], target: Optional[float]) -> List[str]:
    """Each method's time to the target over its repeats (median and min–max), from the start of
    training and from launch, and its speed-up over distdgl's median (ranges overlapping: said);
    its test metric at the best validation point."""
    if target is None:
        return []
    out = ["Over repeats (median, min–max where they differ); from launch also within each repeat that "
           "both distdgl and the method reached the target in (the ratios' median, min–max and spread):", "",
           "| method | runs reaching the target | time to target (s) | speed-up | from launch (s) | "
           "speed-up from launch | per repeat | test (best val) |", "|---|---|---|---|---|---|---|---|"]
    for name, group in by_method(rows).items():
        cols = []
        for clock in (time_to_target, time_from_launch):
            t, tb = spread(clock(s, target) for s in group), spread(clock(s, target) for s in bases)
            cols += [cell(t, ".1f"), ratio_cell(tb, t, bold=False)]
        cols.append(paired_cell(paired(bases, group, lambda r: time_from_launch(r, target))))
        reached = sum(time_to_target(s, target) is not None for s in group)
        test = cell(spread(s.get("test") for s in group), ".4f")
        out.append(f"| {name} | {reached} / {len(group)} | " + " | ".join(cols) + f" | {test} |")
    return out + [""]


def tma_groups(ok: List[dict]) -> List[tuple]:
    """(dataset, machines, bandwidth, layers, model) -> the runs compared under one budget."""
    groups: Dict[tuple, List[dict]] = defaultdict(list)
    for s in ok:
        groups[(s.get("dataset"), s.get("machines"), bandwidth(s), s.get("layers"), s.get("model"))].append(s)
    return sorted(groups.items(), key=lambda kv: str(kv[0]))
