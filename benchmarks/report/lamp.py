"""bench=lamp: each lamp setting beside distdgl at its best (`lamp_section`: bytes, epoch time,
accuracy, time to a target, bytes against layers) and every lamp run with its pipeline and fusion
settings (`lamp_ablations`). What the owners add is owners.py."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..records import bandwidth, batches_per_epoch
from ..spread import cell, median, paired, paired_cell, ratio_cell, spread
from .runs import (_beyond_allreduce, _group, ablated, fmt, hit_epoch_cap, kb, median_epoch_s, time_from_launch,
                   time_to_target, train_setting)


LAMP_KNOBS = ("bits", "engine", "prefetch", "fusion", "grad", "sync_budget", "roots")


def converged_source(conv: List[dict]) -> str:
    """Where a converged baseline's target comes from: patience stopped it, or the epoch cap did
    (then the target is its best so far, not a converged one)."""
    epochs = max(d.get("epochs") or 0 for d in conv)
    if any(hit_epoch_cap(d) for d in conv):
        return f"distdgl's {epochs}-epoch run: the epoch cap stopped it, not patience"
    delta = train_setting(conv[0], "min_delta")
    gain = f", a gain under {delta:g} not counted" if delta else ""
    return f"converged: patience {train_setting(conv[0], 'patience')}{gain} stopped distdgl at {epochs} epochs"


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


@dataclass(frozen=True)
class LampPair:
    """One lamp setting and the distdgl runs it is compared with (`which`: best_baseline's note);
    `base`: every distdgl group of the runs, where a converged baseline run is looked up."""
    key: tuple  # (suite group, dataset, layers, bandwidth, *LAMP_KNOBS)
    lamp: List[dict]
    dist: List[dict]
    which: str
    base: Dict[tuple, List[dict]]


def lamp_pairs(runs: List[dict]) -> List[LampPair]:
    """Each lamp setting beside distdgl at its best of the same suite group, dataset and layers, in
    the LAMP table's order (every repeat of either side)."""
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
    pairs = []
    for key in order:
        dist, which = best_baseline(base.get(key[:3], []))
        if dist:
            pairs.append(LampPair(key, settings[key], dist, which, base))
    return pairs


def _med(group: List[dict], f) -> Optional[float]:
    return median(f(r) for r in group if f(r) is not None)


def net_bytes(s: dict) -> Optional[float]:
    return s.get("net_bytes_per_batch")


def bytes_ratio(pair: LampPair) -> Optional[float]:
    """distdgl's median wire bytes per batch over lamp's."""
    n, nd = _med(pair.lamp, net_bytes), _med(pair.dist, net_bytes)
    return nd / n if n and nd else None


def test_points(pair: LampPair) -> Optional[float]:
    """lamp's median test metric minus distdgl's, in points."""
    acc, acc_d = _med(pair.lamp, lambda r: r.get("test")), _med(pair.dist, lambda r: r.get("test"))
    return (acc - acc_d) * 100 if None not in (acc, acc_d) else None


@dataclass(frozen=True)
class LampTarget:
    value: float
    source: str
    dist: List[dict]  # the distdgl runs timed to it
    set_by_bench: bool  # the runs stopped at it, or trained until validation stopped improving


def lamp_target(pair: LampPair) -> Optional[LampTarget]:
    """distdgl's best validation minus one point, the target both sides are timed to: the one the
    runs stopped at (train.target_val, set by the bench from distdgl's converged run), else the
    best of distdgl's own converged run (suite `<group>-converged`) where the bench has one, else
    of the compared distdgl runs; None without distdgl runs with a curve."""
    key, lamp = pair.key, pair.lamp
    dist = [d for d in pair.dist if d.get("best_val") is not None and len([r for r in d["_curve"] if "val" in r]) >= 2]
    if not dist:
        return None
    conv = [d for g, runs in pair.base.items() if g[1:] == key[1:3]
            and (g[0] == f"{key[0]}-converged" or g[0] == "converged") for d in runs if d.get("best_val") is not None]
    stopped_at = {train_setting(r, "target_val") for r in lamp + dist} - {None}
    target = (stopped_at.pop() if len(stopped_at) == 1
              else median(d["best_val"] for d in (conv or dist)) - 0.01)
    patience = bool(train_setting(dist[0], "patience"))
    source = (converged_source(conv) if conv else f"compared runs; {converged_source(dist)}"
              if patience else "compared runs")
    return LampTarget(target, source, dist, bool(stopped_at or conv or patience))


def lamp_section(runs: List[dict], narrow: bool = False, heading: str = "LAMP against DistDGL",
                 growth: bool = True) -> List[str]:
    """bench=lamp: each lamp setting beside the distdgl runs of the same group, dataset and layers
    (every repeat of either: medians, with the min–max where they differ), and their time to a
    target; `growth`: bytes per batch against layers for both pipelines. `narrow`: the comparison's
    columns only (RESULTS.md; every column: DETAILS.md and the report)."""
    pairs = lamp_pairs(runs)
    if not pairs:
        return []
    rows, short = [], []
    for pair in pairs:
        key, lamp, dist, which = pair.key, pair.lamp, pair.dist, pair.which
        s = lamp[0]
        med = _med
        n, nd = med(lamp, net_bytes), med(dist, net_bytes)
        t, td = spread(median_epoch_s(r) for r in lamp), spread(median_epoch_s(r) for r in dist)
        acc, acc_d = med(lamp, lambda r: r.get("test")), med(dist, lambda r: r.get("test"))
        ages = [r.get("history_age_max") for r in lamp if r.get("history_age_max") is not None]
        rows.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {s.get('bits')} | {s.get('epochs')} | "
            f"{kb(nd)} / {kb(n)} | **{bytes_ratio(pair) or float('nan'):.1f}x** | "
            f"{kb(med(dist, _beyond_allreduce))} / {kb(med(lamp, _beyond_allreduce))} | {cell(td)} / {cell(t)} | "
            f"{fmt(acc_d)} / {fmt(acc)} | {fmt(test_points(pair), '+.2f')} | "
            f"{fmt(med(lamp, lambda r: r.get('history_age_mean')), '.1f')} / {max(ages) if ages else '–'} | "
            f"{fmt(med(lamp, lambda r: r.get('roots_per_batch')), '.0f')} | {ratio_cell(td, t, bold=False)} | "
            f"{paired_cell(paired(dist, lamp, median_epoch_s))} | {len(dist)}{which} / {len(lamp)} |")
        short.append(
            f"| {key[0]} | {key[1]} | {key[2]} / {s.get('bits')} | {kb(nd)} / {kb(n)} | "
            f"**{bytes_ratio(pair) or float('nan'):.1f}x** | {cell(td)} / {cell(t)} | "
            f"{paired_cell(paired(dist, lamp, median_epoch_s))} | {fmt(test_points(pair), '+.2f')} | "
            f"{len(dist)}{which} / {len(lamp)} |")
    intro = ("Each lamp setting beside the distdgl runs of the same suite group, dataset and layers (same "
             "partitions, seeds, batch size and epochs). Bytes are on the wire per trainer and batch "
             "(netns veth counters)" + ("" if narrow else ", in all and beyond the gradient all-reduce") +
             "; epoch time is a run's median "
             "epoch; test at the best validation point. Where distdgl ran both synchronous and with its "
             "prefetching loader, the faster of the two is the baseline (the runs column names it). Over repeats: the median, with the min–max in "
             "brackets where the repeats differ" + ("" if narrow else "; a ratio of medians whose two ranges overlap says so") +
             ". Within a repeat the two "
             "ran back to back: the ratio per repeat gives the median, min–max and spread of those ratios.")
    if narrow:
        out = [f"## {heading}", "", intro + " Every column (bytes beyond the all-reduce, history age, roots "
               "per batch, the ratio of the medians): DETAILS.md.", "",
               "| group | dataset | layers / bits | net KB/batch (distdgl / lamp) | distdgl / lamp | "
               "epoch s (distdgl / lamp) | ratio per repeat | test difference (points) | runs (distdgl / lamp) |",
               "|---|---|---|---|---|---|---|---|---|", *short, ""]
    else:
        out = [f"## {heading}", "", intro, "",
               "| group | dataset | layers | bits | epochs | net KB/batch (distdgl / lamp) | distdgl / lamp | "
               "beyond all-reduce KB (distdgl / lamp) | epoch s (distdgl / lamp) | test (distdgl / lamp) | "
               "difference (points) | history age mean / max | roots/batch | epoch time distdgl / lamp | "
               "ratio per repeat | runs (distdgl / lamp) |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    reach = []
    for pair in pairs:
        key, lamp, goal = pair.key, pair.lamp, lamp_target(pair)
        if goal is None:
            continue
        cols = []
        for clock in (time_to_target, time_from_launch):
            td, tl = spread(clock(d, goal.value) for d in goal.dist), spread(clock(s, goal.value) for s in lamp)
            cols += ([f"{cell(td, '.1f')} / {cell(tl, '.1f')}", ratio_cell(td, tl)] if narrow
                     else [cell(td, ".1f"), cell(tl, ".1f"), ratio_cell(td, tl)])
        if narrow:  # from launch within each repeat (the headline table's number)
            cols.append(paired_cell(paired(goal.dist, lamp, lambda r: time_from_launch(r, goal.value))))
        reached = sum(time_to_target(s, goal.value) is not None for s in lamp)
        setting = (f"{key[2]} / {lamp[0].get('bits')}" if narrow else f"{key[2]} | {lamp[0].get('bits')}")
        reach.append(f"| {key[0]} | {key[1]} | {setting} | {goal.value:.4f} ({goal.source}) | "
                     + " | ".join(cols) + f" | {reached} / {len(lamp)} |")
    if reach:
        out += ["Time (s) to distdgl's best validation accuracy minus one point (the median of its "
                "repeats' best; of its own converged run, trained until validation stopped improving, "
                "where the bench has one): training time (evaluation excluded), and from launch (the run's set-up "
                "added: docs/benchmarks.md, \"Time from launch\"); median (min–max) over the repeats "
                "that reached it" + ("; from launch also within each repeat that both reached: the ratios' "
                                     "median, min–max and spread" if narrow else "") + ".", "",
                *(["| group | dataset | layers / bits | target | s (distdgl / lamp) | distdgl / lamp | "
                   "from launch s (distdgl / lamp) | distdgl / lamp from launch | from launch, ratio per repeat | "
                   "lamp runs reaching it |",
                   "|---|---|---|---|---|---|---|---|---|---|"] if narrow else
                  ["| group | dataset | layers | bits | target | distdgl | lamp | distdgl / lamp | "
                   "distdgl from launch | lamp from launch | distdgl / lamp from launch | lamp runs reaching it |",
                   "|---|---|---|---|---|---|---|---|---|---|---|---|"]), *reach, ""]
    if not growth:
        return out
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("lamp", "distdgl") and not ablated(s)]
    grow_rows = []
    for (pipe, ds), pts in sorted(_bytes_vs_layers(ok).items()):
        if len(pts) >= 2:
            (l0, b0), (l1, b1) = pts[0], pts[-1]
            grow_rows.append(f"| {pipe} | {ds} | {l0} -> {l1} | {kb(b0)} | {kb(b1)} | {b1 / b0:.2f}x |")
    if grow_rows:
        out += ["Wire bytes per batch beyond the all-reduce as layers grow (8-bit lamp):", "",
                "| pipeline | dataset | layers | KB/batch before | KB/batch after | growth |",
                "|---|---|---|---|---|---|", *grow_rows, ""]
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
        # an epoch cut to N batches (train.batches_per_epoch, bench=link's distdgl) is not the
        # pass over the training set that a lamp epoch is: no epoch-time ratio then
        dist = [d for d in dist if _same_epochs(d, s)]
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
            "the same dataset, layers and bandwidth (where its epochs are whole passes too: not cut "
            "to a few batches by `train.batches_per_epoch`); epoch time the median (min–max) over repeats, the "
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


def _same_epochs(a: dict, b: dict) -> bool:
    """Whether two runs' epochs are about the same number of batches a trainer (within 1.5x);
    a run that does not say how many batches it ran is taken at its word."""
    na, nb = batches_per_epoch(a), batches_per_epoch(b)
    return not (na and nb) or max(na, nb) / min(na, nb) <= 1.5


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
