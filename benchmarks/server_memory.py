"""A graph server's own memory while it loads its part: the mapped CSC file against DGL's graph.dgl.

`python -m benchmarks.server_memory WORKDIR [NODES]` generates a chunked planted-community graph
(NODES, default 1M; 20 edges a node, 128-dim features), partitions it randomly into 2 parts in
passes (partitioners/stream_random.py), and loads part 0 the way DGL's DistGraphServer does before
it serves (load_partition, the CSC format, the copy into shared memory: `LOAD_PART`), each load in
a process of its own: with degnn's map of the part's CSC file (degnn/part_csc.py) and with DGL's
reader of graph.dgl, 3 repeats in alternating order. A load samples its anonymous memory (RssAnon:
heap and tensors, not the mapped file's pages nor shared memory) every 5 ms; its record has that
peak above the imports, the value after each step, the process's peak RSS (VmHWM, mapped pages
included) and the seconds. Lines are appended to benchmarks/records/chunked/server_memory.jsonl;
`python -m benchmarks.server_memory --table` prints them as docs/benchmarks.md has them.
"""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "benchmarks" / "records" / "chunked" / "server_memory.jsonl"
SPEC = {"num_classes": 16, "feat_dim": 128, "avg_degree": 20.0}
ORDERS = (("mapped", "dgl"), ("dgl", "mapped"), ("mapped", "dgl"))

# argv: part config json, "mapped" or "dgl"; prints one JSON line (MiB above the imports)
LOAD_PART = r"""
import json, os, sys, threading, time
def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) >> 10
import dgl, torch
from dgl.distributed import partition
from degnn.compat import copy_graph_to_shared_mem
if sys.argv[2] == "mapped":
    from degnn.runtime import mapped_feats
    mapped_feats.install()
base = status("RssAnon")
peak = [base]
def sample():
    while True:
        peak[0] = max(peak[0], status("RssAnon"))
        time.sleep(0.005)
threading.Thread(target=sample, daemon=True).start()
t0 = time.perf_counter()
# what DGL's DistGraphServer does with its part's graph before it serves (graph_format csc)
g = partition.load_partition(sys.argv[1], 0, load_feats=False)[0]
loaded = status("RssAnon") - base
g = g.formats("csc")
g.create_formats_()
formats = status("RssAnon") - base
shared = copy_graph_to_shared_mem(g, f"load-part-{os.getpid()}", "csc")
del g
seconds = time.perf_counter() - t0
time.sleep(0.02)
print(json.dumps({"loaded": loaded, "formats": formats, "copied": status("RssAnon") - base,
                  "peak_anon": max(peak[0], status("RssAnon")) - base, "vm_hwm": status("VmHWM"),
                  "seconds": round(seconds, 2), "edges": shared.num_edges(), "part_nodes": shared.num_nodes()}))
import glob  # DGL leaves the segments in /dev/shm when the process ends: a server's are the launcher's to remove
for f in glob.glob(f"/dev/shm/load-part-{os.getpid()}*"):
    os.unlink(f)
"""


def load_part(part_config: Path, how: str) -> dict:
    """One load of part 0 in a fresh process ("mapped": degnn's server; "dgl": DGL's reader)."""
    r = subprocess.run([sys.executable, "-c", LOAD_PART, str(part_config), how], cwd=REPO,
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"loading {part_config} ({how}) failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(work: Path, n: int) -> None:
    g, out = work / f"g{n}", work / f"p{n}"
    if not (out / "COMPLETE").exists():  # a partition an interrupted measurement left is reused
        for d in (g, out):
            shutil.rmtree(d, ignore_errors=True)
        py = sys.executable
        subprocess.run([py, "-m", "degnn.data.synthetic_stream", str(g), json.dumps({"num_nodes": n, **SPEC}),
                        "2048"], cwd=REPO, check=True)
        subprocess.run([py, "-m", "partitioners.stream_random", str(g), str(out), "2", "2048", "0"], cwd=REPO,
                       check=True)
    config = out / f"{out.name}.json"
    part0 = out / "part0"
    base = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "nodes": n, "parts": 2,
            "graph_dgl_mb": round((part0 / "graph.dgl").stat().st_size / 2**20, 1),
            "csc_file_mb": round((part0 / "graph_csc.dgl").stat().st_size / 2**20, 1)}
    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    for repeat, order in enumerate(ORDERS):
        for how in order:
            rec = {**base, "repeat": repeat, "load": how, **load_part(config, how)}
            with open(RECORDS, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(json.dumps(rec), flush=True)
    shutil.rmtree(g, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)


def table() -> str:
    recs = [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]
    rows = ["| graph's nodes | part 0: nodes, edges (halo included); graph.dgl, CSC file (MiB) | load | "
            "heap peak (MiB) | heap after the copy | peak RSS | seconds |", "|---|---|---|---|---|---|---|"]
    for n in sorted({r["nodes"] for r in recs}):
        for how in ("dgl", "mapped"):
            rs = [r for r in recs if r["nodes"] == n and r["load"] == how]
            if not rs:
                continue

            def cell(key):
                v = [r[key] for r in rs]
                return f"{statistics.median(v):g} ({min(v):g}-{max(v):g})"
            r0 = rs[0]
            part = f"{r0['part_nodes']:,}, {r0['edges']:,}; {r0['graph_dgl_mb']}, {r0['csc_file_mb']}"
            load = "DGL reads graph.dgl" if how == "dgl" else "degnn maps the CSC file"
            rows.append(f"| {n:,} | {part} | {load} | {cell('peak_anon')} | {cell('copied')} | {cell('vm_hwm')} | "
                        f"{cell('seconds')} |")
    loads = len(recs) // max(1, 2 * len({r["nodes"] for r in recs}))
    return "\n".join(rows) + f"\n\nMedians (min-max) of {loads} loads each, in alternating order."


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(table())
    else:
        work = Path(sys.argv[1])
        work.mkdir(parents=True, exist_ok=True)
        for n in [int(float(a)) for a in sys.argv[2:]] or [1_000_000]:
            measure(work, n)
