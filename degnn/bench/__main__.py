"""`python -m degnn.bench bench=<default|quick|ogb>`: run the suites, then write the report.

Each suite is a Hydra multirun of `degnn.launch` (one cluster per job) or of
`degnn.bench.single_process` (the accuracy reference), with its sweep directory inside the results
folder; afterwards every summary.json there goes into report.md and the PNG plots.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import List

import hydra
from omegaconf import DictConfig

from degnn.config import CONF_DIR, register_configs

from .report import plot_note, write_report

register_configs()


def missing_datasets(suite) -> List[str]:
    """The datasets a suite sweeps over that would need a download."""
    from omegaconf import OmegaConf

    from degnn.config import DatasetConfig
    from degnn.data import on_disk

    names = [o.split("=", 1)[1].split(",") for o in suite.overrides if o.startswith("dataset=")]
    missing = []
    for name in (names[0] if names else []):
        # the dataset's option file on the schema (we are inside Hydra's app: no second compose)
        ds = OmegaConf.merge(OmegaConf.structured(DatasetConfig), OmegaConf.load(Path(CONF_DIR, "dataset", f"{name}.yaml")))
        if not on_disk(ds):
            missing.append(name)
    return missing


@hydra.main(config_path=CONF_DIR, config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out = Path(cfg.out) if cfg.out else Path.cwd() / "benchmarks" / "results" / time.strftime("%Y%m%d-%H%M%S")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    if not cfg.report_only:
        t0 = time.time()
        for suite in cfg.bench.suites:
            missing = missing_datasets(suite) if suite.only_on_disk else []
            if missing:
                print(f"bench {cfg.bench.name}: suite {suite.name} skipped: {', '.join(missing)} not on disk "
                      f"(put the OGB files under dataset.root, default data/)", flush=True)
                continue
            cmd = [sys.executable, "-m", suite.module, "-m", *suite.overrides,
                   f"hydra.sweep.dir={out / suite.name}", "hydra.sweep.subdir=${hydra.job.num}"]
            print(f"bench {cfg.bench.name}: suite {suite.name}: {' '.join(cmd[1:])}", flush=True)
            rc = subprocess.run(cmd, cwd=out.parent).returncode
            if rc != 0:
                failed.append(suite.name)
                print(f"bench: suite {suite.name} failed (exit {rc}); its runs are reported as far as they got",
                      file=sys.stderr, flush=True)
        print(f"bench {cfg.bench.name}: suites done in {time.time() - t0:.0f}s", flush=True)
    report = write_report(out, title=f"degnn benchmark: {cfg.bench.name}")
    print(f"report: {report}")
    if plot_note():
        print(f"bench {cfg.bench.name}: {plot_note()}", flush=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
