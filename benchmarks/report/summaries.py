"""The runs' summaries: `collect` reads every run under a results folder (its summary.json,
config.yaml and validation curve) into one dict per run, the shape every table here reads;
`write_csv` writes them as runs.csv, one row per run and a column per summary key."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Dict, List, Optional

from degnn.metrics import read_curve


def collect(results: Path) -> List[dict]:
    runs = []
    for path in sorted(results.rglob("summary.json")):
        s = json.loads(path.read_text())
        s["_dir"] = path.parent
        s["_rel"] = str(path.parent.relative_to(results))
        s["_curve"] = read_curve(path.parent)
        s["_config"] = run_config(s)
        runs.append(s)
    for path in sorted(results.rglob("launch.log")):  # runs that died before writing a summary
        if not (path.parent / "summary.json").exists():
            runs.append({"_dir": path.parent, "_rel": str(path.parent.relative_to(results)), "status": "failed", "pipeline": "?", "dataset": "?", "_curve": [], "_config": {}})
    return runs


def run_config(s: dict) -> dict:
    """The run's own config.yaml (written by its trainers), {} when there is none."""
    path = Path(s["_dir"]) / "config.yaml"
    if not path.is_file():
        return {}
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(path))
    except Exception:  # noqa: BLE001 - a report must not die on one odd run
        return {}


def label_tv(s: dict) -> Optional[float]:
    """Mean label total-variation distance of the run's partitions (partitioners' stats.json)."""
    if s.get("label_tv_mean") is not None:
        return s["label_tv_mean"]
    cfg = s.get("_config") or {}
    part, ds = cfg.get("partition"), cfg.get("dataset")
    if not part or not ds:
        return None
    path = Path(str(part.get("root"))) / str(ds.get("name")) / \
        f"{part.get('method')}-k{part.get('num_parts')}-s{part.get('seed')}" / "stats.json"
    try:
        return json.loads(path.read_text()).get("label_tv_mean")
    except (OSError, ValueError):
        return None


CSV_FIRST = ("run", "status", "pipeline", "variant", "dataset", "model", "layers", "machines", "trainers",
             "bandwidth", "best_val", "test", "train_time_s", "epochs")


def _scalar(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def csv_row(s: dict) -> Dict[str, object]:
    """A summary's scalar keys as they are, a dict of scalars as `key.sub` columns (lists left out)."""
    row: Dict[str, object] = {"run": s["_rel"]}
    for k, v in s.items():
        if k.startswith("_"):
            continue
        if _scalar(v):
            row[k] = v
        elif isinstance(v, dict):
            row.update({f"{k}.{sub}": x for sub, x in v.items() if _scalar(x)})
    return row


def write_csv(runs: List[dict], path: Path) -> Path:
    """runs.csv: one row per run (failed ones too), the columns of every run's summary; empty
    cells where a run has no such key."""
    rows = [csv_row(s) for s in sorted(runs, key=lambda s: s["_rel"])]
    keys = {k for r in rows for k in r}
    columns = [k for k in CSV_FIRST if k in keys] + sorted(keys - set(CSV_FIRST))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, restval="")
        w.writeheader()
        w.writerows(rows)
    return path
