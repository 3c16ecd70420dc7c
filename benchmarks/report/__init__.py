"""The benchmark report: every run's summary.json under a results folder -> report.md + PNG plots,
and runs.csv (one row per run, a column per summary key).

`python -m benchmarks.report <results folder>` rewrites the report of an earlier `make bench`.
The plots need matplotlib (`pip install 'degnn[bench]'`); without it the report says so in one line
and has every table.

`sections` lists the report's sections in their order, once: `write_report` writes them with the
plots between them, benchmarks.results_md the same tables without plots (benchmarks/RESULTS.md,
and the per-run breakdowns and projection grids in benchmarks/DETAILS.md).
One file per part:

- summaries.py: `collect` (a results folder -> one dict per run) and runs.csv
- runs.py: what one run is in words and numbers (method, label, median epoch, time to a target),
  and the cell formats `fmt`, `kb`, `mb`
- overview.py: the table of every run; accuracy against one process, bytes as layers grow
- distdgl.py: bench=parity (distdgl beside plain DGL, prefetch against the synchronous loop)
- link.py: bench=link (the TMA paper's Table 1); tma.py: bench=tma (each method's time to the
  target over repeats; every run's row in a section of its own)
- lamp.py: bench=lamp (lamp beside distdgl, its ablations); owners.py: what the owners add
- breakdown.py: where a batch's time goes
- headline.py: the one short table RESULTS.md opens with (each comparison against distdgl, from
  the helpers of the sections above)
- plots.py: every figure, in one colour per method; mpl.py: matplotlib where it is installed
- benchmarks.scale, benchmarks.projection, benchmarks.compute_speed and benchmarks.link_probe:
  the growth, projection, GPU compute-speed and netns link-efficiency sections
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from ..compute_speed import compute_section
from ..link_probe import Efficiencies, network_section
from ..projection import projection_section
from ..scale import scale_section
from .breakdown import breakdown_section
from .distdgl import PREFETCH_HEADING, parity, prefetch_pairs
from .lamp import best_baseline, lamp_ablations, lamp_section
from .link import link_section
from .overview import comparisons, table
from .owners import OWNERS_HEADING, owners_section
from .mpl import plot_note
from .plots import plot_breakdown, plot_bytes, plot_curves, plot_lamp_bytes, plot_scale
from .runs import label, median_epoch_s
from .summaries import collect, label_tv, write_csv
from .tma import tma_runs_section, tma_section

__all__ = ["best_baseline", "breakdown_section", "collect", "comparisons", "label", "label_tv", "lamp_ablations",
           "lamp_section", "link_section", "median_epoch_s", "owners_section", "parity", "plot_note",
           "prefetch_pairs", "sections", "table", "tables", "tma_runs_section", "tma_section", "write_report"]


def _figure(heading: Optional[str], alt: str, png: Optional[Path]) -> List[str]:
    """A figure's lines in the report (under its own heading where it has one); none without it."""
    if not png:
        return []
    return ([f"## {heading}", ""] if heading else []) + [f"![{alt}]({png.name})", ""]


def sections(runs: List[dict], out: Optional[Path] = None) -> List[Tuple[str, List[str]]]:
    """Every comparison section, in the report's order, as (name, lines) (each empty without runs
    of its kind). `out`: the results folder the plots go into, each where it stands between the
    tables; None: the tables alone (benchmarks.results_md)."""
    here = out or Path(".")
    # without a results folder (benchmarks.results_md) the LAMP and prefetch tables come narrow,
    # every column of them in sections of their own (DETAILS.md); the report has every column once
    narrow = out is None
    parts = [("comparisons", comparisons(runs)), ("parity", parity(runs)),
             ("prefetch", prefetch_pairs(runs, narrow=narrow))]
    if narrow:
        parts.append(("prefetch_columns", prefetch_pairs(runs, heading=f"{PREFETCH_HEADING}: every column")))
    parts += [("link", link_section(runs)), ("tma", tma_section(runs, here, plots=out is not None)),
              ("tma_runs", tma_runs_section(runs)), ("lamp", lamp_section(runs, narrow=narrow))]
    if narrow:
        parts.append(("lamp_columns", lamp_section(runs, heading="LAMP against DistDGL: every column", growth=False)))
    parts += [("lamp_ablations", lamp_ablations(runs)), ("owners", owners_section(runs, narrow=narrow))]
    if narrow:
        parts.append(("owners_columns", owners_section(runs, heading=f"{OWNERS_HEADING}: every column",
                                                       shares_table=False)))
    if out is not None:
        figures = _figure("Validation metric against training time", "curves", plot_curves(runs, out / "curves.png"))
        figures += _figure("Bytes per batch", "bytes", plot_bytes(runs, out / "bytes_per_batch.png"))
        figures += _figure("LAMP: bytes per batch against layers", "lamp bytes",
                           plot_lamp_bytes(runs, out / "lamp_bytes_vs_layers.png"))
        parts.append(("figures", figures))
    parts.append(("breakdown", breakdown_section(runs)))
    parts.append(("scale", scale_section(runs, here, plot_scale if out is not None else lambda rs, path: None)))
    if out is not None:
        parts.append(("figures", _figure(None, "time per batch by phase",
                                         plot_breakdown(runs, out / "time_breakdown.png"))))
    parts.append(("projection", projection_section(runs, out, links=Efficiencies.committed())))
    parts.append(("compute", compute_section(runs)))
    parts.append(("network", network_section(runs)))
    return parts


def tables(runs: List[dict], out: Optional[Path] = None) -> List[str]:
    """Every section's lines, in the report's order."""
    return [line for _, lines in sections(runs, out) for line in lines]


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
    lines += tables(runs, results)
    report = results / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report
