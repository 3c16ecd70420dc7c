"""`python -m benchmarks bench=<default|quick|ogb>`: run the suites, then write the report.

Each suite is a Hydra multirun of `degnn.launch` (one cluster per job) or of
`benchmarks.single_process` (the accuracy reference), with its sweep directory inside the results
folder; afterwards every summary.json there goes into report.md and the PNG plots.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from degnn.config import CONF_DIR, register_configs

from .report import write_report

register_configs()
REPO = Path(__file__).resolve().parent.parent


@hydra.main(config_path=CONF_DIR, config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out = Path(cfg.out) if cfg.out else REPO / "benchmarks" / "results" / time.strftime("%Y%m%d-%H%M%S")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    if not cfg.report_only:
        t0 = time.time()
        for suite in cfg.bench.suites:
            cmd = [sys.executable, "-m", suite.module, "-m", *suite.overrides,
                   f"hydra.sweep.dir={out / suite.name}", "hydra.sweep.subdir=${hydra.job.num}"]
            print(f"bench {cfg.bench.name}: suite {suite.name}: {' '.join(cmd[1:])}", flush=True)
            rc = subprocess.run(cmd, cwd=REPO).returncode
            if rc != 0:
                failed.append(suite.name)
                print(f"bench: suite {suite.name} failed (exit {rc}); its runs are reported as far as they got",
                      file=sys.stderr, flush=True)
        print(f"bench {cfg.bench.name}: suites done in {time.time() - t0:.0f}s", flush=True)
    report = write_report(out, title=f"degnn benchmark: {cfg.bench.name}")
    print(f"report: {report}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
