"""bench=lamp's ablation-owners suites: the gain from distdgl to lamp in steps (halo cache,
lamp's computation on histories, the owners' fresh answers), each over its repeats, and each
step's share of the whole gain."""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional

from ..records import bandwidth
from ..spread import Spread, cell, ratio_cell, spread
from .runs import _beyond_allreduce, hit_epoch_cap, median_epoch_s


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


OWNERS_HEADING = "LAMP: what the owners add"


def owners_section(runs: List[dict], narrow: bool = False, heading: str = OWNERS_HEADING,
                   shares_table: bool = True) -> List[str]:
    """bench=lamp's ablation-owners suites: distdgl, distdgl reading its halo from a local copy,
    lamp with the roots read from the trainer's histories and lamp, at the same dataset, layers
    and bandwidth, each over its repeats (median, min–max); `shares_table`: what each step adds to
    the gain from distdgl to lamp (from the medians). `narrow`: the comparison's columns only
    (RESULTS.md; every column: DETAILS.md and the report)."""
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("lamp", "distdgl")
          and s["_rel"].startswith("ablation-owners")]
    cells: Dict[tuple, Dict[str, List[dict]]] = defaultdict(lambda: defaultdict(list))
    for s in sorted(ok, key=lambda s: s["_rel"]):
        if s["pipeline"] == "lamp" and s.get("bits") not in (None, 8):
            continue
        cells[(s["dataset"], s.get("layers"), bandwidth(s))][_owners_variant(s)].append(s)
    rows, short, shares, capped = [], [], [], []
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
            base = key == "distdgl"  # the baseline's own row: no ratio to itself
            rows.append(f"| {ds} | {layers} | {bw or '–'} | {name} | {len(rs)} | "
                        f"{cell(_kb(spread(r.get('net_bytes_per_batch') for r in rs)), ',.1f')} | "
                        f"{cell(_kb(b), ',.1f')} | {'–' if base else ratio_cell(bd, b, bold=False, spec='.1f')} | "
                        f"{cell(t)} | {'–' if base else ratio_cell(td, t, bold=False)} | "
                        f"{cell(spread(r.get('epochs') for r in rs), 'g')} | {cell(test, '.4f')} | "
                        + ("–" if base else f"{(test.median - testd.median) * 100:+.2f}" if test and testd else "–")
                        + " |")
            short.append(f"| {ds}, L{layers}, {bw or 'unlimited'} | {name} | {cell(_kb(b), ',.1f')} | "
                         f"{'–' if base else ratio_cell(bd, b, bold=False, spec='.1f')} | {cell(t)} | "
                         f"{'–' if base else ratio_cell(td, t, bold=False)} | "
                         + ("–" if base else f"{(test.median - testd.median) * 100:+.2f}" if test and testd else "–")
                         + " |")
            capped += [f"{ds} {name}" for r in rs if hit_epoch_cap(r)]
        if len(medians) == len(OWNERS_STEPS):
            for what, i in (("bytes beyond all-reduce", 0), ("epoch time", 1)):
                values = [medians[k][i] for k, _ in OWNERS_STEPS]
                shares.append(f"| {ds} | {layers} | {bw or '–'} | {what} | " + " | ".join(_share(values)) + " |")
    if not rows:
        return []
    intro = ("The gain from distdgl to lamp in steps (bench=lamp's ablation-owners suites, the same partitions, "
             "seeds and batches): distdgl reading its machine's halo features from a local copy made at setup "
             "(`pipeline.halo_cache=true`: caching alone), lamp with every remote top-hop root read from the "
             "trainer's own quantized histories (`pipeline.roots=histories`: LAMP's computation on local data and "
             "stale halo rows, no owner round trip), and lamp (the owners' fresh answers). Bytes per trainer and "
             "batch on the wire; epoch time the median of a run's "
             "epochs; test at the best validation point, and the difference of its median from distdgl's in "
             "points. Each cell is the median over the runs (min–max); a ratio whose two ranges overlap says so.")
    if narrow:
        out = [f"## {heading}", "", intro + " Every column (runs, bytes in all, epochs, test): DETAILS.md.", "",
               "| setting | variant | beyond all-reduce KB | distdgl / this | epoch s | distdgl / this | "
               "vs distdgl (points) |", "|---|---|---|---|---|---|---|", *short, ""]
    else:
        out = [f"## {heading}", "", intro, "",
               "| dataset | layers | bandwidth | variant | runs | net KB/batch | beyond all-reduce KB | distdgl / this | "
               "epoch s | distdgl / this | epochs | test | vs distdgl (points) |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    out.append("Runs stopped by the epoch cap rather than by patience (not converged): "
               + (", ".join(sorted(set(capped))) + "." if capped else "none."))
    out.append("")
    if shares and shares_table:
        out += ["Each step's share of the gain from distdgl to lamp, from the medians (negative: that step costs "
                f"more than it saves; –: the whole gain is under {SHARE_MIN_GAIN:.0%} of distdgl's, too small to "
                "split):",
                "", "| dataset | layers | bandwidth | measure | halo cache | lamp's computation (histories) | "
                "owners' fresh answers |", "|---|---|---|---|---|---|---|", *shares, ""]
    return out


def _kb(s: Optional[Spread]) -> Optional[Spread]:
    return None if s is None else Spread(s.median / 1024, s.lo / 1024, s.hi / 1024, s.n)
