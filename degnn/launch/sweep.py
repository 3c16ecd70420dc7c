"""A `-m` sweep runs every job and ends with one table of the jobs and their status.

Hydra's basic launcher runs the jobs one after another. A job that fails (refused before it
starts, or a run that failed) returns its exit status from the task function (`__main__.main`)
instead of leaving the process, so the next job runs; it has printed its one line, and its own
directory holds its summary.json with status=failed. `SweepTable`, a Hydra callback
(conf/config.yaml, `hydra.callbacks`), collects each job's overrides, directory and status when
it ends and prints the table when the sweep ends, then leaves with exit status 1 when any job
failed. An interrupt (Ctrl-C, SIGTERM, SIGHUP) still ends the whole sweep at once.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback

SWEEP_FILE = "sweep.json"  # the table as JSON, in hydra.sweep.dir
ERROR_WIDTH = 60  # characters of a failed job's error in the table (summary.json has it whole)


def job_status(run_dir: str, job_return) -> dict:
    """A job's status and error: its summary.json's, else its return value's (0: ok)."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    if job_return.status == JobStatus.COMPLETED:
        rc = job_return._return_value if isinstance(job_return._return_value, int) else 0
    else:  # an exception Hydra caught (none is expected: main returns every failure)
        rc = 1
        summary.setdefault("error", f"{type(job_return._return_value).__name__}: "
                                    f"{job_return._return_value}")
    status = summary.get("status") or ("ok" if rc == 0 else "failed")
    if rc != 0:
        status = "failed"
    return {"status": status, "exit": rc, "error": summary.get("error")}


def format_table(jobs: List[dict]) -> str:
    """One line per job: its number, the overrides that differ between the jobs, the status."""
    seen = {}
    for j in jobs:
        for o in j["overrides"]:
            key = o.split("=", 1)[0]
            seen.setdefault(key, set()).add(o)
    varying = {k for k, v in seen.items() if len(v) > 1 or any(k not in
               {o.split("=", 1)[0] for o in j["overrides"]} for j in jobs)}
    rows = [(str(j["num"]), " ".join(o for o in j["overrides"] if o.split("=", 1)[0] in varying)
             or "-", j["status"], _short(j["error"]) if j["status"] != "ok" else "") for j in jobs]
    head = ("job", "overrides", "status", "error")
    width = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    return "\n".join(f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]:<{width[2]}}  {r[3]}".rstrip()
                     for r in [head, *rows])


def _short(error) -> str:
    text = str(error or "")
    return text if len(text) <= ERROR_WIDTH else text[:ERROR_WIDTH - 3] + "..."


class SweepTable(Callback):
    """Hydra callback: each job's status as it ends; the table, and the exit status, at the end."""

    def __init__(self) -> None:
        self.jobs: List[dict] = []
        self.sweep_dir = None

    def on_multirun_start(self, config, **kwargs) -> None:
        self.jobs, self.sweep_dir = [], None

    def on_job_end(self, config, job_return, **kwargs) -> None:
        hydra = job_return.hydra_cfg.hydra if job_return.hydra_cfg is not None else None
        if hydra is None or hydra.mode is None or hydra.mode.name != "MULTIRUN":
            return
        run_dir = hydra.runtime.output_dir
        self.sweep_dir = str(hydra.sweep.dir)  # as this job resolved it (${now:...})
        self.jobs.append({"num": hydra.job.num, "overrides": list(job_return.overrides or []),
                          "run_dir": run_dir, **job_status(run_dir, job_return)})

    def on_multirun_end(self, config, **kwargs) -> None:
        failed = [j for j in self.jobs if j["status"] != "ok"]
        sweep_dir = Path(self.sweep_dir or str(config.hydra.sweep.dir))
        try:
            (sweep_dir / SWEEP_FILE).write_text(json.dumps(self.jobs, indent=1) + "\n")
        except OSError:
            pass  # the table on the console is what counts
        print(f"\nsweep of {len(self.jobs)} jobs in {sweep_dir}: {len(self.jobs) - len(failed)} ok, "
              f"{len(failed)} failed\n{format_table(self.jobs)}", flush=True)
        if failed:
            sys.exit(1)
