"""Structured config of `python -m benchmarks` (make bench): a bench is a list of suites.

Registered as ``bench_schema`` before Hydra composes benchmarks/conf/bench.yaml, so an unknown key
or a wrong type in a bench file fails at compose time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# the bench's own Hydra configs (bench.yaml and bench/<name>.yaml), beside this file
BENCH_CONF_DIR = str(Path(__file__).resolve().parent / "conf")


@dataclass
class SuiteConfig:
    """One benchmark suite: a Hydra multirun of one module, every job in its own run directory."""

    name: str = MISSING
    # degnn.launch (one cluster per job) or benchmarks.single_process (the accuracy reference)
    module: str = "degnn.launch"
    # multirun overrides, e.g. ["dataset=wordnet,synthetic-arxiv", "cluster=netns"]
    overrides: List[str] = field(default_factory=list)
    # skip the suite (with a message) when one of its datasets is not on disk (real OGB data)
    only_on_disk: bool = False
    # run in only the first this-many of the bench's repeats (null: all); e.g. 1 for the long
    # converged baseline run that only sets a time-to-target comparison's target
    repeats: Optional[int] = None
    # a time-to-target suite: the name of an earlier suite of the bench (distdgl trained until
    # patience stopped it) whose runs of the same dataset set this suite's train.target_val (their
    # median best validation minus bench.target_margin) and its epoch cap (their most epochs); the
    # suite then runs once per dataset (benchmarks/__main__.py, targets)
    target_from: Optional[str] = None


@dataclass
class BenchConfig:
    name: str = MISSING
    suites: List[SuiteConfig] = field(default_factory=list)
    # run the suite list this many times, every other time in reverse order (each compared pair
    # in both orders), repeat k into <out>/<suite>/r<k>/ (1: <out>/<suite>/, one order)
    repeats: int = 3
    # CPUs of every netns machine of every launch suite (cluster.cpus_per_machine, appended to its
    # overrides unless the suite sets it): the same budget for every run compared; null = none
    cpus_per_machine: Optional[float] = 0.45
    # run only these suites (by name, e.g. bench.only=[ablation-owners-distdgl]); empty = all
    only: List[str] = field(default_factory=list)
    # a time-to-target suite's target: the converged baseline's best validation minus this
    target_margin: float = 0.01


@dataclass
class BenchJob:
    """Config of `python -m benchmarks` (make bench)."""

    bench: BenchConfig = MISSING
    # results folder; default benchmarks/results/<timestamp>
    out: Optional[str] = None
    # only write the report from an existing results folder (`out=`), run nothing
    report_only: bool = False
    # the folder of the committed run records (<records>/<bench>.jsonl, one line per run,
    # appended after the suites; docs/benchmarks.md), relative to the checkout; null = write none
    records: Optional[str] = "benchmarks/records"


def register_bench_configs() -> None:
    ConfigStore.instance().store(name="bench_schema", node=BenchJob)


def compose_bench(overrides: List[str]):
    """A bench's composed config (benchmarks/conf/bench.yaml with `overrides`), outside the bench's
    own Hydra app: what tests and tools read a bench's suites from."""
    from hydra import compose, initialize_config_dir

    register_bench_configs()
    with initialize_config_dir(BENCH_CONF_DIR, version_base="1.3"):
        return compose("bench", overrides=overrides)
