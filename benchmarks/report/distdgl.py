"""bench=parity: pipeline=distdgl beside the plain DGL trainer (`parity`), and distdgl's
prefetching loader against its synchronous loop (`prefetch_pairs`)."""
from __future__ import annotations

from typing import Dict, List, Optional

from ..records import bandwidth, loader
from ..spread import median, paired_cell, paired_ratios, spread
from .runs import fmt, kb, median_epoch_s


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
            "`pipeline=distdgl` against `benchmarks/plain_dgl.py` (DistGraph, DistNodeDataLoader, "
            "dgl.nn.SAGEConv, DDP) on the same cluster and partitions, run one after the other in both "
            "orders. Epoch time is the median over all epochs of all runs of a side; bytes are on the "
            "wire during training; test accuracy of the final model after the same epochs (mean over "
            "runs). Ratios are distdgl / plain (bars: time <= 1.10x, bytes within 5%).", "",
            "| dataset | layers | fan-outs | epochs | runs (distdgl / plain) | epoch s (distdgl / plain) | "
            "time ratio | net KB/batch (distdgl / plain) | bytes ratio | test (distdgl / plain) | "
            "difference (points) |",
            "|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


PREFETCH_HEADING = "distdgl: prefetch against the synchronous loop"


def prefetch_pairs(runs: List[dict], narrow: bool = False, heading: str = PREFETCH_HEADING) -> List[str]:
    """bench=parity's prefetch-* and auto-* suites: distdgl with pipeline.prefetch=1 (each loader:
    sampling only, sampling and pull, or the first epoch's choice) against prefetch=0 of the same
    suite family for each dataset, layer count and bandwidth, the repeats of both orders pooled
    (epoch times of all runs of a side: median and min-max). `narrow`: the comparison's columns
    only (RESULTS.md; every column: DETAILS.md and the report)."""
    rows = []
    for ds, layers, bw, name, on, off in prefetch_sides(runs):
        row = _prefetch_row(ds, layers, bw, name, on, off, narrow)
        if row:
            rows.append(row)
    if not rows:
        return []
    if narrow:
        return [f"## {heading}", "",
                "`pipeline=distdgl` with `pipeline.prefetch=1` (the default: a background thread samples "
                "the next batch while the trainer trains; the loader says whether it pulled the batch's "
                "features too, or the first epoch chose: `pipeline.prefetch_auto`) against "
                "`pipeline.prefetch=0` of the same suites, repeated in both orders. Epoch time: median "
                "(min-max) over all epochs of all runs of a side; per repeat: the two loops ran back to "
                "back, the ratio of their median epochs (median, min–max, spread). Bar: prefetch 1 at "
                "least as fast. Every column (runs, bytes, waits, CPU-bound share, repeats faster): "
                "DETAILS.md.", "",
                "| dataset | layers | bandwidth | loader | epoch s, prefetch 1 / 0 | time ratio | "
                "ratio per repeat | at least as fast |",
                "|---|---|---|---|---|---|---|---|", *rows, ""]
    return [f"## {heading}", "",
            "`pipeline=distdgl` with `pipeline.prefetch=1` (the default: a background thread samples "
            "the next batch while the trainer trains; the loader column says whether it pulled the "
            "batch's features too, `pipeline.prefetch_pull`, or the trainer pulled them before its step; "
            "auto: `pipeline.prefetch_auto`, the sampling loader or the synchronous loop, whichever was "
            "faster in the first epoch's halves, summed over a run's trainers, with how many trainers "
            "kept the loader: all of a run or none since the choice became the cluster's) "
            "against `pipeline.prefetch=0` of the same suites, repeated "
            "in both orders. Epoch time: median (min-max) over all epochs of all runs of a side; "
            "application bytes per batch (the same work either way); wait = the main thread's sampling "
            "and feature-pull wait per batch; per repeat: the two loops ran back to back, the ratio of "
            "their median epochs (median, min–max, spread) and in how many repeats prefetch 1 was at "
            "least as fast; CPU-bound = the share of 100 ms periods in which a machine used up its CPU "
            "quota (`cpu_throttled_share`, whole runs, mean over the runs of a side; – where not "
            "recorded): where it is high the thread's work comes out of the step's CPU, and the loader "
            "has little to hide. Bar: prefetch 1 at least as fast.", "",
            "| dataset | layers | bandwidth | loader | runs (1 / 0) | epoch s, prefetch 1 / 0 | time ratio | "
            "app KB/batch (1 / 0) | wait ms/batch (1 / 0) | CPU-bound (1 / 0) | ratio per repeat | "
            "prefetch 1 faster | at least as fast |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


FAMILIES = ("prefetch", "auto")  # bench=parity's suites of prefetch against the synchronous loop


def prefetch_sides(runs: List[dict]) -> List[tuple]:
    """(dataset, layers, bandwidth, loader, prefetch 1 runs, prefetch 0 runs) for each loader of
    bench=parity's prefetch-* and auto-* suites against the synchronous runs of the same suite
    family, dataset, layers and bandwidth, in the prefetch table's order."""
    by_key: Dict[tuple, Dict[str, List[dict]]] = {}
    for s in runs:
        family = s["_rel"].split("-")[0]
        if s.get("status") != "ok" or s.get("pipeline") != "distdgl" or family not in FAMILIES:
            continue
        key = (s["dataset"], s.get("layers") or 0, bandwidth(s) or "unlimited", family)
        loop = loader(s) if int(s.get("prefetch") or 0) == 1 else "sync" if not s.get("prefetch") else None
        if loop:
            by_key.setdefault(key, {}).setdefault(loop, []).append(s)
    return [(ds, layers, bw, name, sides[name], sides.get("sync", []))
            for (ds, layers, bw, _), sides in sorted(by_key.items())
            for name in sorted(set(sides) - {"sync"}, reverse=True)]


def pooled_epochs(group: List[dict]) -> List[float]:
    """Every epoch time of every run of a side, sorted (the prefetch table's min, median and max)."""
    return sorted(t for s in group for t in (s.get("epoch_times_s") or []))


def mean_of(group: List[dict], key: str) -> Optional[float]:
    vals = [s[key] for s in group if s.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _prefetch_row(ds, layers, bw, name: str, on: List[dict], off: List[dict], narrow: bool = False) -> Optional[str]:
    if not on or not off:
        return None
    times = [pooled_epochs(g) for g in (on, off)]
    if not times[0] or not times[1]:
        return None
    t1, t0 = (median(t) for t in times)

    def wait(group):
        per = [s.get("time_per_batch_s") or {} for s in group]
        return sum(p.get("sampling", 0) + p.get("owner_wait", 0) for p in per) / len(per)

    def throttled(group) -> str:
        share = mean_of(group, "cpu_throttled_share")
        return "–" if share is None else f"{share:.0%}"

    overlap = times[0][0] <= times[1][-1] and times[1][0] <= times[0][-1]
    verdict = ("yes" if t1 <= t0 else "no") + (" (ranges overlap)" if overlap else "")
    ratios = paired_ratios(on, off, median_epoch_s)
    pairs, faster = spread(ratios), sum(1 for r in ratios if r <= 1.0)
    if name == "auto":  # trainers that kept the loader after their first epoch, of all
        kept = [s for s in on if s.get("prefetch_kept") is not None]
        name += f" (kept {sum(s['prefetch_kept'] for s in kept)} of {sum(s.get('trainers') or 0 for s in kept)})"
    epochs = (f"{t1:.2f} ({times[0][0]:.2f}-{times[0][-1]:.2f}) / {t0:.2f} ({times[1][0]:.2f}-{times[1][-1]:.2f})")
    if narrow:
        return (f"| {ds} | {layers} | {bw} | {name} | {epochs} | **{t1 / t0:.2f}x** | {paired_cell(pairs)} | "
                f"{verdict} |")
    return (f"| {ds} | {layers} | {bw} | {name} | {len(on)} / {len(off)} | {t1:.2f} ({times[0][0]:.2f}-"
            f"{times[0][-1]:.2f}) / {t0:.2f} ({times[1][0]:.2f}-{times[1][-1]:.2f}) | **{t1 / t0:.2f}x** | "
            f"{kb(mean_of(on, 'app_bytes_per_batch'))} / {kb(mean_of(off, 'app_bytes_per_batch'))} | "
            f"{wait(on) * 1000:.0f} / {wait(off) * 1000:.0f} | {throttled(on)} / {throttled(off)} | "
            f"{paired_cell(pairs)} | "
            f"{faster} of {pairs.n if pairs else 0} | {verdict} |")
