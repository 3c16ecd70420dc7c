"""Every figure of the report, as PNGs into the results folder; each returns its path, or None
where it has nothing to draw or matplotlib is not installed (`plot_note` then says how to get it).

Every figure draws a method in the same colour (METHOD_COLOURS), names its runs in words
(`labels`) and says its dataset, machines and bandwidth in its title (`fig_title`).
"""
from __future__ import annotations

import zlib
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..records import bandwidth
from ..scale import plot_growth
from .breakdown import PHASES
from .lamp import _bytes_picks, _bytes_vs_layers
from .mpl import plot_note, pyplot
from .runs import failure, label, method


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


def _finish(fig, ax, path: Path) -> Path:
    """Grid, legend, save, close: the end of every one-axis line plot here."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    """Lay out, write the PNG, free the figure: the end of every plot here."""
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return path


def _run_axis(ax, rows: List[dict]) -> None:
    """One horizontal bar per run, top to bottom, named in words, each name in its method's colour."""
    ax.set_yticks(list(range(len(rows))))
    ax.set_yticklabels(labels(rows)[0], fontsize=8)
    for tick, s in zip(ax.get_yticklabels(), rows):
        tick.set_color(colour(s))
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def plot_curves(runs: List[dict], path: Path) -> Optional[Path]:
    groups = defaultdict(list)
    for s in runs:
        if s["_curve"]:
            groups[s.get("dataset")].append(s)
    plt = pyplot()
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
    plt = pyplot()
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


def plot_lamp_bytes(runs: List[dict], path: Path) -> Optional[Path]:
    ok = [s for s in runs if s.get("status") == "ok" and s.get("pipeline") in ("lamp", "distdgl")]
    series = _bytes_vs_layers(ok)
    plt = pyplot()
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


PHASE_COLOURS = {"sampling": "#66c2a5", "owner_wait": "#fc8d62", "compute": "#8da0cb",
                 "allreduce": "#e78ac3", "history": "#a6d854", "other": "#d9d9d9"}

PHASE_NAMES = {"owner_wait": "owner wait", "allreduce": "all-reduce"}


def plot_breakdown(runs: List[dict], path: Path) -> Optional[Path]:
    """One stacked bar per run: the per-batch time by phase."""
    rows = sorted((s for s in runs if s.get("status") == "ok" and s.get("time_per_batch_s")),
                  key=lambda s: (str(s.get("dataset")), s.get("layers") or 0, method(s), s["_rel"]))
    plt = pyplot()
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


def plot_tma(group: List[dict], base: Optional[dict], target: Optional[float], path: Path) -> Optional[Path]:
    """Validation against training time, every method of one dataset and bandwidth (failures dashed)."""
    curves = [s for s in group if s["_curve"]]
    plt = pyplot()
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


def plot_scale(runs: List[dict], path: Path) -> Optional[Path]:
    """bench=scale's growth with graph size (scale.plot_growth), in the report's method colours."""
    return plot_growth(runs, path, pyplot(), colour, _save)
