"""`make demo` (`degnn-demo`, `python -m degnn.demo`): distdgl, lamp and tma trained one after another
on the embedded dataset, then one table.

Builds the synthetic-tiny dataset (offline, OGB layout, read back by ogb's loader), partitions
it (METIS for distdgl and lamp, random for RandomTMA; 2 parts) and starts two machines as network
namespaces on this host (one graph server and one trainer each) for every run: the DistDGL
baseline, LAMP and RandomTMA, with the same 3-layer GraphSAGE, fan-outs and batch size (TMA for a
fixed time budget instead of a number of epochs). Each run prints its own progress; the demo ends
with a table read from the runs' summary.json and one line saying what it shows. Without
permission for network namespaces it falls back to one machine (cluster=local) and says so.

Arguments (`make demo ARGS="train.epochs=5"`) reach every run; a `pipeline.KEY=...` argument only
the runs whose pipeline has that key (`pipeline.bits=4` goes to lamp alone).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from degnn.config import CONF_DIR

# the same model, layers, fan-outs and batch size for every pipeline: a fair byte comparison
COMMON = ["dataset=synthetic-tiny", "model=sage", "model.layers=3", "model.fanouts=[10,10,10]",
          "train.epochs=20", "train.lr=0.01", "train.batch_size=128"]
# (run name, its overrides, what it is)
RUNS: List[Tuple[str, List[str], str]] = [
    ("distdgl", ["pipeline=distdgl"],
     "the DistDGL baseline: trainers sample through the graph servers and pull raw features"),
    ("lamp", ["pipeline=lamp"],
     "LAMP: the owners of a batch's remote neighbours send their hidden states instead"),
    ("tma", ["pipeline=tma", "pipeline.variant=random", "pipeline.time_limit=12s", "pipeline.sync_every=3s"],
     "RandomTMA: one model per machine on its own partition, averaged every 3 s for 12 s"),
]


def netns_permitted() -> bool:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        return False
    probe = f"degnn-probe-{uuid.uuid4().hex[:6]}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


def args_for(pipeline: str, args: Sequence[str]) -> List[str]:
    """The user's arguments for one run: `pipeline.KEY=` ones only where that pipeline has KEY."""
    from hydra.utils import get_class

    from degnn.pipelines import known_pipelines

    schema = get_class(known_pipelines([CONF_DIR])[pipeline]).config_schema
    keys = {f.name for f in dataclasses.fields(schema)} - {"name"}
    if pipeline == "distdgl":
        keys = set()  # its variant is always "default"
    out = []
    for a in args:
        key = a.lstrip("+~").split("=", 1)[0]
        if key.startswith("pipeline.") and key.split(".")[1] not in keys:
            continue
        out.append(a)
    return out


def bytes_per_batch(s: dict) -> Optional[float]:
    """Bytes a trainer sent per training step: on the wire (netns veth counters) while training;
    for TMA, whose local training sends nothing, plus the model averaging between the training
    phases. cluster=local has no wire counters: degnn's own (TMA's include the averaging)."""
    net = s.get("net_bytes_per_batch")
    if net is None:
        return s.get("app_bytes_per_batch")
    if s.get("pipeline") == "tma" and s.get("batches"):
        net += ((s.get("averaging_bytes") or 0) + (s.get("correction_bytes") or 0)) / s["batches"]
    return net


def _name(s: dict, fallback: str) -> str:
    name = s.get("pipeline") or fallback
    if s.get("variant") not in (None, "default"):
        name += f"/{s['variant']}"
    return name


def format_table(runs: Sequence[Tuple[str, dict]]) -> List[str]:
    """(run name, its summary.json or {}) -> the demo's table, one line per run, columns aligned."""
    def num(v, spec):
        return "-" if v is None else format(v, spec)

    head = ("pipeline", "status", "test acc", "KB sent/batch", "train time (s)")
    rows = [head]
    for name, s in runs:
        b = bytes_per_batch(s)
        rows.append((_name(s, name), str(s.get("status", "failed")), num(s.get("test"), ".4f"),
                     num(None if b is None else b / 1024, ",.1f"), num(s.get("train_time_s"), ".1f")))
    width = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for r in rows:
        cells = [r[0].ljust(width[0]), r[1].ljust(width[1])] + [c.rjust(w) for c, w in zip(r[2:], width[2:])]
        lines.append("  ".join(cells).rstrip())
    return lines


def what_it_shows(runs: Sequence[Tuple[str, dict]]) -> str:
    """One line under the table: LAMP's bytes against distdgl's, TMA's averaging, or what went wrong."""
    by = {name: s for name, s in runs}
    failed = [name for name, s in runs if s.get("status") != "ok"]
    if failed:
        return (f"not ok: {', '.join(failed)}; each run's launch.log and rank0.log are in its run "
                f"directory (below)")
    d, lamp, tma = by.get("distdgl"), by.get("lamp"), by.get("tma")
    parts = []
    if d and lamp:
        if (d.get("machines") or 1) < 2:
            parts.append("one machine (cluster=local): no neighbour is remote, so the bytes compare "
                         "nothing; on cluster=netns LAMP sends far fewer")
        else:
            bd, bl = bytes_per_batch(d), bytes_per_batch(lamp)
            if bd and bl:
                text = (f"LAMP sent {bd / bl:.1f}x fewer bytes per batch than distdgl at "
                        f"{lamp.get('layers')} layers")
                ar = d.get("allreduce_bytes_per_batch"), lamp.get("allreduce_bytes_per_batch")
                if None not in ar and bl - ar[1] > 0 and bd > ar[0]:
                    text += (f" ({(bd - ar[0]) / (bl - ar[1]):.0f}x fewer beyond the gradient all-reduce "
                             f"both pay alike)")
                parts.append(text)
    if tma:
        alive = tma.get("trainers_alive", "?")
        parts.append(f"RandomTMA trained each machine on its own partition for {tma.get('train_time_s', 0):.0f}s "
                     f"and sent only model averages ({alive} trainer{'' if alive == 1 else 's'} averaged "
                     f"{tma.get('rounds', '?')} times)")
    return "; ".join(parts) + "." if parts else ""


def read_summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


USAGE = """usage: degnn-demo [KEY=VALUE ...]   (python -m degnn.demo, make demo ARGS="...")

Trains distdgl, lamp and RandomTMA one after another on synthetic-tiny, on 2 machines (network
namespaces on this host; one machine without root), and prints one table. Every KEY=VALUE reaches
every run (a pipeline.KEY=VALUE only the runs whose pipeline has that key), e.g. train.epochs=5.
Runs are written under ./runs/demo/<time>/."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    if netns_permitted():
        cluster = ["cluster=netns", "cluster.machines=2"]
        where = "2 machines (network namespaces on this host)"
    else:
        cluster = ["cluster=local"]
        where = ("one machine (cluster=local): network namespaces are not permitted here (they need "
                 "root and iproute2)")
    demo_dir = Path("runs", "demo", time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    env = dict(os.environ)
    if not sys.stdout.isatty():
        env.setdefault("DEGNN_PROGRESS", "0")  # no progress bars in a captured console
    print(f"degnn demo: distdgl, lamp and tma on synthetic-tiny, {where}; runs in {demo_dir}", flush=True)
    results: List[Tuple[str, dict]] = []
    for i, (name, overrides, what) in enumerate(RUNS, 1):
        print(f"\n=== {i}/{len(RUNS)} {name}: {what} ===", flush=True)
        run_dir = demo_dir / name
        cmd = [sys.executable, "-m", "degnn.launch", *overrides, *COMMON, *cluster, *args_for(name, args),
               f"hydra.run.dir={run_dir}"]
        try:
            subprocess.run(cmd, env=env)
        except KeyboardInterrupt:
            print("degnn demo: interrupted; the launcher removed the run's processes and namespaces",
                  file=sys.stderr, flush=True)
            return 130
        results.append((name, read_summary(run_dir)))
    print("\n" + "\n".join(format_table(results)))
    print(textwrap.fill(what_it_shows(results), width=100, break_on_hyphens=False))
    shown = demo_dir.relative_to(Path.cwd()) if demo_dir.is_relative_to(Path.cwd()) else demo_dir
    print(f"runs: {shown}\nmore: make bench-quick (5 minutes: 2 and 3 layers, 100 mbit, a trainer killed), "
          f"make bench (the full comparison)", flush=True)
    return 0 if all(s.get("status") == "ok" for _, s in results) else 1


if __name__ == "__main__":
    sys.exit(main())
