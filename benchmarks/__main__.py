"""`python -m benchmarks bench=<default|quick|ogb>`: run the suites, then write the report.

Each suite is a Hydra multirun of `degnn.launch` (one cluster per job) or of
`benchmarks.single_process` (the accuracy reference), with its sweep directory inside the results
folder. The suite list runs `bench.repeats` times, every other repeat in reverse order, every
launch suite on netns machines of `bench.cpus_per_machine` CPUs. A time-to-target suite
(`target_from`) runs once per dataset, stopping at the target its converged baseline set.
Afterwards every summary.json there goes into report.md and the PNG plots, and one record per run
into the committed records (benchmarks.records), from which `python -m benchmarks.results_md`
writes benchmarks/RESULTS.md.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import hydra
from omegaconf import DictConfig

from degnn.config import CONF_DIR, register_configs

from . import CHECKOUT, RESULTS_DIR
from .config import BENCH_CONF_DIR, register_bench_configs

from .host_probe import probe_s
from .records import git_commit, utc, write_records
from .report import plot_note, write_report

register_configs()
register_bench_configs()


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


def plan(bench) -> List[Tuple[int, int, object]]:
    """(repeat, position in the repeat's order, suite) in running order: the suite list
    `bench.repeats` times, every odd repeat reversed."""
    if bench.repeats < 1:
        raise ValueError(f"bench.repeats={bench.repeats}: must be at least 1")
    names = [s.name for s in bench.suites]
    unknown = [n for n in bench.only if n not in names]
    if unknown:
        raise ValueError(f"bench.only names {', '.join(unknown)}: bench={bench.name} has suites {', '.join(names)}")
    chosen = [s for s in bench.suites if not bench.only or s.name in bench.only]
    out = []
    for rep in range(bench.repeats):
        suites = chosen[::-1] if rep % 2 else chosen
        suites = [s for s in suites if s.repeats is None or rep < s.repeats]
        out += [(rep, pos, suite) for pos, suite in enumerate(suites)]
    return out


def suite_overrides(bench, suite) -> List[str]:
    """The suite's overrides, with the bench's CPU budget on a netns launch suite that sets none."""
    extra = []
    if (bench.cpus_per_machine is not None and suite.module == "degnn.launch"
            and "cluster=netns" in suite.overrides
            and not any(o.startswith("cluster.cpus_per_machine=") for o in suite.overrides)):
        extra.append(f"cluster.cpus_per_machine={bench.cpus_per_machine}")
    return [*suite.overrides, *extra]


class TargetError(RuntimeError):
    """A time-to-target suite without its converged baseline's runs."""


def targets(out: Path, bench, suite, records: Optional[Path] = None) -> Dict[str, Tuple[float, int]]:
    """A time-to-target suite's target and epoch cap per dataset, from the runs of the suite it
    names (`target_from`, every repeat): the median best validation minus `bench.target_margin`,
    and the most epochs one of them trained (the compared runs get as many epochs as the baseline
    needed to converge, so one that never reaches the target still ends). The runs are this
    invocation's; where it has none (bench.only left that suite out), the newest committed records
    of it in `records`, so that a long bench can run its compared suites in separate invocations
    against one converged baseline (the report takes the target from those same records)."""
    import statistics

    from .records import as_run, current, read_records
    from .report import collect

    def finished(runs) -> Dict[str, List[dict]]:
        found: Dict[str, List[dict]] = {}
        for s in runs:
            if s.get("status") == "ok" and s.get("best_val") is not None:
                found.setdefault(s["dataset"], []).append(s)
        return found

    found = finished(collect(out / suite.target_from))
    if not found and records is not None and (records / f"{bench.name}.jsonl").exists():
        committed = [r for r in current(read_records(records))
                     if (r["bench"], r["suite"]) == (bench.name, suite.target_from)]
        found = finished(as_run(r) for r in committed)
        if found:
            print(f"bench {bench.name}: suite {suite.name} takes its target from the committed records of "
                  f"suite {suite.target_from} (commit {committed[0]['commit']}, run {committed[0]['invocation']})",
                  flush=True)
    if not found:
        raise TargetError(f"suite {suite.name} takes its target from suite {suite.target_from}, which has no "
                          f"finished run in {out} nor in the committed records: run it first (bench.only must "
                          f"name both)")
    return {ds: (round(statistics.median(s["best_val"] for s in ss) - bench.target_margin, 4),
                 max(int(s["epochs"]) for s in ss)) for ds, ss in found.items()}


def jobs(out: Path, bench, suite, records: Optional[Path] = None) -> List[Tuple[List[str], str]]:
    """The multiruns of a suite: (overrides, sweep subdir). A time-to-target suite runs once per
    dataset, with that dataset's target and epoch cap; any other suite is one multirun."""
    overrides = suite_overrides(bench, suite)
    if not suite.target_from:
        return [(overrides, "${hydra.job.num}")]
    per_dataset = targets(out, bench, suite, records)
    names = [o.split("=", 1)[1].split(",") for o in overrides if o.startswith("dataset=")]
    missing = [ds for ds in (names[0] if names else []) if ds not in per_dataset]
    if not names or missing:
        raise TargetError(f"suite {suite.name}: no converged run of {', '.join(missing) or 'its dataset'} "
                          f"in suite {suite.target_from}")
    rest = [o for o in overrides if not o.startswith(("dataset=", "train.epochs="))]
    return [([f"dataset={ds}", *rest, f"train.target_val={per_dataset[ds][0]}", f"train.epochs={per_dataset[ds][1]}"],
             f"{ds}-${{hydra.job.num}}") for ds in names[0]]


def records_dir(records: Optional[str]) -> Optional[Path]:
    """The records folder `records=` names: a relative one inside the checkout (the default is its
    benchmarks/records), wherever the bench was started from; None writes none."""
    if not records:
        return None
    path = Path(records).expanduser()
    return path if path.is_absolute() else CHECKOUT / path


def sweep_dir(out: Path, bench, suite, rep: int) -> Path:
    return out / suite.name / f"r{rep}" if bench.repeats > 1 else out / suite.name


@hydra.main(config_path=BENCH_CONF_DIR, config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out = Path(cfg.out) if cfg.out else RESULTS_DIR / time.strftime("%Y%m%d-%H%M%S")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    orders: Dict[Tuple[str, int], int] = {}
    probes: Dict[Tuple[str, int], float] = {}  # the host's speed just before each suite
    if not cfg.report_only:
        t0 = time.time()
        # the runs import degnn from this checkout (the one this bench runs from), not from where
        # an editable install points, and its records name this checkout's commit
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)}
        commit = git_commit(CHECKOUT)
        for rep, pos, suite in plan(cfg.bench):
            missing = missing_datasets(suite) if suite.only_on_disk else []
            if missing:
                print(f"bench {cfg.bench.name}: suite {suite.name} skipped: {', '.join(missing)} not on disk "
                      f"(put the OGB files under dataset.root, default data/)", flush=True)
                continue
            orders[(suite.name, rep)] = pos
            try:
                multiruns = jobs(out, cfg.bench, suite, records_dir(cfg.records))
            except TargetError as e:
                print(f"bench: {e}", file=sys.stderr, flush=True)
                failed.append(f"{suite.name} (repeat {rep + 1})")
                continue
            rc = 0
            probes[(suite.name, rep)] = probe_s()
            for overrides, subdir in multiruns:
                cmd = [sys.executable, "-m", suite.module, "-m", *overrides,
                       f"hydra.sweep.dir={sweep_dir(out, cfg.bench, suite, rep)}", f"hydra.sweep.subdir={subdir}"]
                print(f"bench {cfg.bench.name}: repeat {rep + 1}/{cfg.bench.repeats}, suite {suite.name} "
                      f"(host probe {probes[(suite.name, rep)]:.3f} s): {' '.join(cmd[1:])}", flush=True)
                rc = subprocess.run(cmd, cwd=out.parent, env=env).returncode or rc
            if rc != 0:
                failed.append(f"{suite.name} (repeat {rep + 1})")
                print(f"bench: suite {suite.name} failed (exit {rc}); its runs are reported as far as they got",
                      file=sys.stderr, flush=True)
        print(f"bench {cfg.bench.name}: suites done in {time.time() - t0:.0f}s", flush=True)
    report = write_report(out, title=f"degnn benchmark: {cfg.bench.name}")
    if orders and cfg.records:
        from .report import collect

        path = records_dir(cfg.records) / f"{cfg.bench.name}.jsonl"
        n = write_records(collect(out), path, cfg.bench.name, orders, utc(t0), commit, probes)
        print(f"records: {n} runs appended to {path} (benchmarks/RESULTS.md: python -m benchmarks.results_md)")
    print(f"report: {report}")
    if plot_note():
        print(f"bench {cfg.bench.name}: {plot_note()}", flush=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
