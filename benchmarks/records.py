"""Committed run records: every bench run's summary as one small JSON line under benchmarks/records/.

After its suites, `python -m benchmarks` appends one line per run to
`benchmarks/records/<bench>.jsonl` (bench.records; null writes none). A record holds the settings
that define the run (the job's overrides, dataset, pipeline and its own settings, layers, fan-outs,
machines, trainers per machine, bandwidth, the per-machine CPU budget, the suite, its repeat and its
position in the repeat's order), where and when it ran (commit, `-dirty` when the tree had
uncommitted changes outside benchmarks/, date), the summary's keys the report reads (big lists and
maps left out) and a compact curve: one line per evaluation with the training time, the time from
launch (docs/benchmarks.md, "Time from launch"), validation and test.

`current(records)` keeps, for every suite, the records of its newest bench invocation: an
invocation runs a suite's whole sweep, so its runs supersede every older run of the suite (git
keeps them), those of a setting the suite no longer has (an override since changed) too.
`as_run(record)` is a record in the shape the report's tables read (benchmarks.report.collect's
run dicts), so RESULTS.md is made from the records alone (benchmarks.results_md).
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from . import CHECKOUT, RECORDS_DIR
# a summary value that is not a scalar is kept when its JSON is at most this long (fan-outs,
# per-epoch times, a phase breakdown); longer ones (per-process peaks) stay in summary.json
MAX_VALUE_CHARS = 600
# kept whatever their length: bench=scale's columns read them (one entry a machine: 8 machines'
# memory splits are about 850 characters)
KEPT_LONG = ("machine_memory_split_mb", "machine_peak_per_share", "machine_fixed_mb")
# the setting of a run besides its overrides: what the record keeps of the run's config.yaml
CONFIG_KEYS = {"model": ("name", "layers", "hidden", "fanouts"),
               "train": ("batch_size", "lr", "epochs", "patience", "min_delta", "time_limit_s", "target_val", "seed"),
               "cluster": ("kind", "machines", "trainers_per_machine", "bandwidth", "cpus_per_machine",
                           "memory_per_machine"),
               "partition": ("method", "num_parts", "seed")}
_REPEAT = re.compile(r"^r(\d+)$")


def git_commit(repo: Path) -> str:
    """The short commit of `repo`, `-dirty` when a tracked file outside benchmarks/ (where a bench
    writes its records and RESULTS.md) has changed; untracked files (a results folder or log the
    user put in the checkout) do not count. "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no",
                                "--", ".", ":!benchmarks"],
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def bandwidth(s: dict) -> Optional[str]:
    """A run's link rate: its summary's, else its config's (cluster.bandwidth); None if unlimited."""
    if s.get("bandwidth") is not None:
        return s["bandwidth"]
    return ((s.get("_config") or {}).get("cluster") or {}).get("bandwidth")


def batches_per_epoch(s: dict) -> float:
    """Batches one trainer runs in an epoch (TMA: in the whole run)."""
    trainers = s.get("trainers") or 1
    epochs = s.get("epochs") or 1
    if s.get("pipeline") == "tma":
        epochs = 1
    return (s.get("batches") or 0) / trainers / epochs


def pulls_ahead(s: dict) -> bool:
    """Whether a distdgl run's prefetching loader pulled the features too (the runs before
    pipeline.prefetch_pull existed did)."""
    return s.get("prefetch_pull") is not False


def loader(s: dict) -> str:
    """A prefetching distdgl run's loader, as the reports name it."""
    if s.get("prefetch_auto"):
        return "auto"  # the first epoch chose between the sampling loader and the synchronous loop
    return "sampling and pull" if pulls_ahead(s) else "sampling"


def loader_label(s: dict) -> str:
    """` (sampling)` or ` (auto)` after a prefetching distdgl run's name; nothing for the loader
    that pulls too (the runs before pipeline.prefetch_pull existed had only it)."""
    name = loader(s) if s.get("prefetch") else "sampling and pull"
    return "" if name == "sampling and pull" else f" ({name})"


def repeat_of(rel: str) -> int:
    """The repeat of a run from its folder (`<suite>/r<k>/<job>`; 0 without a repeat folder)."""
    parts = rel.split("/")
    m = _REPEAT.match(parts[1]) if len(parts) > 2 else None
    return int(m.group(1)) if m else 0


def _small(v) -> bool:
    if v is None or isinstance(v, (str, int, float, bool)):
        return True
    return len(json.dumps(v)) <= MAX_VALUE_CHARS


def _overrides(run_dir: Optional[Path]) -> List[str]:
    path = Path(run_dir) / ".hydra" / "overrides.yaml" if run_dir else None
    if path is None or not path.is_file():
        return []
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.load(path)]


def _round(v, digits: int = 6):
    return round(v, digits) if isinstance(v, float) else v


def compact_curve(s: dict) -> List[dict]:
    """One line per evaluation: training time, time from launch (set-up + training time), the
    validation and test metric, the evaluation's seconds."""
    setup = s.get("setup_s")
    out = []
    for r in s.get("_curve") or ():
        if r.get("val") is None or r.get("train_time_s") is None:
            continue
        line = {"train_time_s": r["train_time_s"],
                "from_launch_s": round(setup + r["train_time_s"], 3) if setup is not None else None,
                "val": _round(r["val"]), "test": _round(r.get("test"))}
        if r.get("eval_s") is not None:
            line["eval_s"] = r["eval_s"]
        out.append(line)
    return out


def make_record(s: dict, bench: str, suite: str, repeat: int, order: int, invocation: str,
                commit: str, host_probe_s: Optional[float] = None) -> dict:
    """The record of one collected run (benchmarks.report.collect's run dict); `host_probe_s`:
    the host's speed before its suite (benchmarks.host_probe)."""
    from .report.summaries import label_tv

    cfg = s.get("_config") or {}
    settings = {group: {k: (cfg.get(group) or {}).get(k) for k in keys if k in (cfg.get(group) or {})}
                for group, keys in CONFIG_KEYS.items()}
    settings["pipeline"] = {k: v for k, v in (cfg.get("pipeline") or {}).items() if _small(v)}
    summary = {k: v for k, v in s.items() if not k.startswith("_") and (_small(v) or k in KEPT_LONG)}
    summary.setdefault("bandwidth", settings["cluster"].get("bandwidth"))
    summary.setdefault("cpus_per_machine", settings["cluster"].get("cpus_per_machine"))
    summary.setdefault("partition_method", settings["partition"].get("method"))
    if summary.get("num_nodes") is None and (cfg.get("dataset") or {}).get("num_nodes"):
        summary["num_nodes"] = cfg["dataset"]["num_nodes"]
    if summary.get("label_tv_mean") is None and label_tv(s) is not None:
        summary["label_tv_mean"] = label_tv(s)
    summary_json = s.get("_dir") and Path(s["_dir"]) / "summary.json"
    date = utc(summary_json.stat().st_mtime) if summary_json and summary_json.is_file() else invocation
    return {"bench": bench, "suite": suite, "repeat": repeat, "order": order, "run": s["_rel"],
            "commit": commit, "invocation": invocation, "date": date,
            "overrides": _overrides(s.get("_dir")), "settings": settings,
            "summary": summary, "curve": compact_curve(s), "host_probe_s": host_probe_s}


def write_records(runs: List[dict], path: Path, bench: str, orders: Dict[Tuple[str, int], int],
                  invocation: str, commit: str, probes: Optional[Dict[Tuple[str, int], float]] = None) -> int:
    """Append every run of this invocation to `path` (one JSON line each); the number written.
    `orders`: (suite, repeat) -> the suite's position in that repeat's order; `probes`: the same
    keys -> the host probe taken before that suite."""
    records = []
    for s in sorted(runs, key=lambda s: s["_rel"]):
        suite, rep = s["_rel"].split("/")[0], repeat_of(s["_rel"])
        if (suite, rep) not in orders:
            continue  # a run of an earlier invocation in the same results folder
        records.append(make_record(s, bench, suite, rep, orders[(suite, rep)], invocation, commit,
                                   (probes or {}).get((suite, rep))))
    return append(path, records)


def append(path: Path, records: List[dict]) -> int:
    """Append `records` to `path`, one compact JSON line each; the number written."""
    if records:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write("".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records))
    return len(records)


def append_measurements(bench: str, repeats: List[List[Tuple[str, dict]]], records_dir: Path) -> Path:
    """Measurements taken outside the launcher (no job overrides, settings or curve) as the records
    of one invocation in `records_dir`/<bench>.jsonl: `repeats[k]` is repeat k's (suite, summary)
    pairs in the order they ran, each summary with its `date`."""
    invocation, commit = utc(time.time()), git_commit(CHECKOUT)
    path = Path(records_dir) / f"{bench}.jsonl"
    append(path, [{"bench": bench, "suite": suite, "repeat": rep, "order": order, "run": f"{suite}/r{rep}",
                   "commit": commit, "invocation": invocation, "date": summary["date"], "overrides": [],
                   "settings": {}, "curve": [], "summary": summary}
                  for rep, repeat in enumerate(repeats) for order, (suite, summary) in enumerate(repeat)])
    return path


def read_records(root: Path) -> List[dict]:
    """Every record of every `<bench>.jsonl` under `root`, in file and line order."""
    out = []
    for path in sorted(Path(root).glob("*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError as e:
                    raise ValueError(f"{path}:{n}: not a JSON record ({e}); fix or remove the line") from None
    return out


def setting(r: dict) -> tuple:
    """What defines a run apart from when it ran and its repeat: bench, suite and the job's
    overrides (the settings the report groups by follow from them at one commit)."""
    if r.get("overrides"):
        return (r["bench"], r["suite"], tuple(o for o in r["overrides"] if not derived(o, r["overrides"])))
    parts = r["run"].split("/")
    return (r["bench"], r["suite"], "/".join(p for p in parts if not _REPEAT.match(p)))


def derived(override: str, overrides: List[str]) -> bool:
    """Whether an override was set by the bench from another suite's runs (a time-to-target
    suite's target and epoch cap: benchmarks/__main__.py, targets) rather than by the suite."""
    if not any(o.startswith("train.target_val=") for o in overrides):
        return False
    return override.startswith(("train.target_val=", "train.epochs="))


def current(records: Iterable[dict]) -> List[dict]:
    """The records of each suite's newest invocation (every setting and repeat of it)."""
    records = list(records)
    newest: Dict[tuple, str] = {}
    for r in records:
        newest[_suite(r)] = max(newest.get(_suite(r), ""), r["invocation"])
    return [r for r in records if r["invocation"] == newest[_suite(r)]]


def _suite(r: dict) -> tuple:
    return r["bench"], r["suite"]


def as_run(r: dict) -> dict:
    """A record as a run dict of the report (summary keys, `_rel`, `_curve`, `_config`)."""
    run = dict(r["summary"])
    run.update({"_rel": r["run"], "_curve": list(r.get("curve") or ()), "_dir": None,
                "_config": r.get("settings") or {}, "_record": r})
    run.setdefault("repeat", r.get("repeat", 0))
    run.setdefault("order", r.get("order", 0))
    return run
