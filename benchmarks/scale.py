"""The report's "Growth with graph size" section (bench=scale): the size ladder's numbers per rung
and pipeline, each quantity's growth fitted as a log-log slope against the number of nodes
(value ~ nodes ** slope: 1 is linear, 0 flat), the slopes in a table and the curves in one plot.

A run belongs to the ladder when its dataset is one of the `synthetic-scale-*` graphs or the
streaming generator's `synthetic-chunked-*` (a rung's series says its machines); its size is
the number of nodes in its config.yaml (`dataset.num_nodes`), or in its dataset option file.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from degnn.config import CONF_DIR

LADDER_PREFIX = ("synthetic-scale-", "synthetic-chunked-")
LADDER_BATCH = 1024  # the ladder's batch size (bench=scale); a run with another is a series of its own


def nodes(s: dict) -> Optional[int]:
    """The run's graph size in nodes: the summary's `num_nodes`, else its config's dataset's,
    else (a run that failed before writing its config) the dataset option's of that name."""
    n = s.get("num_nodes") or ((s.get("_config") or {}).get("dataset") or {}).get("num_nodes")
    if not n and str(s.get("dataset", "")).startswith(LADDER_PREFIX):
        option = Path(CONF_DIR, "dataset", f"{s['dataset']}.yaml")
        if option.is_file():
            from omegaconf import OmegaConf

            n = OmegaConf.load(option).get("num_nodes")
    return int(n) if n else None


def _max(values) -> Optional[float]:
    values = [v for v in values or () if v is not None]
    return max(values) if values else None


def median_eval_s(s: dict) -> Optional[float]:
    """Seconds of one evaluation (TMA: of a round's), the median over the run's curve lines."""
    times = sorted(r["eval_s"] for r in s.get("_curve") or () if r.get("eval_s") is not None)
    if not times:
        return None
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


def _mib(v) -> Optional[float]:
    return None if v is None else v / 2**20


def _at_peak(key: str) -> Callable[[dict], Optional[float]]:
    """A part of the memory split (`machine_memory_split_mb`) of the run's machine with the
    highest peak: what that peak was made of."""
    def value(s: dict) -> Optional[float]:
        split = [m for m in s.get("machine_memory_split_mb") or () if m and m.get("peak") is not None]
        return max(split, key=lambda m: m["peak"])[key] if split else None
    return value


# (column, unit, the value of a run): every quantity of the ladder table and the fits
QUANTITIES: List[Tuple[str, str, Callable[[dict], Optional[float]]]] = [
    ("partition", "s", lambda s: s.get("partition_s")),
    ("partition peak", "MiB", lambda s: s.get("partition_peak_rss_mb")),
    ("set-up", "s", lambda s: s.get("setup_s")),
    ("set-up bytes", "MiB", lambda s: _mib(s.get("setup_bytes"))),
    ("set-up wire", "MiB", lambda s: _mib(s.get("setup_net_bytes"))),
    ("set-up peak", "MiB", lambda s: s.get("setup_peak_rss_mb")),
    ("server peak", "MiB", lambda s: s.get("peak_rss_mb_server")),
    ("trainer peak", "MiB", lambda s: s.get("peak_rss_mb_trainer")),
    ("machine peak", "MiB", lambda s: _max(s.get("machine_peak_memory_mb"))),
    ("its process", "MiB", _at_peak("process")),
    ("its shmem", "MiB", _at_peak("shmem")),
    ("its page cache", "MiB", _at_peak("page_cache")),
    ("peak / share", "x", lambda s: _max(s.get("machine_peak_per_share"))),
    ("fixed part", "MiB", lambda s: _max(s.get("machine_fixed_mb"))),
    ("epoch / round", "s", lambda s: s.get("epoch_time_s")),
    ("evaluation", "s", median_eval_s),
    ("wire per batch", "KiB", lambda s: None if s.get("net_bytes_per_batch") is None
     else s["net_bytes_per_batch"] / 1024),
]


def _layers(s: dict):
    """The run's layers: its summary's, else (a run that failed at start) its `model.layers=` override."""
    if s.get("layers") is not None:
        return s["layers"]
    over = (s.get("_record") or {}).get("overrides") or ()
    return next((o.split("=", 1)[1] for o in over if o.startswith("model.layers=")), None)


def _batch_size(s: dict):
    """The run's train.batch_size: its config's, else its `train.batch_size=` override."""
    b = ((s.get("_config") or {}).get("train") or {}).get("batch_size")
    if b is not None:
        return int(b)
    over = (s.get("_record") or {}).get("overrides") or ()
    return next((int(o.split("=", 1)[1]) for o in over if o.startswith("train.batch_size=")), None)


def series_name(s: dict) -> str:
    """pipeline[/variant] L<layers>, and B<batch size> where not 1024 and M<machines> where not 4
    (each a series of its own: a batch's working set and bytes depend on both)."""
    name = s.get("pipeline", "?")
    if s.get("variant") not in (None, "default"):
        name += f"/{s['variant']}"
    name += f" L{_layers(s)}"
    if _batch_size(s) not in (None, LADDER_BATCH):
        name += f" B{_batch_size(s)}"
    return name if s.get("machines", 4) == 4 else f"{name} M{s['machines']}"


def ladder_runs(runs: List[dict]) -> List[dict]:
    return [s for s in runs if str(s.get("dataset", "")).startswith(LADDER_PREFIX) and nodes(s)]


def log_slope(points: List[Tuple[float, float]]) -> Optional[float]:
    """The least-squares slope of log(value) against log(size); None under two distinct sizes
    with a positive value."""
    import numpy as np

    pts = [(x, y) for x, y in points if x and y is not None and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    xs, ys = zip(*pts)
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def growth(runs: List[dict]) -> Dict[str, Dict[str, Optional[float]]]:
    """{series: {quantity: fitted exponent}} over the ladder's successful runs."""
    by: Dict[str, List[dict]] = defaultdict(list)
    for s in ladder_runs(runs):
        if s.get("status") == "ok":
            by[series_name(s)].append(s)
    return {name: {q: log_slope([(nodes(s), f(s)) for s in group]) for q, _, f in QUANTITIES}
            for name, group in sorted(by.items())}


def _cell(v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 else (f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}")


def _limit(s: dict) -> str:
    v = s.get("memory_per_machine_mb")
    return "–" if v is None else f"{v / 1024:g} GiB"


def scale_section(runs: List[dict], results: Path, plot: Callable) -> List[str]:
    ladder = ladder_runs(runs)
    if not ladder:
        return []
    out = ["## Growth with graph size", "",
           "The bench=scale ladder: one row per run (4 machines, batch 1024; M8: 8 machines, B512: batch 512). Partition: the partitioner's own "
           "numbers when it built the run's partition (assignment and writing; its process's peak "
           "RSS, the whole graph included). Set-up: before the first training batch (slowest "
           "trainer; bytes degnn counted and bytes the links sent, all trainers; largest trainer's "
           "peak RSS). Server / trainer peak: the "
           "largest process of each kind over the run (peak RSS: shared memory counted in every "
           "process that maps it); machine peak: the largest machine's cgroup (with a memory "
           "limit), and its process / shmem / page cache: what that machine held of each at the "
           "launcher's sample of its highest usage (the kernel's memory besides). Peak / share: "
           "the largest machine peak over the graph's share of a machine (its partition files / "
           "machines); fixed part: the largest of a machine's peak less its own part's files. Epoch: one epoch of the run's batches (TMA: a round). "
           "Evaluation: the median evaluation. Wire per batch: bytes the machines' links sent per "
           "training step.", ""]
    cols = [f"{q} ({u})" for q, u, _ in QUANTITIES]
    out += ["| nodes | run | status | memory limit | " + " | ".join(cols) + " |",
            "|" + "---|" * (4 + len(cols))]
    for s in sorted(ladder, key=lambda s: (nodes(s), series_name(s))):
        status = s.get("status", "?")
        if status != "ok" and s.get("error"):  # the fault line, without this host's log path
            status += f": {s['error'].split('; log: ')[0]}"
        out.append(f"| {nodes(s):,} | {series_name(s)} | {status} | {_limit(s)} | "
                   + " | ".join(_cell(f(s)) for _, _, f in QUANTITIES) + " |")
    fits = growth(runs)
    if fits:
        out += ["", "Fitted exponents: the least-squares slope of log(quantity) against log(nodes) over "
                "the rungs each series finished (1 = grows linearly with the graph, 0 = flat; the "
                "machines are fixed within a series, so a per-process peak at most linear in nodes / machines "
                "has a slope of at most 1).", "",
                "| series | " + " | ".join(q for q, _, _ in QUANTITIES) + " |",
                "|" + "---|" * (1 + len(QUANTITIES))]
        for name, row in fits.items():
            out.append(f"| {name} | " + " | ".join("–" if row[q] is None else f"{row[q]:.2f}"
                                                    for q, _, _ in QUANTITIES) + " |")
    png = plot(runs, results / "scale_growth.png")
    if png:
        out += ["", f"![growth with graph size]({png.name})"]
    return out + [""]


def plot_growth(runs: List[dict], path: Path, plt, colour: Callable, save: Callable) -> Optional[Path]:
    """Every quantity against nodes on log-log axes, one line per series (colour: the method,
    dashed: 3 layers)."""
    ok = [s for s in ladder_runs(runs) if s.get("status") == "ok"]
    if plt is None or not ok:
        return None
    cols = 4
    rows = math.ceil(len(QUANTITIES) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    by: Dict[str, List[dict]] = defaultdict(list)
    for s in ok:
        by[series_name(s)].append(s)
    from matplotlib.ticker import NullFormatter

    for ax, (q, unit, f) in zip(axes.flat, QUANTITIES):
        ax.set_title(f"{q} ({unit})", fontsize=9)
        drawn = False
        for name, group in sorted(by.items()):
            pts = sorted((nodes(s), f(s)) for s in group if f(s) is not None and f(s) > 0)
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, color=colour(group[0]),
                        linestyle="--" if group[0].get("layers", 2) > 2 else "-", label=name)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("nodes", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[len(QUANTITIES):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    for ax in axes.flat:
        h, n = ax.get_legend_handles_labels()
        if len(n) > len(names):
            handles, names = h, n
    if names:
        # below the panels (the saved figure is cropped to what it draws)
        fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(names), 6),
                   fontsize=8)
    fig.suptitle(f"growth with graph size, {_machines(ok)} machines", fontsize=10)
    return save(fig, path)


def _machines(runs: List[dict]) -> str:
    return " / ".join(sorted({str(s.get("machines")) for s in runs}))
