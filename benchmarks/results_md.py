"""benchmarks/RESULTS.md and benchmarks/DETAILS.md from the committed run records alone
(benchmarks.records).

`python -m benchmarks.results_md [--records DIR] [--out FILE]` writes RESULTS.md: after its
header, the headline table (benchmarks.report.headline: one row per comparison against distdgl,
each linking to the section that holds its detail), then one section per bench with current
records: a sentence saying which runs, commits, dates, repeats and per-machine CPU budget its
tables come from, one line linking to its tables in DETAILS.md, and the report's narrow
per-setting comparison tables (benchmarks.report.sections) over those runs; and a list of the
benches without current records, with the command that makes them. The wide per-run tables
(DETAIL_SECTIONS: every column of the LAMP, prefetch and owners tables, every TMA run, the link
table, the LAMP ablations, the size ladder, where each run's batch time goes, the projection's
check and grids except in bench=projection, whose subject they are, and how the repeats agree) go
to DETAILS.md beside it, one section per bench. Nothing in
either is typed by hand and nothing depends on the machine it is generated on: tests/test_results_md.py checks that the
committed files are what this writes from the committed records.
"""
from __future__ import annotations

import argparse
import sys
import unicodedata
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

from . import CHECKOUT
from .records import RECORDS_DIR, as_run, current, loader_label, read_records

RESULTS = CHECKOUT / "benchmarks" / "RESULTS.md"
DETAILS_NAME = "DETAILS.md"  # beside RESULTS.md
# the report's sections that go to DETAILS.md: the wide per-run tables (bench=projection keeps its
# projection, the subject of that bench); RESULTS.md keeps the narrow per-setting comparisons
DETAIL_SECTIONS = ("prefetch_columns", "link", "tma_runs", "lamp_columns", "lamp_ablations", "owners_columns",
                   "breakdown", "scale", "projection")
AGREEMENT = "Agreement of repeats"  # repeat_spread's heading, a DETAILS.md section too


def bench_names() -> List[str]:
    """Every bench option (benchmarks/conf/bench/*.yaml), by its `name`."""
    from omegaconf import OmegaConf

    from .config import BENCH_CONF_DIR

    return sorted(str(OmegaConf.load(p).get("name", p.stem)) for p in Path(BENCH_CONF_DIR, "bench").glob("*.yaml"))


def _demote(lines: List[str]) -> List[str]:
    """The report's sections one heading level down (under the bench's own heading)."""
    return ["#" + line if line.startswith("#") else line for line in lines]


def _joined(values) -> str:
    return ", ".join(sorted({str(v) for v in values}))


def provenance(records: List[dict]) -> str:
    """Which runs a bench's tables come from: runs, suites, repeats, commits, dates, CPU budget."""
    suites = sorted({r["suite"] for r in records})
    repeats = max(r.get("repeat", 0) for r in records) + 1
    dates = sorted(r["date"] for r in records)
    # a run that failed before writing its config.yaml has its cluster in its overrides only
    netns = [r for r in records if (r.get("settings") or {}).get("cluster", {}).get("kind") == "netns"
             or "cluster=netns" in (r.get("overrides") or ())]
    cpus = {r["summary"].get("cpus_per_machine") for r in netns}
    budgets = sorted(c for c in cpus if c is not None)
    budget = ("every netns machine limited to " + " / ".join(f"{c:g}" for c in budgets)
              + " CPUs (cluster.cpus_per_machine)") if budgets else ""
    if None in cpus:
        budget += ("; " if budget else "") + "some clusters without a CPU budget (a machine may use every core)"
    # the order the records say the suites ran in, repeat by repeat
    # (over the suites every repeat ran: a suite of fewer repeats says nothing of the order)
    runs_in = defaultdict(set)
    for r in records:
        runs_in[r.get("repeat", 0)].add((r.get("order", 0), r["suite"]))
    common = set.intersection(*({name for _, name in v} for v in runs_in.values()))
    orders = {tuple(name for _, name in sorted(v) if name in common) for v in runs_in.values()}
    if repeats == 1:
        order = "one repeat, one order"
    elif len(orders) > 1:
        order = f"{repeats} repeats, every other one with the suites in reverse order"
    else:
        order = f"{repeats} repeats, all in the same order"

    return (f"{len(records)} runs of {len(suites)} suites ({', '.join(suites)}); {order}; commit "
            f"{_joined(r['commit'] for r in records)}; run {dates[0][:16].replace('T', ' ')} – "
            f"{dates[-1][:16].replace('T', ' ')} UTC; {budget or 'no CPU budget'}. Where a table gives "
            "no min–max over repeats, a row is one run.")


def repeat_spread(records: List[dict]) -> List[str]:
    """How far a setting's repeats agree: the median epoch time (TMA: round) of each repeat, the
    median and min–max over them, (max − min) / median, and the same share of the host probe
    taken before those repeats' suites (benchmarks.host_probe), where the records have it."""
    from . import report
    from .records import setting
    from .spread import cell, share, spread

    by: Dict[tuple, List[dict]] = defaultdict(list)
    for r in records:
        if r["summary"].get("status") == "ok":
            by[setting(r)].append(r)
    rows = []
    for key in sorted(by, key=str):
        group = by[key]
        s = spread(report.median_epoch_s(r["summary"]) for r in group)
        if s is None or s.n < 2:
            continue
        run = as_run(group[0])
        # a run label's CPU budgets, and distdgl's two loops, are settings of their own
        cpus, prefetch = run.get("cpus_per_machine"), run.get("prefetch")
        name = report.label(run) + (f" {cpus:g} CPUs" if cpus else "")
        if run.get("pipeline") == "distdgl" and prefetch is not None:
            name += f" prefetch {prefetch}" + loader_label(run)
        host = spread(r.get("host_probe_s") for r in group)
        rows.append(f"| {group[0]['suite']} | {name} | {s.n} | {cell(s)} | {share(s)} | "
                    f"{share(host) if host is not None and host.n == s.n else '–'} |")
    if not rows:
        return []
    lines = [f"## {AGREEMENT}", "",
             "Each setting's epoch time (a run's median epoch; TMA: its round) over its repeats: the "
             "median, the min–max, and the min–max as a share of the median; beside it the same share "
             "of the host's own single-core speed, timed before each of those runs' suites (the host "
             "probe: docs/benchmarks.md, \"Agreement of repeats\").", "",
             "| suite | run | repeats | epoch s | spread (of the median) | host probe spread |",
             "|---|---|---|---|---|---|", *rows, ""]
    probes = spread(r.get("host_probe_s") for r in records)
    if probes is not None and probes.n > 1:
        lines += [f"Host probe over the bench's {probes.n} runs: {cell(probes, '.3f')} s, a "
                  f"{share(probes)} spread.", ""]
    return lines


def slug(heading: str) -> str:
    """A heading's anchor as GitHub renders it: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in heading.strip().lower()
                   if c.isalnum() or c in "-_ " or unicodedata.category(c).startswith("M"))
    return kept.replace(" ", "-")


def anchors(lines: List[str]) -> Dict[tuple, str]:
    """(bench, heading) -> `#anchor` for every heading of a document, its bench the `## bench=NAME`
    it stands under ("" before the first); a heading's second and later occurrences in the
    document get GitHub's `-1`, `-2`, ... ."""
    seen: Dict[str, int] = defaultdict(int)
    out: Dict[tuple, str] = {}
    bench = ""
    for line in lines:
        if not line.startswith("#"):
            continue
        text = line.lstrip("#").strip()
        if line.startswith("## bench="):
            bench = text[len("bench="):]
        base = slug(text)
        anchor = base if not seen[base] else f"{base}-{seen[base]}"
        seen[base] += 1
        out.setdefault((bench, text), "#" + anchor)
    return out


def _is_detail(bench: str, section: str) -> bool:
    return section in DETAIL_SECTIONS and not (bench == "projection" and section == "projection")


def bench_parts(name: str, records: List[dict]) -> tuple:
    """A bench's RESULTS.md body and its DETAILS.md body (lines, without headings of their own)."""
    from . import report

    runs = [as_run(r) for r in sorted(records, key=lambda r: r["run"])]
    parts = report.sections(runs)
    main = [line for section, lines in parts if not _is_detail(name, section) for line in lines]
    detail = [line for section, lines in parts if _is_detail(name, section) for line in lines]
    return main, detail + repeat_spread(records)


def bench_section(name: str, records: List[dict], parts: Optional[tuple] = None,
                  detail_anchors: Optional[Dict[tuple, str]] = None) -> List[str]:
    """A bench's RESULTS.md section, with one line linking to each of its tables in DETAILS.md
    (`detail_anchors`: anchors(DETAILS.md's lines); without it, to the bench's section there)."""
    body, detail = parts or bench_parts(name, records)
    if not body:
        body = ["No comparison table for these runs; their summaries are in the records.", ""]
    more = []
    if detail:
        where = detail_anchors or {}
        links = [f"[{h}]({DETAILS_NAME}{where.get((name, h), '#bench' + name)})"
                 for h in (line[3:].strip() for line in detail if line.startswith("## "))]
        more = [f"In {DETAILS_NAME}: " + " · ".join(links) + ".", ""]
    return [f"## bench={name}", "", provenance(records), "", *more, *_demote(body)]


def _by_bench(records: List[dict]) -> Dict[str, List[dict]]:
    by: Dict[str, List[dict]] = defaultdict(list)
    for r in current(records):
        by[r["bench"]].append(r)
    return by


def all_parts(records: List[dict]) -> Dict[str, tuple]:
    """Each bench's `bench_parts` of the current records, built once for both files."""
    by = _by_bench(records)
    return {name: bench_parts(name, by[name]) for name in sorted(by)}


def details_lines(records: List[dict], parts: Optional[Dict[str, tuple]] = None) -> List[str]:
    lines = ["# Benchmark details", "",
             "Generated with [RESULTS.md](RESULTS.md) by `python -m benchmarks.results_md`, from the same "
             "current records: each bench's wide tables that RESULTS.md leaves out to stay short "
             "(every column of the LAMP, prefetch and owners tables, every TMA run, the link table, the "
             "LAMP ablations, the size ladder, where each run's batch time goes, the projection's check "
             "and grids, the agreement of repeats). "
             "Do not edit by hand.", ""]
    by = _by_bench(records)
    parts = parts if parts is not None else all_parts(records)
    for name in sorted(by):
        _, detail = parts[name]
        if detail:
            lines += [f"## bench={name}", "", provenance(by[name]), "", *_demote(detail)]
    return lines


def render_details(records: List[dict], parts: Optional[Dict[str, tuple]] = None) -> str:
    """DETAILS.md: each bench's per-run tables, from the same runs as RESULTS.md (`parts`:
    all_parts(records), when the caller has it already)."""
    return "\n".join(details_lines(records, parts)).rstrip("\n") + "\n"


def render(records: List[dict], benches: List[str], parts: Optional[Dict[str, tuple]] = None) -> str:
    from .report.headline import HEADING, headline_rows, headline_table

    by = _by_bench(records)
    parts = parts if parts is not None else all_parts(records)
    title = "# Benchmark results"
    lines = [title, "",
             "Generated by `python -m benchmarks.results_md` from the run records committed under "
             "`benchmarks/records/` (one JSON line per run, appended by `python -m benchmarks`); "
             "only each setting's newest runs, older ones stay in git. Do not edit by hand: a test "
             "checks that this file is what the generator writes. How records, repeats, CPU budgets "
             "and the time from launch work: [docs/benchmarks.md](../docs/benchmarks.md); each "
             f"bench's wide per-run tables, breakdowns and projection grids: [{DETAILS_NAME}]({DETAILS_NAME}).", ""]
    detail_anchors = anchors(details_lines(records, parts))
    sections = {name: bench_section(name, by[name], parts[name], detail_anchors) for name in sorted(by)}
    # the headline table links into the sections: their anchors in the whole document's order
    where = anchors([title, f"## {HEADING}"] + [line for section in sections.values() for line in section])
    rows = headline_rows({name: [as_run(r) for r in sorted(by[name], key=lambda r: r["run"])] for name in by})
    lines += headline_table(rows, lambda bench, heading: where.get((bench, heading), f"#bench{bench}"))
    # what each bench's section holds, so that a reader finds a table without scrolling through all
    lines += ["Contents:", ""]
    for name, section in sections.items():
        tables = [line.lstrip("#").strip() for line in section if line.startswith("### ")]
        lines.append(f"- [bench={name}](#bench{name}): " + (" · ".join(tables) or "run summaries"))
    lines.append("")
    for section in sections.values():
        lines += section
    missing = [b for b in benches if b not in by]
    if missing:
        lines += ["## Benches without current records", "",
                  "Run one with `python -m benchmarks bench=NAME` (it appends its records to "
                  "`benchmarks/records/NAME.jsonl`), then `python -m benchmarks.results_md`, and "
                  "commit both:", ""]
        lines += [f"- `bench={b}`" for b in missing]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def write_results(records_dir: Path = RECORDS_DIR, out: Path = RESULTS) -> List[Path]:
    """RESULTS.md at `out` and DETAILS.md beside it."""
    out = Path(out)
    records = read_records(Path(records_dir))
    parts = all_parts(records)
    out.write_text(render(records, bench_names(), parts))
    details = out.with_name(DETAILS_NAME)
    details.write_text(render_details(records, parts))
    return [out, details]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.results_md",
                                 description="Write benchmarks/RESULTS.md (and DETAILS.md beside it) from "
                                             "the committed run records.")
    ap.add_argument("--records", default=str(RECORDS_DIR), help="folder of <bench>.jsonl records")
    ap.add_argument("--out", default=str(RESULTS), help="the Markdown file to write (DETAILS.md goes beside it)")
    args = ap.parse_args(argv)
    try:
        print(*write_results(Path(args.records), Path(args.out)), sep="\n")
    except ValueError as e:
        print(f"results_md: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
