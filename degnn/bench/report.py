"""The benchmark report: every run's summary.json under a results folder -> report.md + PNG plots,
and runs.csv (one row per run, a column per summary key).

`python -m degnn.bench.report <results folder>` rewrites the report of an earlier `make bench`.
The plots need matplotlib (`pip install 'degnn[bench]'`); without it the report says so in one line
and has every table.

Every figure draws a method in the same colour (METHOD_COLOURS) and says its dataset, machines and
bandwidth in its title.
"""
from __future__ import annotations

import csv
import json
import sys
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from degnn.metrics import read_curve

from .projection import projection_section
from .records import bandwidth, repeat_of
from .scale import plot_growth, scale_section
from .spread import Spread, cell, median, ratio_cell, spread

PLOT_HINT = "no plots: matplotlib is not installed (pip install 'degnn[bench]'); every table is here"

_PYPLOT: list = []


def _pyplot():
    """matplotlib's pyplot on the Agg backend (no screen on the benchmark machines), or None where
    matplotlib is not installed."""
    if not _PYPLOT:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            plt = None
        _PYPLOT.append(plt)
    return _PYPLOT[0]


def plot_note() -> Optional[str]:
    """One line saying how to get the plots, where matplotlib is missing; None where it is there."""
    return None if _pyplot() is not None else PLOT_HINT


def collect(results: Path) -> List[dict]:
    runs = []
    for path in sorted(results.rglob("summary.json")):
        s = json.loads(path.read_text())
        s["_dir"] = path.parent
        s["_rel"] = str(path.parent.relative_to(results))
        s["_curve"] = read_curve(path.parent)
        s["_config"] = run_config(s)
        runs.append(s)
    for path in sorted(results.rglob("launch.log")):  # runs that died before writing a summary
        if not (path.parent / "summary.json").exists():
            runs.append({"_dir": path.parent, "_rel": str(path.parent.relative_to(results)), "status": "failed", "pipeline": "?", "dataset": "?", "_curve": [], "_config": {}})
    return runs


def run_config(s: dict) -> dict:
    """The run's own config.yaml (written by its trainers), {} when there is none."""
    path = Path(s["_dir"]) / "config.yaml"
    if not path.is_file():
        return {}
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(path))
    except Exception:  # noqa: BLE001 - a report must not die on one odd run
        return {}


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


def table(runs: List[dict]) -> List[str]:
    lines = ["| pipeline | dataset | model | layers | machines | status | best val | test | epochs | "
             "train time (s) | epoch time (s) | net KB/batch | app KB/batch | all-reduce KB/batch | "
             "peak RSS trainer (MB) | run |",
             "|" + "---|" * 16]
    for s in runs:
        lines.append("| " + " | ".join([
            method(s) + (f" ({failure(s)})" if failure(s) else ""), str(s.get("dataset")),
            str(s.get("model", "–")), str(s.get("layers", "–")),
            str(s.get("machines", "–")) + (f" × {bandwidth(s)}" if bandwidth(s) else ""), str(s.get("status")), fmt(s.get("best_val")), fmt(s.get("test")),
            str(s.get("epochs", "–")), fmt(s.get("train_time_s"), ".1f"), fmt(s.get("epoch_time_s"), ".2f"),
            kb(s.get("net_bytes_per_batch")), kb(s.get("app_bytes_per_batch")),
            kb(s.get("allreduce_bytes_per_batch")), fmt(s.get("peak_rss_mb_trainer"), ".0f"),
            f"`{s['_rel']}`",
        ]) + " |")
    return lines


def comparisons(runs: List[dict]) -> List[str]:
    """The quality bars: accuracy against the single-process reference, bytes 2 -> 3 layers."""
    ok = [s for s in runs if s.get("status") == "ok"]
    # one run per group: variants, bandwidths and failures must not overwrite each other
    by_key: Dict[tuple, dict] = {group_key(s): s for s in ok}
    refs = {(s["dataset"], s.get("layers")): s for s in ok if s.get("pipeline") == "single"}
    out = []
    acc_rows = []
    for key, s in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        pipe, ds, layers = s["pipeline"], s["dataset"], s.get("layers")
        ref = refs.get((ds, layers))
        if pipe == "single" or ref is None or failure(s):
            continue
        if pipe == "tma":  # a fixed time budget, not trained to convergence: its own table
            continue
        pipe = method(s) + (f" {bandwidth(s)}" if bandwidth(s) else "")
        diff = (s["test"] - ref["test"]) * 100
        acc_rows.append(f"| {pipe} | {ds} | {layers} | {fmt(s['test'])} | {fmt(ref['test'])} | {diff:+.2f} | "
                        f"{s['epochs']} / {ref['epochs']} | {fmt(s['train_time_s'], '.0f')} / "
                        f"{fmt(ref['train_time_s'], '.0f')} |")
    if acc_rows:
        out += ["## Accuracy against one process on the whole graph", "",
                "Both trained until validation stopped improving; test at the best validation point, "
                "full-neighbour inference.", "",
                "| pipeline | dataset | layers | test | single-process test | difference (points) | "
                "epochs (dist / single) | train time s (dist / single) |", "|---|---|---|---|---|---|---|---|",
                *acc_rows, ""]
    growth = []
    for key, s in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        pipe, ds, layers = s["pipeline"], s["dataset"], s.get("layers")
        deeper = by_key.get(key[:3] + ((layers or 0) + 1,) + key[4:])
        if pipe == "single" or deeper is None:
            continue
        pipe = method(s) + (f" {bandwidth(s)}" if bandwidth(s) else "")
        for key in ("net_bytes_per_batch", "app_bytes_per_batch"):
            a, b = s.get(key), deeper.get(key)
            if a and b:
                growth.append(f"| {pipe} | {ds} | {key} | {layers} -> {layers + 1} | {kb(a)} | {kb(b)} | "
                              f"{b / a:.2f}x |")
    if growth:
        out += ["## Bytes per batch as layers grow", "",
                "| pipeline | dataset | counter | layers | KB/batch before | KB/batch after | ratio |",
                "|---|---|---|---|---|---|---|", *growth, ""]
    return out


def median_epoch_s(s: dict) -> Optional[float]:
    """Median epoch time: robust to the first epoch's warm-up and to a noisy neighbour."""
    times = s.get("epoch_times_s") or []
    return median(times) if times else s.get("epoch_time_s")


def parity(runs: List[dict]) -> List[str]:
    """bench=parity: distdgl beside the plain DGL trainer for each dataset and layer count (same
    partitions, seeds, fan-outs, batches and epochs). The suites run the pair in both orders (of two
    clusters started back to back the second tends to run faster), so each side's epoch times are
    pooled over its runs in either order before taking the median."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("distdgl", "plain-dgl")
          and s["_rel"].startswith("parity-")]
    by_key: Dict[tuple, Dict[str, List[dict]]] = {}
    for s in ok:
        by_key.setdefault((s["dataset"], s.get("layers")), {}).setdefault(s["pipeline"], []).append(s)
    rows = []
    for (ds, layers), sides in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        mine, ref = sides.get("distdgl", []), sides.get("plain-dgl", [])
        if not mine or not ref:
            continue

        def epoch_s(group):
            pooled = [t for s in group for t in (s.get("epoch_times_s") or [])]
            return median(pooled) if pooled else median([median_epoch_s(s) for s in group])

        def mean_of(group, key):
            vals = [s[key] for s in group if s.get(key) is not None]
            return sum(vals) / len(vals) if vals else None

        t, t_ref = epoch_s(mine), epoch_s(ref)
        b, b_ref = mean_of(mine, "net_bytes_per_batch"), mean_of(ref, "net_bytes_per_batch")
        acc, acc_ref = mean_of(mine, "test_final"), mean_of(ref, "test_final")
        diff = (acc - acc_ref) * 100 if acc is not None and acc_ref is not None else float("nan")
        rows.append(
            f"| {ds} | {layers} | {mine[0].get('fanouts', '–')} | {mine[0].get('epochs')} | "
            f"{len(mine)} / {len(ref)} | {t:.2f} / {t_ref:.2f} | **{t / t_ref:.2f}x** | {kb(b)} / {kb(b_ref)} | "
            f"{(b / b_ref if b and b_ref else float('nan')):.3f}x | {fmt(acc)} / {fmt(acc_ref)} | {diff:+.2f} |")
    if not rows:
        return []
    return ["## Parity with a plain DGL trainer", "",
            "`pipeline=distdgl` against `degnn/bench/plain_dgl.py` (DistGraph, DistNodeDataLoader, "
            "dgl.nn.SAGEConv, DDP) on the same cluster and partitions, run one after the other in both "
            "orders. Epoch time is the median over all epochs of all runs of a side; bytes are on the "
            "wire during training; test accuracy of the final model after the same epochs (mean over "
            "runs). Ratios are distdgl / plain (bars: time <= 1.10x, bytes within 5%).", "",
            "| dataset | layers | fan-outs | epochs | runs (distdgl / plain) | epoch s (distdgl / plain) | "
            "time ratio | net KB/batch (distdgl / plain) | bytes ratio | test (distdgl / plain) | "
            "difference (points) |",
            "|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


def prefetch_pairs(runs: List[dict]) -> List[str]:
    """bench=parity's prefetch-* suites: distdgl with pipeline.prefetch=1 against prefetch=0 for
    each dataset, layer count and bandwidth, the repeats of both orders pooled (epoch times of all
    runs of a side: median and min-max)."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") == "distdgl"
          and s["_rel"].startswith("prefetch-")]
    by_key: Dict[tuple, Dict[int, List[dict]]] = {}
    for s in ok:
        key = (s["dataset"], s.get("layers") or 0, bandwidth(s) or "unlimited")
        by_key.setdefault(key, {}).setdefault(int(s.get("prefetch") or 0), []).append(s)
    rows = []
    for (ds, layers, bw), sides in sorted(by_key.items()):
        on, off = sides.get(1, []), sides.get(0, [])
        if not on or not off:
            continue
        times = [sorted(t for s in g for t in (s.get("epoch_times_s") or [])) for g in (on, off)]
        if not times[0] or not times[1]:
            continue
        t1, t0 = (median(t) for t in times)

        def mean_of(group, key):
            vals = [s[key] for s in group if s.get(key) is not None]
            return sum(vals) / len(vals) if vals else None

        def wait(group):
            per = [s.get("time_per_batch_s") or {} for s in group]
            return sum(p.get("sampling", 0) + p.get("owner_wait", 0) for p in per) / len(per)

        overlap = times[0][0] <= times[1][-1] and times[1][0] <= times[0][-1]
        verdict = ("yes" if t1 <= t0 else "no") + (" (ranges overlap)" if overlap else "")
        rows.append(f"| {ds} | {layers} | {bw} | {len(on)} / {len(off)} | {t1:.2f} ({times[0][0]:.2f}-"
                    f"{times[0][-1]:.2f}) / {t0:.2f} ({times[1][0]:.2f}-{times[1][-1]:.2f}) | **{t1 / t0:.2f}x** | "
                    f"{kb(mean_of(on, 'app_bytes_per_batch'))} / {kb(mean_of(off, 'app_bytes_per_batch'))} | "
                    f"{wait(on) * 1000:.0f} / {wait(off) * 1000:.0f} | {verdict} |")
    if not rows:
        return []
    return ["## distdgl: prefetch against the synchronous loop", "",
            "`pipeline=distdgl` with `pipeline.prefetch=1` (the default: a background thread samples "
            "and pulls the next batch while the trainer trains) against `pipeline.prefetch=0`, repeated "
            "in both orders. Epoch time: median (min-max) over all epochs of all runs of a side; "
            "application bytes per batch (the same work either way); wait = the main thread's sampling "
            "and feature-pull wait per batch. Bar: prefetch 1 at least as fast.", "",
            "| dataset | layers | bandwidth | runs (1 / 0) | epoch s, prefetch 1 / 0 | time ratio | "
            "app KB/batch (1 / 0) | wait ms/batch (1 / 0) | at least as fast |",
            "|---|---|---|---|---|---|---|---|---|", *rows, ""]


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


def label_tv(s: dict) -> Optional[float]:
    """Mean label total-variation distance of the run's partitions (partitioners' stats.json)."""
    if s.get("label_tv_mean") is not None:
        return s["label_tv_mean"]
    cfg = s.get("_config") or {}
    part, ds = cfg.get("partition"), cfg.get("dataset")
    if not part or not ds:
        return None
    path = Path(str(part.get("root"))) / str(ds.get("name")) / \
        f"{part.get('method')}-k{part.get('num_parts')}-s{part.get('seed')}" / "stats.json"
    try:
        return json.loads(path.read_text()).get("label_tv_mean")
    except (OSError, ValueError):
        return None


def steps_per_s(s: dict) -> Optional[float]:
    """Local steps per second of training, per trainer (mean over trainers)."""
    per = s.get("steps_per_s_per_trainer")
    if per:
        vals = [v for v in per.values() if v]
        return sum(vals) / len(vals) if vals else None
    if s.get("batches") and s.get("train_time_s") and s.get("trainers"):
        return s["batches"] / s["trainers"] / s["train_time_s"]
    return None


def mb(v) -> str:
    return "–" if v is None else f"{v / 1e6:,.2f}"


def tma_section(runs: List[dict], results: Path, plots: bool = True) -> List[str]:
    """TMA against the synchronous baseline under one wall-time budget (bench=tma); `plots`: the
    validation curves as PNGs into `results`."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("tma", "distdgl")]
    if not any(s.get("pipeline") == "tma" for s in ok):
        return []
    out = ["## TMA against the synchronous baseline (same wall-time budget)", "",
           "Training time excludes evaluation for every method (the paper's clock). Target = the "
           "distdgl runs' best validation (the median over repeats) − 1 point; speed-up = distdgl's "
           "time to the target (the median) / the method's; the table under each gives them over repeats, "
           "also from launch (the run's set-up added: docs/benchmarks.md, \"Time from launch\"). Wire MB: bytes every machine's link sent over the whole run (netns veth), and "
           "during local training only (TMA: between rounds); averaging MB: parameters up and means "
           "down, counted by degnn. Edges kept: the share of the graph's edges the method trains on "
           "(TMA's induced subgraphs drop every cut edge). Label TV: the partitions' mean label "
           "total-variation distance to the whole graph.", ""]
    fails = []
    for (ds, machines, bw, layers, model), group in tma_groups(ok):
        if not any(s["pipeline"] == "tma" for s in group):
            continue  # distdgl runs of another bench in the same results folder (bench=quick)
        bases = [s for s in group if s["pipeline"] == "distdgl" and not failure(s) and s.get("best_val") is not None]
        base = bases[0] if bases else None
        target = median(s["best_val"] for s in bases) - 0.01 if bases else None
        t_base = median(t for t in (time_to_target(s, target) for s in bases) if t is not None)
        out += [f"### {ds}, {machines} machines, {bw or 'unlimited'} links, {layers} layers, {model}", "",
                f"Target validation: {fmt(target)}" + (f" (distdgl reached it at {t_base:.1f}s)" if t_base else ""),
                "", "| method | partition | edges kept | label TV | best val | test (best val) | test (final) | "
                "time to target (s) | speed-up | steps/s per trainer | rounds / epochs | train time (s) | "
                "wire MB | wire MB in training | averaging MB | run |", "|" + "---|" * 16]
        order = {"distdgl": 0, "tma/random": 1, "tma/supernode": 2, "tma/psgd-pa": 3, "tma/llcg": 4}
        # a failure run stands here too when its method has no run without one (bench=quick)
        rows = [s for s in group if not failure(s)
                or not any(method(r) == method(s) and not failure(r) for r in group)]
        for s in sorted(rows, key=lambda s: order.get(method(s), 9)):
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


def tma_repeats(rows: List[dict], bases: List[dict], target: Optional[float]) -> List[str]:
    """Each method's time to the target over its repeats (median and min–max), from the start of
    training and from launch, and its speed-up over distdgl's median (ranges overlapping: said)."""
    if target is None:
        return []
    by: Dict[str, List[dict]] = defaultdict(list)
    for s in rows:
        by[method(s) + (f" ({failure(s)})" if failure(s) else "")].append(s)
    out = ["Over repeats (median, min–max where they differ):", "",
           "| method | runs reaching the target | time to target (s) | speed-up | from launch (s) | "
           "speed-up from launch |", "|---|---|---|---|---|---|"]
    for name, group in by.items():
        cols = []
        for clock in (time_to_target, time_from_launch):
            t, tb = spread(clock(s, target) for s in group), spread(clock(s, target) for s in bases)
            cols += [cell(t, ".1f"), ratio_cell(tb, t, bold=False)]
        reached = sum(time_to_target(s, target) is not None for s in group)
        out.append(f"| {name} | {reached} / {len(group)} | " + " | ".join(cols) + " |")
    return out + [""]


def tma_groups(ok: List[dict]) -> List[tuple]:
    """(dataset, machines, bandwidth, layers, model) -> the runs compared under one budget."""
    groups: Dict[tuple, List[dict]] = defaultdict(list)
    for s in ok:
        groups[(s.get("dataset"), s.get("machines"), bandwidth(s), s.get("layers"), s.get("model"))].append(s)
    return sorted(groups.items(), key=lambda kv: str(kv[0]))


def edges_kept(s: dict) -> Optional[float]:
    """Share of the graph's edges the run trains on: TMA's induced subgraphs drop the cut ones."""
    if s.get("pipeline") == "distdgl":
        return 1.0
    return s.get("edges_kept_fraction")


# the TMA paper's Table 1 (ogbl-citation2, test MRR; docs/background.md, "TMA"), in its row order
TABLE1 = [("tma/supernode", "SuperTMA", 0.8375), ("tma/random", "RandomTMA", 0.8328),
          ("tma/psgd-pa", "PSGD-PA", 0.8240), ("distdgl", "distdgl (synchronous; the paper's GGS)", 0.8195),
          ("tma/llcg", "LLCG", 0.8188)]
MODEL_NAMES = {"sage": "GraphSAGE", "gcn": "GCN", "gat": "GAT"}


def link_method(s: dict) -> str:
    """A run's row of the link table: its method, LAMP's by its number of layers."""
    return f"lamp/L{s.get('layers')}" if s.get("pipeline") == "lamp" else method(s)


def link_section(runs: List[dict]) -> List[str]:
    """bench=link: the TMA paper's Table 1 (method x model, test MRR at the best validation MRR) per
    dataset and bandwidth, the paper's ordering checked, and the share of edges each method keeps;
    LAMP's rows (by layers) with their gap to distdgl and their bytes beyond the all-reduce."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("task") == "link" and not failure(s)
          and s.get("pipeline") in ("tma", "distdgl", "lamp")]
    if not ok:
        return []
    out = ["## Link prediction: the TMA paper's Table 1", "",
           "Test MRR (1000 negatives per held-out edge, OGB's Evaluator) at the best validation MRR, "
           "every method under the same training-time budget. The paper's numbers are ogbl-citation2's "
           "(model not stated there). Edges kept: the share of the training graph's edges the method "
           "trains on (cut edges dropped).", ""]
    tables: Dict[tuple, Dict[tuple, dict]] = defaultdict(dict)
    for s in ok:
        tables[(s.get("dataset"), s.get("machines"), bandwidth(s))][(link_method(s), s.get("model"))] = s
    for (ds, machines, bw), cells in sorted(tables.items(), key=lambda kv: str(kv[0])):
        models = sorted({m for _, m in cells}, key=lambda m: list(MODEL_NAMES).index(m) if m in MODEL_NAMES else 9)
        out += [f"### {ds}, {machines} machines, {bw or 'unlimited'} links", "",
                "| method | " + " | ".join(MODEL_NAMES.get(m, str(m)) for m in models) + " | edges kept | paper |",
                "|" + "---|" * (len(models) + 3)]
        lamps = sorted({k for k, _ in cells if k.startswith("lamp/")})
        for key, name, paper in TABLE1 + [(k, f"LAMP (DEGNN), {k[6:]} layers", None) for k in lamps]:
            row = [cells.get((key, m)) for m in models]
            if not any(row):
                continue
            kept = next((edges_kept(r) for r in row if r and edges_kept(r) is not None), None)
            out.append(f"| {name} | " + " | ".join(fmt(r.get("test")) if r else "–" for r in row)
                       + f" | {fmt(kept, '.3f')} | {fmt(paper)} |")
        out.append("")
        for m in models:
            sup, rnd, psgd = (cells.get((k, m)) for k in ("tma/supernode", "tma/random", "tma/psgd-pa"))
            if sup and rnd and psgd:
                a, b, c = sup["test"], rnd["test"], psgd["test"]
                holds = a >= b > c
                kept = " / ".join(fmt(edges_kept(r), ".3f") for r in (sup, rnd, psgd))
                out.append(f"- {MODEL_NAMES.get(m, m)}: SuperTMA ≥ RandomTMA > PSGD-PA "
                           f"{'holds' if holds else 'does not hold'} (test {a:.4f} / {b:.4f} / {c:.4f}; "
                           f"edges kept {kept}).")
            base = cells.get(("distdgl", m))
            best = max((r for r in (sup, rnd) if r), key=lambda r: r["test"], default=None)
            if base and best:
                gap = (best["test"] - base["test"]) * 100
                out.append(f"- {MODEL_NAMES.get(m, m)}: best of RandomTMA/SuperTMA ({method(best)}) against "
                           f"distdgl: {gap:+.2f} points of test MRR (bar, at most 1 point below: "
                           f"{'met' if gap >= -1 else 'not met'}).")
            runs_l = [(k, cells.get((k, m))) for k in lamps if cells.get((k, m))]
            for k, r in runs_l:
                if base:
                    gap = (r["test"] - base["test"]) * 100
                    out.append(f"- {MODEL_NAMES.get(m, m)}: LAMP at {k[6:]} layers against distdgl "
                               f"({base.get('layers')} layers): {gap:+.2f} points of test MRR.")
            beyond = {k: _beyond_allreduce(r) for k, r in runs_l}
            if beyond.get("lamp/L2") and beyond.get("lamp/L3") is not None:
                ratio = beyond["lamp/L3"] / beyond["lamp/L2"]
                out.append(f"- {MODEL_NAMES.get(m, m)}: LAMP's wire bytes per batch beyond the all-reduce, 3 layers "
                           f"against 2: {ratio:.2f}x (bar, at most 1.5x: {'met' if ratio <= 1.5 else 'not met'}).")
        out.append("")
    return out


def plot_tma(group: List[dict], base: Optional[dict], target: Optional[float], path: Path) -> Optional[Path]:
    """Validation against training time, every method of one dataset and bandwidth (failures dashed)."""
    curves = [s for s in group if s["_curve"]]
    plt = _pyplot()
    if not curves or plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in sorted(curves, key=label):
        pts = [(r["train_time_s"], r["val"]) for r in s["_curve"] if r.get("val") is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", markersize=3, linestyle="--" if failure(s) else "-",
                    color=colour(s), label=method_name(s) + (f" ({failure(s)})" if failure(s) else ""))
    if target is not None:
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":", label="distdgl best − 1 pt")
    s0 = group[0]
    ax.set_title(fig_title(group, f"validation against training time, {s0.get('model')}"), fontsize=9)
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel(f"validation {s0.get('metric', 'acc')}")
    return _finish(fig, ax, path)


def _finish(fig, ax, path: Path) -> Path:
    """Grid, legend, save, close: the end of every one-axis line plot here."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    """Lay out, write the PNG, free the figure: the end of every plot here."""
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return path


# one colour per method in every figure (matplotlib's tab10); a method not named here gets one of
# the spare colours, always the same for the same name
METHOD_COLOURS = {"distdgl": "#1f77b4", "lamp": "#ff7f0e", "tma/random": "#2ca02c",
                  "tma/supernode": "#d62728", "tma/psgd-pa": "#9467bd", "tma/llcg": "#8c564b",
                  "single": "#7f7f7f", "plain-dgl": "#17becf"}
_SPARE_COLOURS = ("#e377c2", "#bcbd22", "#393b79", "#637939", "#843c39")
METHOD_NAMES = {"tma/random": "RandomTMA", "tma/supernode": "SuperTMA", "tma/psgd-pa": "PSGD-PA",
                "tma/llcg": "LLCG", "single": "one process", "plain-dgl": "plain DGL"}


def colour(s: dict) -> str:
    name = method(s)
    return METHOD_COLOURS.get(name) or _SPARE_COLOURS[zlib.crc32(name.encode()) % len(_SPARE_COLOURS)]


def method_name(s: dict) -> str:
    return METHOD_NAMES.get(method(s), method(s))


def _joined(values) -> str:
    return " / ".join(sorted({str(v) for v in values}))


def fig_title(runs: List[dict], what: str, settings: str = "") -> str:
    """A figure's title: what it shows, then the dataset, machines and bandwidth of its runs (and
    the settings its runs share, from labels())."""
    layers = {s.get("layers") for s in runs}
    text = (f"{what}\n{_joined(s.get('dataset') for s in runs)}, "
            f"{_joined(s.get('machines') for s in runs)} machines, "
            f"{_joined(bandwidth(s) or 'unlimited' for s in runs)} links"
            + (f", {layers.pop()} layers" if len(layers) == 1 and None not in layers else ""))
    return text + (f"\n{settings}" if settings else "")


def _facets(s: dict) -> Dict[str, str]:
    """What tells a run apart from the others of a figure, each in words: where it ran, then the
    method's own settings."""
    f = {"dataset": str(s.get("dataset")), "layers": f"{s.get('layers')} layers",
         "machines": f"{s.get('machines')} machines", "bandwidth": bandwidth(s) or "unlimited"}
    if s.get("pipeline") == "lamp":
        if s.get("bits") is not None:
            f["bits"] = f"{s['bits']}-bit"
        if "prefetch" in s:
            f["prefetch"] = f"prefetch {s['prefetch']}" if s["prefetch"] else "synchronous"
        if "fusion" in s:
            f["fusion"] = "fusion" if s["fusion"] else "no fusion"
        if "sync_budget" in s:
            f["sync"] = "every halo row synced" if s["sync_budget"] is None else f"halo budget {s['sync_budget']:g}"
        if "grad" in s:
            f["grad"] = f"{s['grad']} gradients"
        if "engine" in s:
            f["engine"] = f"owners on the {s['engine']}s"
    if failure(s):
        f["failure"] = failure(s)
    return f


WHERE = ("dataset", "layers", "machines", "bandwidth")
SETTINGS = ("bits", "prefetch", "fusion", "sync", "grad", "engine", "failure")  # _facets' own, in order


def labels(runs: List[dict]) -> Tuple[List[str], str]:
    """A readable name per run, and the settings the names leave out. A name is the method, where
    it ran when that differs between the runs, and those of the method's settings that differ from
    the most common one among the runs having that setting; the most common ones are the second
    value ("lamp unless named: 8-bit, prefetch 1")."""
    facets = [_facets(s) for s in runs]
    varies = {k for k in WHERE if len({f[k] for f in facets}) > 1}
    usual: Dict[str, Dict[str, str]] = defaultdict(dict)  # method -> setting -> its most common value
    for name in {method_name(s) for s in runs}:
        mine = [f for s, f in zip(runs, facets) if method_name(s) == name]
        for k in {k for f in mine for k in f if k not in WHERE and k != "failure"}:
            values = [f[k] for f in mine if k in f]
            usual[name][k] = max(sorted(set(values)), key=values.count)
    out = []
    for s, f in zip(runs, facets):
        where = ", ".join(f[k] for k in WHERE if k in varies)
        own = [v for k, v in f.items() if k not in WHERE and usual[method_name(s)].get(k) != v]
        text = ", ".join([method_name(s), *own])
        out.append(f"{where}: {text}" if where else text)
    shared = "; ".join(f"{name} unless named: " + ", ".join(u[k] for k in sorted(u, key=SETTINGS.index))
                       for name, u in sorted(usual.items()) if u)
    return out, shared


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


LAMP_KNOBS = ("bits", "engine", "prefetch", "fusion", "grad", "sync_budget", "roots")


def converged_source(conv: List[dict]) -> str:
    """Where a converged baseline's target comes from: patience stopped it, or the epoch cap did
    (then the target is its best so far, not a converged one)."""
    epochs = max(d.get("epochs") or 0 for d in conv)
    train = (conv[0].get("_config") or {}).get("train") or {}
    cap = train.get("epochs")
    if cap is not None and epochs >= cap:
        return f"distdgl's {epochs}-epoch run: the epoch cap stopped it, not patience"
    return f"converged: patience {train.get('patience')} stopped distdgl at {epochs} epochs"


def best_baseline(dist: List[dict]) -> Tuple[List[dict], str]:
    """distdgl at its best: where a group ran distdgl with several `pipeline.prefetch` settings,
    the runs of the one with the lowest median epoch, and a note naming it."""
    by: Dict[object, List[dict]] = defaultdict(list)
    for d in dist:
        by[d.get("prefetch")].append(d)
    if len(by) < 2:
        return dist, ""
    speed = {k: median(t for t in (median_epoch_s(d) for d in v) if t is not None) for k, v in by.items()}
    best = min(by, key=lambda k: (speed[k] is None, speed[k] or 0.0))
    others = ", ".join(f"{k}: {fmt(speed[k], '.2f')} s" for k in sorted(by, key=str) if k != best)
    return by[best], f" (prefetch {best}, the faster; {others})"


def lamp_section(runs: List[dict]) -> List[str]:
    """bench=lamp: each lamp setting beside the distdgl runs of the same group, dataset and layers
    (every repeat of either: medians, with the min–max where they differ); bytes per batch against
    layers for both pipelines."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("lamp", "distdgl") and not ablated(s)]
    if not any(s["pipeline"] == "lamp" for s in ok):
        return []
    base: Dict[tuple, List[dict]] = defaultdict(list)
    for s in ok:
        if s["pipeline"] == "distdgl":
            base[(_group(s), s["dataset"], s.get("layers"))].append(s)
    settings: Dict[tuple, List[dict]] = defaultdict(list)
    for s in ok:
        if s["pipeline"] == "lamp":
            settings[(_group(s), s["dataset"], s.get("layers"), bandwidth(s))
                     + tuple(str(s.get(k)) for k in LAMP_KNOBS)].append(s)
    order = sorted(settings, key=lambda k: (k[0], k[1], k[2] or 0, -(settings[k][0].get("bits") or 0), k))
    rows = []
    for key in order:
        lamp, (dist, which) = settings[key], best_baseline(base.get(key[:3], []))
        if not dist:
            continue
        s = lamp[0]
        med = lambda group, f: median(f(r) for r in group if f(r) is not None)  # noqa: E731
        n, nd = med(lamp, lambda r: r.get("net_bytes_per_batch")), med(dist, lambda r: r.get("net_bytes_per_batch"))
        t, td = spread(median_epoch_s(r) for r in lamp), spread(median_epoch_s(r) for r in dist)
        acc, acc_d = med(lamp, lambda r: r.get("test")), med(dist, lambda r: r.get("test"))
        ages = [r.get("history_age_max") for r in lamp if r.get("history_age_max") is not None]
        rows.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {s.get('bits')} | {s.get('epochs')} | "
            f"{kb(nd)} / {kb(n)} | **{(nd / n if n and nd else float('nan')):.1f}x** | "
            f"{kb(med(dist, _beyond_allreduce))} / {kb(med(lamp, _beyond_allreduce))} | {cell(td)} / {cell(t)} | "
            f"{fmt(acc_d)} / {fmt(acc)} | {fmt((acc - acc_d) * 100 if None not in (acc, acc_d) else None, '+.2f')} | "
            f"{fmt(med(lamp, lambda r: r.get('history_age_mean')), '.1f')} / {max(ages) if ages else '–'} | "
            f"{fmt(med(lamp, lambda r: r.get('roots_per_batch')), '.0f')} | {ratio_cell(td, t, bold=False)} | "
            f"{len(dist)}{which} / {len(lamp)} |")
    if not rows:
        return []
    out = ["## LAMP against DistDGL", "",
           "Each lamp setting beside the distdgl runs of the same suite group, dataset and layers (same "
           "partitions, seeds, batch size and epochs). Bytes are on the wire per trainer and batch "
           "(netns veth counters), in all and beyond the gradient all-reduce; epoch time is a run's median "
           "epoch; test at the best validation point. Where distdgl ran both synchronous and with its "
           "prefetching loader, the faster of the two is the baseline (the runs column names it). Over repeats: the median, with the min–max in "
           "brackets where the repeats differ; a ratio of medians whose two ranges overlap says so.", "",
           "| group | dataset | layers | bits | epochs | net KB/batch (distdgl / lamp) | distdgl / lamp | "
           "beyond all-reduce KB (distdgl / lamp) | epoch s (distdgl / lamp) | test (distdgl / lamp) | "
           "difference (points) | history age mean / max | roots/batch | epoch time distdgl / lamp | "
           "runs (distdgl / lamp) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    reach = []
    for key in order:
        lamp, dist = settings[key], best_baseline(base.get(key[:3], []))[0]
        dist = [d for d in dist if d.get("best_val") is not None and len([r for r in d["_curve"] if "val" in r]) >= 2]
        if not dist:
            continue
        # the target: the best of distdgl's own converged run (suite `<group>-converged`) where the
        # bench has one, else of the compared distdgl runs
        conv = [d for d in base.get((f"{key[0]}-converged",) + key[1:3], []) if d.get("best_val") is not None]
        target = median(d["best_val"] for d in (conv or dist)) - 0.01
        cols = []
        for clock in (time_to_target, time_from_launch):
            td, tl = spread(clock(d, target) for d in dist), spread(clock(s, target) for s in lamp)
            cols += [cell(td, ".1f"), cell(tl, ".1f"), ratio_cell(td, tl)]
        reached = sum(time_to_target(s, target) is not None for s in lamp)
        source = converged_source(conv) if conv else "compared runs"
        reach.append(f"| {key[0]} | {key[1]} | {key[2]} | {lamp[0].get('bits')} | {target:.4f} ({source}) | "
                     + " | ".join(cols) + f" | {reached} / {len(lamp)} |")
    if reach:
        out += ["Time (s) to distdgl's best validation accuracy minus one point (the median of its "
                "repeats' best; of its own converged run, trained until validation stopped improving, "
                "where the bench has one): training time (evaluation excluded), and from launch (the run's set-up "
                "added: docs/benchmarks.md, \"Time from launch\"); median (min–max) over the repeats "
                "that reached it.", "",
                "| group | dataset | layers | bits | target | distdgl | lamp | distdgl / lamp | "
                "distdgl from launch | lamp from launch | distdgl / lamp from launch | lamp runs reaching it |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|", *reach, ""]
    growth = []
    for (pipe, ds), pts in sorted(_bytes_vs_layers(ok).items()):
        if len(pts) >= 2:
            (l0, b0), (l1, b1) = pts[0], pts[-1]
            growth.append(f"| {pipe} | {ds} | {l0} -> {l1} | {kb(b0)} | {kb(b1)} | {b1 / b0:.2f}x |")
    if growth:
        out += ["Wire bytes per batch beyond the all-reduce as layers grow (8-bit lamp):", "",
                "| pipeline | dataset | layers | KB/batch before | KB/batch after | growth |",
                "|---|---|---|---|---|---|", *growth, ""]
    return out


def lamp_ablations(runs: List[dict]) -> List[str]:
    """bench=lamp's ablations: every lamp setting with its asynchronous-pipeline and fusion
    settings, beside the distdgl runs of the same dataset, layers and bandwidth (epoch-time ratio
    of the medians over repeats; the other columns from the setting's median-epoch run)."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("lamp", "distdgl")]
    lamp = [s for s in ok if s["pipeline"] == "lamp" and "prefetch" in s and not ablated(s)]
    if not lamp:
        return []
    base: Dict[tuple, List[dict]] = defaultdict(list)
    for s in sorted((s for s in ok if s["pipeline"] == "distdgl" and not ablated(s)),
                    key=lambda s: (not _group(s).startswith("bytes"), s["_rel"])):
        group = base[(s["dataset"], s.get("layers"), bandwidth(s))]
        if not group or _group(group[0]) == _group(s):  # one suite group's runs (a bytes-* one first)
            group.append(s)
    settings: Dict[tuple, List[dict]] = defaultdict(list)
    for s in lamp:
        settings[(s["dataset"], s.get("layers") or 0, str(bandwidth(s)), s["_rel"].split("/")[0])
                 + tuple(str(s.get(k)) for k in LAMP_KNOBS) + (str(s.get("trainers")),)].append(s)
    rows = []
    for key in sorted(settings):
        group = settings[key]
        ts = spread(median_epoch_s(r) for r in group)
        s = min(group, key=lambda r: (abs((median_epoch_s(r) or 0) - (ts.median if ts else 0)), r["_rel"]))
        dist = base.get((s["dataset"], s.get("layers"), bandwidth(s)), [])
        td = spread(median_epoch_s(d) for d in dist)
        tb = s.get("time_per_batch_s") or {}
        ms = lambda k: fmt(1000 * tb[k], ".1f") if k in tb else "–"  # noqa: E731
        share = lambda k: fmt(100 * s[k], ".1f") if s.get(k) is not None else "–"  # noqa: E731
        rows.append(
            f"| {s['_rel'].split('/')[0]} | {s['dataset']} | {s.get('layers')} | {bandwidth(s) or '–'} | "
            f"{s.get('engine', 'server')} | {s.get('prefetch')} | {s.get('fusion')} | {s.get('grad', 'stop')} | "
            f"{s.get('sync_budget', '–')} | "
            f"{cell(td)} / {cell(ts)} | "
            f"{ratio_cell(td, ts)} | {ms('owner_wait')} | {ms('compute')} | "
            f"{share('fusion_saved_share')} / {share('fusion_saved_share_requests')} | "
            f"{fmt(s.get('owner_requests_per_computation'), '.2f')} | "
            f"{fmt(s.get('owner_version_lag_mean'), '.2f')} / {s.get('owner_version_lag_max', '–')} | "
            f"{fmt(s.get('history_age_mean'), '.1f')} | {fmt(s.get('history_sync_rows_per_batch'), '.0f')} | "
            f"{fmt(s.get('test'))} | {kb(s.get('net_bytes_per_batch'))} |")
    return ["## LAMP: asynchronous pipeline and fusion", "",
            "Every lamp run with its `pipeline.engine` (where the owners' preparation runs: graph server or trainer), "
            "`pipeline.prefetch`, `pipeline.fusion`, `pipeline.grad` and `pipeline.sync_budget` "
            "(None: every changed halo row synced), beside the distdgl run of "
            "the same dataset, layers and bandwidth; epoch time the median (min–max) over repeats, the "
            "other columns from the repeat of median epoch time. Owner wait and compute in ms per batch; fusion saved = "
            "share of (node, layer) computations saved against no fusion at all / against owners not "
            "merging queued requests; requests per computation = LAMP requests an owner answered with one "
            "computation graph; owner lag = steps between the owners' weights and the step using their "
            "answer; history age in steps; sync rows = halo history rows synced per batch.", "",
            "| suite | dataset | layers | bandwidth | engine | prefetch | fusion | grad | sync budget | "
            "epoch s (distdgl / lamp) | "
            "distdgl / lamp | owner wait ms | compute ms | fusion saved % (all / requests) | "
            "requests per computation | owner lag mean / max | history age mean | sync rows | test | net KB/batch |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


OWNERS_STEPS = (("distdgl", "distdgl"), ("halo", "distdgl + halo cache"),
                ("histories", "lamp, roots from histories"), ("lamp", "lamp"))


def _owners_variant(s: dict) -> str:
    if s["pipeline"] == "distdgl":
        return "halo" if s.get("halo_cache") else "distdgl"
    return "histories" if s.get("roots") == "histories" else "lamp"


SHARE_MIN_GAIN = 0.05  # a whole gain under this share of the baseline is left unsplit (noise)


def _share(values: List[Optional[float]]) -> List[str]:
    """Each step's share of the whole gain from values[0] to values[-1] (one per step), in %; "–"
    when the whole gain is under SHARE_MIN_GAIN of values[0] (its split would be noise)."""
    if None in values or not abs(values[0] - values[-1]) >= SHARE_MIN_GAIN * abs(values[0]):
        return ["–"] * (len(values) - 1)
    total = values[0] - values[-1]
    return [f"{100 * (a - b) / total:+.0f}%" for a, b in zip(values, values[1:])]


def owners_section(runs: List[dict]) -> List[str]:
    """bench=lamp's ablation-owners suites: distdgl, distdgl reading its halo from a local copy,
    lamp with the roots read from the trainer's histories and lamp, at the same dataset, layers
    and bandwidth, each over its repeats (median, min–max); what each step adds to the gain from
    distdgl to lamp (from the medians)."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("lamp", "distdgl")
          and s["_rel"].startswith("ablation-owners")]
    cells: Dict[tuple, Dict[str, List[dict]]] = defaultdict(lambda: defaultdict(list))
    for s in sorted(ok, key=lambda s: s["_rel"]):
        if s["pipeline"] == "lamp" and s.get("bits") not in (None, 8):
            continue
        cells[(s["dataset"], s.get("layers"), bandwidth(s))][_owners_variant(s)].append(s)
    rows, shares, capped = [], [], []
    for (ds, layers, bw), got in sorted(cells.items(), key=lambda kv: str(kv[0])):
        d = got.get("distdgl") or []
        bd, td = spread(_beyond_allreduce(r) for r in d), spread(median_epoch_s(r) for r in d)
        testd = spread(r.get("test") for r in d)
        medians = {}
        for key, name in OWNERS_STEPS:
            rs = got.get(key)
            if not rs:
                continue
            b, t = spread(_beyond_allreduce(r) for r in rs), spread(median_epoch_s(r) for r in rs)
            test = spread(r.get("test") for r in rs)
            medians[key] = (b and b.median, t and t.median)
            rows.append(f"| {ds} | {layers} | {bw or '–'} | {name} | {len(rs)} | "
                        f"{cell(_kb(spread(r.get('net_bytes_per_batch') for r in rs)), ',.1f')} | "
                        f"{cell(_kb(b), ',.1f')} | {ratio_cell(bd, b, bold=False, spec='.1f')} | {cell(t)} | "
                        f"{ratio_cell(td, t, bold=False)} | {cell(spread(r.get('epochs') for r in rs), 'g')} | "
                        f"{cell(test, '.4f')} | "
                        + (f"{(test.median - testd.median) * 100:+.2f} |" if test and testd else "– |"))
            for r in rs:
                cap = ((r.get("_config") or {}).get("train") or {}).get("epochs")
                if cap is not None and (r.get("epochs") or 0) >= cap:
                    capped.append(f"{ds} {name}")
        if len(medians) == len(OWNERS_STEPS):
            for what, i in (("bytes beyond all-reduce", 0), ("epoch time", 1)):
                values = [medians[k][i] for k, _ in OWNERS_STEPS]
                shares.append(f"| {ds} | {layers} | {bw or '–'} | {what} | " + " | ".join(_share(values)) + " |")
    if not rows:
        return []
    out = ["## LAMP: what the owners add", "",
           "The gain from distdgl to lamp in steps (bench=lamp's ablation-owners suites, the same partitions, "
           "seeds and batches): distdgl reading its machine's halo features from a local copy made at setup "
           "(`pipeline.halo_cache=true`: caching alone), lamp with every remote top-hop root read from the "
           "trainer's own quantized histories (`pipeline.roots=histories`: LAMP's computation on local data and "
           "stale halo rows, no owner round trip), and lamp (the owners' fresh answers). Bytes per trainer and "
           "batch on the wire; epoch time the median of a run's "
           "epochs; test at the best validation point, and the difference of its median from distdgl's in "
           "points. Each cell is the median over the runs (min–max); a ratio whose two ranges overlap says so.",
           "",
           "| dataset | layers | bandwidth | variant | runs | net KB/batch | beyond all-reduce KB | distdgl / this | "
           "epoch s | distdgl / this | epochs | test | vs distdgl (points) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    out.append("Runs stopped by the epoch cap rather than by patience (not converged): "
               + (", ".join(sorted(set(capped))) + "." if capped else "none."))
    out.append("")
    if shares:
        out += ["Each step's share of the gain from distdgl to lamp, from the medians (negative: that step costs "
                f"more than it saves; –: the whole gain is under {SHARE_MIN_GAIN:.0%} of distdgl's, too small to "
                "split):",
                "", "| dataset | layers | bandwidth | measure | halo cache | lamp's computation (histories) | "
                "owners' fresh answers |", "|---|---|---|---|---|---|---|", *shares, ""]
    return out


def _kb(s: Optional[Spread]) -> Optional[Spread]:
    return None if s is None else Spread(s.median / 1024, s.lo / 1024, s.hi / 1024, s.n)


def _bytes_picks(ok: List[dict]) -> Dict[tuple, dict]:
    """(pipeline, dataset, layers) -> the run whose wire bytes stand for it (lamp at 8 bits; a
    `bytes-*` suite's run first)."""
    pick: Dict[tuple, dict] = {}
    for s in sorted(ok, key=lambda s: (not _group(s).startswith("bytes"), s["_rel"])):
        if (s["pipeline"] == "lamp" and s.get("bits") != 8) or ablated(s):
            continue
        if _beyond_allreduce(s) is None:
            continue
        pick.setdefault((s["pipeline"], s["dataset"], s.get("layers")), s)
    return pick


def _bytes_vs_layers(ok: List[dict]) -> Dict[tuple, list]:
    """(pipeline, dataset) -> [(layers, wire bytes per batch beyond the all-reduce)], one run per
    layer count (_bytes_picks)."""
    series: Dict[tuple, list] = defaultdict(list)
    for (pipe, ds, layers), s in sorted(_bytes_picks(ok).items(), key=lambda kv: str(kv[0])):
        series[(pipe, ds)].append((layers, _beyond_allreduce(s)))
    return {k: sorted(v) for k, v in series.items()}


def plot_lamp_bytes(runs: List[dict], path: Path) -> Optional[Path]:
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("lamp", "distdgl")]
    series = _bytes_vs_layers(ok)
    plt = _pyplot()
    if not any(p == "lamp" for p, _ in series) or plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    datasets = sorted({ds for _, ds in series})
    for (pipe, ds), pts in sorted(series.items()):
        i = datasets.index(ds)
        ax.plot([l for l, _ in pts], [b / 1024 for _, b in pts], color=colour({"pipeline": pipe}),
                marker="os^vD"[i % 5], linestyle=("-", "--", ":", "-.")[i % 4],
                label=f"{pipe} {ds}" if len(datasets) > 1 else pipe)
    ax.set_xticks(sorted({l for pts in series.values() for l, _ in pts}))  # whole layers only
    ax.set_yscale("log")
    ax.set_xlabel("layers")
    ax.set_ylabel("wire KB per batch beyond the all-reduce")
    ax.set_title(fig_title(list(_bytes_picks(ok).values()), "bytes per batch against layers (8-bit lamp)"),
                 fontsize=9)
    return _finish(fig, ax, path)


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
    if bandwidth(s):
        text += f" {bandwidth(s)}"
    return text


def breakdown_section(runs: List[dict]) -> List[str]:
    """Per-batch time by phase (summary `time_per_batch_s`) for every run that has it."""
    rows = [s for s in runs if s.get("status") == "ok" and s.get("time_per_batch_s")]
    if not rows:
        return []
    out = ["## Where a batch's time goes", "",
           "Milliseconds per batch and trainer, mean over trainers (degnn.metrics.PhaseTimer): sampling "
           "= building the computation graph (distdgl: DGL's sampler and its RPCs), owner wait = blocked "
           "on other machines' data (distdgl: the feature pull; lamp: the owners' answers), compute = "
           "forward, backward and step without the all-reduce, history = lamp's history pushes, weight "
           "shipping and halo sync, other = the rest of the epoch.", "",
           "| run | " + " | ".join(PHASES) + " | total |", "|---|" + "---|" * (len(PHASES) + 1)]
    for s in sorted(rows, key=lambda s: (s.get("dataset"), s.get("layers"), s["_rel"])):
        t = s["time_per_batch_s"]
        out.append(f"| {_short(s)} | " + " | ".join(fmt(1000 * t.get(p, 0.0), ".1f") for p in PHASES)
                   + f" | {1000 * sum(t.values()):.1f} |")
    return out + [""]


PHASE_COLOURS = {"sampling": "#66c2a5", "owner_wait": "#fc8d62", "compute": "#8da0cb",
                 "allreduce": "#e78ac3", "history": "#a6d854", "other": "#d9d9d9"}
PHASE_NAMES = {"owner_wait": "owner wait", "allreduce": "all-reduce"}


def _run_axis(ax, rows: List[dict]) -> None:
    """One horizontal bar per run, top to bottom, named in words, each name in its method's colour."""
    ax.set_yticks(list(range(len(rows))))
    ax.set_yticklabels(labels(rows)[0], fontsize=8)
    for tick, s in zip(ax.get_yticklabels(), rows):
        tick.set_color(colour(s))
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def plot_breakdown(runs: List[dict], path: Path) -> Optional[Path]:
    """One stacked bar per run: the per-batch time by phase."""
    rows = sorted((s for s in runs if s.get("status") == "ok" and s.get("time_per_batch_s")),
                  key=lambda s: (str(s.get("dataset")), s.get("layers") or 0, method(s), s["_rel"]))
    plt = _pyplot()
    if not rows or plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.35 * len(rows)))
    left = [0.0] * len(rows)
    for phase in PHASES:
        vals = [1000 * s["time_per_batch_s"].get(phase, 0.0) for s in rows]
        ax.barh(range(len(rows)), vals, left=left, color=PHASE_COLOURS[phase],
                label=PHASE_NAMES.get(phase, phase))
        left = [b + v for b, v in zip(left, vals)]
    _run_axis(ax, rows)
    ax.set_xlabel("ms per batch (per trainer)")
    ax.set_title(fig_title(rows, "where a batch's time goes", labels(rows)[1]), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def plot_curves(runs: List[dict], path: Path) -> Optional[Path]:
    groups = defaultdict(list)
    for s in runs:
        if s["_curve"]:
            groups[s.get("dataset")].append(s)
    plt = _pyplot()
    if not groups or plt is None:
        return None
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, (ds, group) in zip(axes[0], sorted(groups.items())):
        # runs of one method: one colour, a line style each (a run with a failure dashed)
        seen: Dict[str, int] = defaultdict(int)
        names, shared = labels(group)
        for s, name in zip(group, names):
            pts = [(r["train_time_s"], r["val"]) for r in s["_curve"] if "val" in r]
            if pts:
                style = "--" if failure(s) else ("-", ":", "-.", (0, (6, 1, 1, 1)))[seen[method(s)] % 4]
                seen[method(s)] += not failure(s)
                ax.plot(*zip(*pts), marker="o", markersize=3, color=colour(s), linestyle=style, label=name)
        ax.set_title(fig_title(group, "validation against training time", shared), fontsize=9)
        ax.set_xlabel("training wall time (s)")
        ax.set_ylabel(f"validation {group[0].get('metric', 'acc')}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_bytes(runs: List[dict], path: Path) -> Optional[Path]:
    rows = sorted((s for s in runs if s.get("status") == "ok" and s.get("pipeline") != "single"),
                  key=lambda s: (str(s.get("dataset")), s.get("layers") or 0, method(s), s["_rel"]))
    plt = _pyplot()
    if not rows or plt is None:
        return None
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.45 * len(rows)))
    ys = range(len(rows))
    height = 0.4
    net = [(s.get("net_bytes_per_batch") or 0) / 1024 for s in rows]
    app = [(s.get("app_bytes_per_batch") or 0) / 1024 for s in rows]
    colours = [colour(s) for s in rows]
    ax.barh([y - height / 2 for y in ys], net, height, color=colours)
    ax.barh([y + height / 2 for y in ys], app, height, color=colours, alpha=0.45, hatch="//")
    _run_axis(ax, rows)
    ax.set_xlabel("KB per batch (per trainer)")
    ax.set_title(fig_title(rows, "bytes sent per batch", labels(rows)[1]), fontsize=9)
    ax.legend(handles=[Patch(color="grey", label="on the wire (veth)"),
                       Patch(facecolor="grey", alpha=0.45, hatch="//", label="application counters")],
              fontsize=7)
    return _save(fig, path)


CSV_FIRST = ("run", "status", "pipeline", "variant", "dataset", "model", "layers", "machines", "trainers",
             "bandwidth", "best_val", "test", "train_time_s", "epochs")


def _scalar(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def csv_row(s: dict) -> Dict[str, object]:
    """A summary's scalar keys as they are, a dict of scalars as `key.sub` columns (lists left out)."""
    row: Dict[str, object] = {"run": s["_rel"]}
    for k, v in s.items():
        if k.startswith("_"):
            continue
        if _scalar(v):
            row[k] = v
        elif isinstance(v, dict):
            row.update({f"{k}.{sub}": x for sub, x in v.items() if _scalar(x)})
    return row


def write_csv(runs: List[dict], path: Path) -> Path:
    """runs.csv: one row per run (failed ones too), the columns of every run's summary; empty
    cells where a run has no such key."""
    rows = [csv_row(s) for s in sorted(runs, key=lambda s: s["_rel"])]
    keys = {k for r in rows for k in r}
    columns = [k for k in CSV_FIRST if k in keys] + sorted(keys - set(CSV_FIRST))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, restval="")
        w.writeheader()
        w.writerows(rows)
    return path


def write_report(results: Path, title: str = "degnn benchmark") -> Path:
    results = Path(results)
    runs = collect(results)
    table_csv = write_csv(runs, results / "runs.csv")
    lines = [f"# {title}", "", f"Results folder: `{results}`; {len(runs)} runs (every summary key of "
             f"each: `{table_csv.name}`).", "",
             "Bytes per batch are per trainer and training step: on the wire = bytes the machines' "
             "network interfaces sent during training (netns veth counters), application = what degnn "
             "counted (sampling RPCs and feature pulls that cross machines, gradient all-reduce).", ""]
    if plot_note():
        lines += [plot_note(), ""]
    lines += table(runs) + [""]
    lines += comparisons(runs)
    lines += parity(runs)
    lines += prefetch_pairs(runs)
    lines += link_section(runs)
    lines += tma_section(runs, results)
    lines += lamp_section(runs)
    lines += lamp_ablations(runs)
    lines += owners_section(runs)
    lines += projection_section(runs, results)
    curves = plot_curves(runs, results / "curves.png")
    bytes_png = plot_bytes(runs, results / "bytes_per_batch.png")
    if curves:
        lines += ["## Validation metric against training time", "", f"![curves]({curves.name})", ""]
    if bytes_png:
        lines += ["## Bytes per batch", "", f"![bytes]({bytes_png.name})", ""]
    lamp_png = plot_lamp_bytes(runs, results / "lamp_bytes_vs_layers.png")
    if lamp_png:
        lines += ["## LAMP: bytes per batch against layers", "", f"![lamp bytes]({lamp_png.name})", ""]
    lines += breakdown_section(runs)
    lines += scale_section(runs, results, lambda rs, path: plot_growth(rs, path, _pyplot(), colour, _save))
    breakdown_png = plot_breakdown(runs, results / "time_breakdown.png")
    if breakdown_png:
        lines += [f"![time per batch by phase]({breakdown_png.name})", ""]
    report = results / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report


if __name__ == "__main__":
    print(write_report(Path(sys.argv[1])))
    if plot_note():
        print(plot_note())
