"""The headline comparisons: one short table that opens benchmarks/RESULTS.md, a row per compared
setting, each against distdgl in bytes per batch, epoch time and time to the target from launch,
with the test metric's difference, every number taken from the section that holds its detail
(the row links to it) and computed by that section's own helpers:

- LAMP against distdgl at its best (lamp.py: `lamp_pairs`, `bytes_ratio`, `test_points`,
  `lamp_target`), in every bench with that table; the time to the target where the bench set one
  (the runs stopped at distdgl's converged accuracy minus one point, or trained to convergence);
- TMA against distdgl under one wall-time budget (tma.py: `tma_settings`, `tma_baseline`), in
  the benches that compare them (bench=tma, bench=link: scale and projection run TMA for growth
  and calibration): per setting the variant that reached the target fastest from launch, else the
  one of the best test metric; a TMA round is no epoch and a local step moves no bytes, so those
  two cells are dashes;
- distdgl's default prefetching loader (sampling ahead) against its synchronous loop
  (distdgl.py: `prefetch_sides`, the pooled epoch times), in bench=parity.

Every ratio is distdgl's over this row's (above 1: this row moves fewer bytes or is faster): the
median of the ratios within each repeat (the two sides ran back to back: spread.paired_ratios, the
sections' "ratio per repeat" and "per repeat" columns) with their min–max; with fewer than two
repeats that have both sides, the ratio of the section's medians. The prefetch table gives the inverse
(prefetch 1 over prefetch 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from ..spread import median, paired_ratios, spread
from .distdgl import mean_of, pooled_epochs, prefetch_sides
from .lamp import bytes_ratio, lamp_pairs, lamp_target, net_bytes, test_points
from .runs import fmt, median_epoch_s, time_from_launch
from .tma import by_method, setting_heading, tma_baseline, tma_settings

HEADING = "Headline comparisons"
TMA_BENCHES = ("link", "tma")  # the benches whose subject is TMA against distdgl
PREFETCH_LOADER = "sampling"  # distdgl's default loader (pipeline.prefetch=1, prefetch_pull=false)
NOT_REACHED = "not reached"
COLUMNS = ["bench", "compared with distdgl", "setting", "bytes per batch", "epoch time",
           "time to target from launch", "test (points)"]


@dataclass(frozen=True)
class Row:
    bench: str
    name: str  # the pipeline compared with distdgl
    setting: str
    section: str  # the heading, within the bench's section of RESULTS.md, of the row's detail
    bytes: str = "–"
    epoch: str = "–"
    launch: str = "–"
    test: str = "–"


def ratio(value: Optional[float], within: List[float], spec: str = ".2f", missing: str = "–") -> str:
    """`1.25x (1.12–1.39)`: the median of the per-repeat ratios `within` with their min–max (the
    min–max left out where it rounds to one value); with fewer than two, the ratio of the
    medians `value` alone; `missing` without either."""
    if len(within) >= 2:
        s = spread(within)
        text = f"{format(s.median, spec)}x"
        lo, hi = format(s.lo, spec), format(s.hi, spec)
        return text + (f" ({lo}–{hi})" if lo != hi else "")
    return f"{format(value, spec)}x" if value else missing


def _value(value: Optional[float], within: List[float]) -> Optional[float]:
    """The number `ratio` shows."""
    return spread(within).median if len(within) >= 2 else value


def _of_medians(num: List[dict], den: List[dict], value: Callable[[dict], Optional[float]]) -> Optional[float]:
    """The median of value over `num` over that over `den` (the sections' ratio of medians)."""
    a, b = spread(value(r) for r in num), spread(value(r) for r in den)
    return a.median / b.median if a and b and a.median and b.median else None


def _setting(dataset, layers, bw, *more) -> str:
    return ", ".join(str(x) for x in (dataset, f"L{layers}", bw or "unlimited", *more) if x)


def lamp_rows(bench: str, runs: List[dict]) -> List[Row]:
    rows = []
    for pair in lamp_pairs(runs):
        key, lamp, dist = pair.key, pair.lamp, pair.dist
        goal = lamp_target(pair)
        launch = "–"
        if goal is not None and goal.set_by_bench:
            clock = lambda r: time_from_launch(r, goal.value)  # noqa: E731
            launch = ratio(_of_medians(goal.dist, lamp, clock), paired_ratios(goal.dist, lamp, clock),
                           missing=NOT_REACHED)
        bits = lamp[0].get("bits")
        rows.append(Row(
            bench, "lamp" + (f" {bits}-bit" if bits else ""), _setting(key[1], key[2], key[3]),
            "LAMP against DistDGL",
            bytes=ratio(bytes_ratio(pair), paired_ratios(dist, lamp, net_bytes), ".1f"),
            epoch=ratio(_of_medians(dist, lamp, median_epoch_s), paired_ratios(dist, lamp, median_epoch_s)),
            launch=launch, test=fmt(test_points(pair), "+.2f")))
    return rows


def tma_rows(bench: str, runs: List[dict]) -> List[Row]:
    rows = []
    for key, group, compared in tma_settings(runs):
        bases, target = tma_baseline(group)
        if target is None:
            continue
        clock = lambda r: time_from_launch(r, target)  # noqa: E731
        variants = {name: g for name, g in by_method(compared).items() if name.startswith("tma/")}
        if not variants:
            continue
        speed = {name: _value(_of_medians(bases, g, clock), paired_ratios(bases, g, clock))
                 for name, g in variants.items()}
        test = {name: median(s["test"] for s in g if s.get("test") is not None) for name, g in variants.items()}
        reached = [name for name in variants if speed[name]]
        if reached:
            best = max(reached, key=lambda n: speed[n])
            why = f"fastest of {len(variants)}" if len(variants) > 1 else ""
        else:
            best = max(variants, key=lambda n: (test[n] is not None, test[n] or 0.0))
            why = f"best test of {len(variants)}" if len(variants) > 1 else ""
        base_test = median(s["test"] for s in bases if s.get("test") is not None)
        diff = (test[best] - base_test) * 100 if None not in (test[best], base_test) else None
        ds, _, bw, layers, model = key
        rows.append(Row(
            bench, best + (f" ({why})" if why else ""), _setting(ds, layers, bw, model), setting_heading(key),
            launch=ratio(_of_medians(bases, variants[best], clock), paired_ratios(bases, variants[best], clock),
                         missing=NOT_REACHED),
            test=fmt(diff, "+.2f")))
    return rows


def prefetch_rows(bench: str, runs: List[dict]) -> List[Row]:
    rows = []
    for ds, layers, bw, name, on, off in prefetch_sides(runs):
        if name != PREFETCH_LOADER or not on or not off:
            continue
        t1, t0 = (median(pooled_epochs(g)) for g in (on, off))
        if not t1 or not t0:
            continue
        b1, b0 = mean_of(on, "app_bytes_per_batch"), mean_of(off, "app_bytes_per_batch")
        rows.append(Row(
            bench, f"distdgl prefetch 1 ({name})", _setting(ds, layers, bw, "vs prefetch 0"),
            "distdgl: prefetch against the synchronous loop",
            bytes=ratio(b0 / b1 if b0 and b1 else None, [], ".2f"),
            epoch=ratio(t0 / t1, paired_ratios(off, on, median_epoch_s))))
    return rows


def headline_rows(runs_by_bench: Dict[str, List[dict]]) -> List[Row]:
    """Every headline row of the benches' runs (bench name -> its current runs, as_run), bench by
    bench in name order."""
    rows = []
    for bench in sorted(runs_by_bench):
        runs = runs_by_bench[bench]
        rows += lamp_rows(bench, runs)
        if bench in TMA_BENCHES:
            rows += tma_rows(bench, runs)
        rows += prefetch_rows(bench, runs)
    return rows


def headline_table(rows: List[Row], link: Callable[[str, str], str]) -> List[str]:
    """The table's lines under its heading; `link(bench, section)`: the anchor of that section's
    heading in RESULTS.md (`#...`)."""
    if not rows:
        return []
    out = [f"## {HEADING}", "",
           "Each row: a pipeline against distdgl in one setting (dataset, layers, link; TMA: model), "
           "linked to the table that holds its detail. Ratios are distdgl's over the row's: above 1, "
           "the row moves fewer wire bytes per batch, or is faster (median epoch; time from launch to "
           "distdgl's best validation minus one point, where the bench set that target). Over repeats: "
           "the median of the ratios within each repeat (its two sides ran back to back), in brackets "
           "their min–max; with fewer than two such repeats, the ratio of the medians. Test: the row's "
           "test metric at its best validation point minus "
           "distdgl's, in points (medians). lamp's baseline is distdgl at its best (the faster of its "
           "loops where both ran); TMA (same wall-time budget) shows per setting its variant that "
           "reached the target fastest, else the one of the best test, and has no epoch or bytes per "
           "batch to compare; distdgl's prefetching loader is against its synchronous loop, with "
           "application bytes. –: not measured by that bench.", "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        out.append(f"| {r.bench} | [{r.name}]({link(r.bench, r.section)}) | {r.setting} | {r.bytes} | "
                   f"{r.epoch} | {r.launch} | {r.test} |")
    return out + [""]


__all__ = ["COLUMNS", "HEADING", "Row", "headline_rows", "headline_table", "ratio"]
