"""Peak memory and time of the streaming generator and random partitioner by graph size.

`python -m benchmarks.chunked_scale WORKDIR [NODES ...]` generates a chunked planted-community graph
(avg_degree 20, 128-dim features, 16 classes) of each size, partitions it randomly into 8 parts, each
in a process of its own under `/usr/bin/time -v` (its peak RSS and wall/CPU seconds), appends one
line per step to benchmarks/records/chunked/chunked.jsonl and removes the graph and the partition before
the next size. `python -m benchmarks.chunked_scale --table` prints the records as the table in
docs/benchmarks.md ("Chunked graphs: the streaming generator and partitioner"), with the exponent
of time vs edges fitted by least squares on log-log (`fit`).
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# beside the benches' records, not among them: these are no launcher runs (read_records reads *.jsonl there)
RECORDS = REPO / "benchmarks" / "records" / "chunked" / "chunked.jsonl"
SPEC = {"num_classes": 16, "feat_dim": 128, "avg_degree": 20.0}
PARTS = 8
BUDGET_MB = 2048


def _timed(cmd) -> dict:
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-2000:]}")
    v = {}
    for key, pat in (("peak_rss_mb", r"Maximum resident set size \(kbytes\): (\d+)"),
                     ("user_s", r"User time \(seconds\): ([\d.]+)"), ("sys_s", r"System time \(seconds\): ([\d.]+)")):
        v[key] = float(re.search(pat, r.stderr).group(1))
    v["peak_rss_mb"] = round(v["peak_rss_mb"] / 1024, 1)
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", r.stderr).group(1).split(":")
    v["wall_s"] = round(sum(float(x) * 60 ** i for i, x in enumerate(reversed(m))), 2)
    return v


def _size_mb(p: Path) -> float:
    return round(sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2 ** 20, 1)


def measure(work: Path, n: int) -> None:
    g, out = work / f"g{n}", work / f"p{n}"
    shutil.rmtree(g, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    py = sys.executable
    gen = _timed([py, "-m", "degnn.data.synthetic_stream", str(g), json.dumps({"num_nodes": n, **SPEC}), str(BUDGET_MB)])
    meta = json.loads((g / "metadata.json").read_text())
    edges = sum(meta["num_edges_per_chunk"][0])
    base = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "nodes": n, "edges": edges, "budget_mb": BUDGET_MB, **SPEC}
    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    with open(RECORDS, "a") as f:
        f.write(json.dumps({**base, "step": "generate", "disk_mb": _size_mb(g), **gen}) + "\n")
    part = _timed([py, "-m", "partitioners.stream_random", str(g), str(out), str(PARTS), str(BUDGET_MB)])
    with open(RECORDS, "a") as f:
        f.write(json.dumps({**base, "step": "partition", "parts": PARTS, "disk_mb": _size_mb(out), **part}) + "\n")
    shutil.rmtree(g, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)


def _rows():
    return [json.loads(l) for l in RECORDS.read_text().splitlines() if l.strip()]


def fit(step: str, max_nodes: int = 1 << 62):
    """(exponent of wall time vs edges, of CPU time vs edges) over the records of `step`."""
    rows = [r for r in _rows() if r["step"] == step and r["nodes"] <= max_nodes]
    out = []
    for key in ("wall_s", "cpu_s"):
        xs = [math.log(r["edges"]) for r in rows]
        ys = [math.log(r["wall_s"] if key == "wall_s" else r["user_s"] + r["sys_s"]) for r in rows]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        out.append(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs))
    return out


def table() -> str:
    lines = ["| step | nodes | edges | parts | peak RSS (MiB) | wall (s) | CPU (s) | on disk (MiB) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(_rows(), key=lambda r: (r["step"] != "generate", r["nodes"], r["date"])):
        lines.append(f"| {r['step']} | {r['nodes']:,} | {r['edges']:,} | {r.get('parts', '-')} | {r['peak_rss_mb']:.0f} "
                     f"| {r['wall_s']:.0f} | {r['user_s'] + r['sys_s']:.0f} | {r['disk_mb']:.0f} |")
    for step in ("generate", "partition"):
        w, c = fit(step)
        lines.append(f"\n{step}: time ~ edges^{w:.2f} (wall), edges^{c:.2f} (CPU)")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(table())
        sys.exit(0)
    work = Path(sys.argv[1])
    work.mkdir(parents=True, exist_ok=True)
    for n in [int(float(x)) for x in sys.argv[2:]] or [1_000_000, 2_000_000, 4_000_000, 8_000_000]:
        measure(work, n)
        print(f"{n} nodes done", flush=True)
