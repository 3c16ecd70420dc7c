"""The epoch loop every pipeline shares (degnn/pipelines/loop.py), driven by a scripted pipeline
in this process (a one-rank gloo group, no DGL cluster): the best-validation point, divergence,
resuming (also into the same run directory), checkpoints that load with weights_only=True, and
the resume checks (degnn/runtime/checkpoint.py)."""
from __future__ import annotations

import gc
import json
import logging
import random
import socket
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir

from degnn.config import CONF_DIR, register_configs
from degnn.pipelines.base import Pipeline
from degnn.pipelines.loop import EpochLoop
from degnn.pipelines.record import rng_state, set_rng_state
from degnn.runtime.checkpoint import CheckpointError, check_resume, load_checkpoint
from degnn.runtime.context import RunContext
from degnn.tasks import task_of

register_configs()


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Scripted(Pipeline):
    """Loss, validation and test metric per epoch come from lists; the model really trains."""

    name = "scripted"

    def __init__(self, ctx, task, losses, vals, tests):
        super().__init__(ctx, task)
        self.losses, self.vals, self.tests = losses, vals, tests
        self.epoch = 0

    def setup(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 3)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.1)

    def batches_of(self, epoch):
        self.epoch = epoch
        yield from (torch.randn(8, 4), torch.randn(8, 4))

    def step(self, x):
        self.optimize(self.model(x).pow(2).mean())
        self.ctx.counter.add("allreduce", 50)
        return self.losses[self.epoch - 1]

    def evaluate(self):
        return self.vals[self.epoch - 1], self.tests[self.epoch - 1]


def run(run_dir: Path, *overrides, losses=None, vals=None, tests=None, cls=None):
    cfg = cfg_of(*overrides)
    n = 10
    ctx = RunContext(cfg=cfg, run_dir=run_dir, rank=0, world_size=1, local_rank=0, machines=1,
                     part_config=run_dir / "none.json", graph=None, log=logging.getLogger("t"))
    run_dir.mkdir(parents=True, exist_ok=True)
    p = (cls or Scripted)(ctx, task_of(cfg), losses or [1.0 / (i + 1) for i in range(n)],
                 vals or [0.1 * i for i in range(n)], tests or [0.05 * i for i in range(n)])
    return EpochLoop(p).run()


def strict_curve(run_dir: Path) -> list:
    def no_constants(name):
        raise ValueError(f"curve.jsonl holds a bare {name}")
    return [json.loads(l, parse_constant=no_constants)
            for l in (run_dir / "curve.jsonl").read_text().splitlines()]


def test_test_metric_is_taken_at_the_best_validation_point(tmp_path):
    # the best validation comes at the second evaluation, not the first and not the last
    s = run(tmp_path, "train.epochs=4", vals=[0.5, 0.8, 0.6, 0.7], tests=[0.1, 0.2, 0.3, 0.4])
    assert (s["best_val"], s["test"], s["best_epoch"], s["test_final"]) == (0.8, 0.2, 2, 0.4)
    curve = strict_curve(tmp_path)
    best = max(curve, key=lambda c: c["val"])
    assert (best["val"], best["test"]) == (s["best_val"], s["test"])
    assert torch.load(tmp_path / "best_model.pt", weights_only=True)["epoch"] == 2


def test_patience_counts_evaluations_without_improvement(tmp_path):
    s = run(tmp_path, "train.epochs=10", "train.patience=2",
            vals=[0.5, 0.9, 0.6, 0.7, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0])
    assert s["epochs"] == 4 and s["best_epoch"] == 2 and s["status"] == "ok"


def test_min_delta_counts_small_gains_against_patience_but_keeps_the_best(tmp_path):
    # 0.61, 0.615 and 0.62 each gain less than 0.05 on 0.6: patience 3 stops at epoch 5, and the
    # best point is still the last (0.62), not the one patience counted from
    s = run(tmp_path, "train.epochs=8", "train.patience=3", "train.min_delta=0.05",
            vals=[0.5, 0.6, 0.61, 0.615, 0.62, 0.9, 0.9, 0.9])
    assert s["epochs"] == 5 and s["best_epoch"] == 5 and s["best_val"] == 0.62
    # without min_delta the same climb runs on
    assert run(tmp_path / "plain", "train.epochs=8", "train.patience=3",
               vals=[0.5, 0.6, 0.61, 0.615, 0.62, 0.9, 0.9, 0.9])["epochs"] == 8


def test_a_validation_target_stops_the_run_at_the_first_evaluation_reaching_it(tmp_path):
    s = run(tmp_path, "train.epochs=6", "train.target_val=0.7", vals=[0.5, 0.6, 0.71, 0.8, 0.9, 0.95])
    assert s["epochs"] == 3 and s["best_val"] == 0.71 and s["status"] == "ok"
    assert [c["epoch"] for c in strict_curve(tmp_path)] == [1, 2, 3]
    # never reached: the epoch cap ends it
    s = run(tmp_path / "never", "train.epochs=3", "train.target_val=0.99", vals=[0.5, 0.6, 0.7])
    assert s["epochs"] == 3


def test_non_finite_loss_stops_the_run(tmp_path):
    s = run(tmp_path, "train.epochs=5", losses=[1.0, 0.9, float("nan"), 0.5, 0.4])
    assert s["status"] == "failed" and s["error"].startswith("diverged at epoch 3")
    assert s["epochs"] == 2  # the epochs that finished
    curve = strict_curve(tmp_path)  # valid JSON, no bare NaN
    assert [c["epoch"] for c in curve] == [1, 2, 3] and curve[-1]["loss"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"
    # the last checkpoint is the last good state
    assert load_checkpoint(tmp_path / "checkpoint.pt")["state"]["epoch"] == 2


def test_inf_loss_stops_the_run_too(tmp_path):
    s = run(tmp_path, "train.epochs=3", losses=[float("inf"), 1.0, 1.0])
    assert s["status"] == "failed" and s["error"].startswith("diverged at epoch 1")
    assert s["epochs"] == 0 and s["best_val"] is None


def test_resume_into_the_same_run_dir_keeps_epochs_unique(tmp_path):
    first = run(tmp_path, "train.epochs=2")
    curve = strict_curve(tmp_path)
    # as if the run had logged epoch 3 and died before checkpointing it
    with open(tmp_path / "curve.jsonl", "a") as f:
        f.write(json.dumps({**curve[-1], "epoch": 3, "wall_s": 999.0}) + "\n")
    s = run(tmp_path, "train.epochs=4", f"resume={tmp_path}")
    curve = strict_curve(tmp_path)
    assert [c["epoch"] for c in curve] == [1, 2, 3, 4]
    walls = [c["wall_s"] for c in curve]
    assert walls == sorted(walls) and walls[2] < 999  # wall time continues, not restarts
    assert s["epochs"] == 4 and s["batches"] == 8 and s["wall_s"] >= first["wall_s"]
    assert s["train_time_s"] >= first["train_time_s"]


def test_checkpoint_loads_with_weights_only_and_restores_rng(tmp_path):
    run(tmp_path, "train.epochs=1")
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")  # torch.load(weights_only=True)
    assert set(ckpt) >= {"model", "optimizer", "state", "rng", "config"}
    assert ckpt["config"]["model.hidden"] == 128
    state = rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    set_rng_state(ckpt["rng"][0])  # the stored form restores too


# ---- the resume checks (the launcher runs them before anything starts) ---------------------------
def resume_error(tmp_path, resume, *overrides, trainers=1) -> str:
    with pytest.raises(CheckpointError) as e:
        check_resume(cfg_of(f"resume={resume}", *overrides), trainers)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_resume_checks_name_the_file_and_the_fix(tmp_path):
    good = tmp_path / "good"
    run(good, "train.epochs=1", "model.hidden=16")
    assert check_resume(cfg_of(f"resume={good}", "model.hidden=16"), 1)["state"]["epoch"] == 1
    msg = resume_error(tmp_path, tmp_path / "nope")
    assert "no such directory" in msg
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no checkpoint.pt" in resume_error(tmp_path, empty)
    msg = resume_error(tmp_path, good, "model.hidden=32")
    assert "model.hidden=16" in msg and "model.hidden=32" in msg and str(good) in msg
    msg = resume_error(tmp_path, good, "model.hidden=16", "dataset=synthetic-small")
    assert "dataset.name=synthetic-tiny" in msg
    msg = resume_error(tmp_path, good, "model.hidden=16", trainers=4)
    assert "1 trainers" in msg and "starts 4" in msg
    ckpt = good / "checkpoint.pt"
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    msg = resume_error(tmp_path, good, "model.hidden=16")
    assert str(ckpt) in msg and "truncated or damaged" in msg
    ckpt.write_bytes(b"garbage" * 100)
    assert str(ckpt) in resume_error(tmp_path, good, "model.hidden=16")


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("this must not run",))

    torch.save({"model": {}, "optimizer": {}, "state": {}, "rng": [Evil()]}, tmp_path / "checkpoint.pt")
    msg = resume_error(tmp_path, tmp_path)
    assert "refers to print" in msg and "refused" in msg


# ---- TensorBoard event files (degnn/metrics/tracking.py) ------------------------------------------
def scalars(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_event_files_hold_every_curve_line(tmp_path):
    pytest.importorskip("tensorboard")
    s = run(tmp_path, "train.epochs=3", losses=[1.0, 0.5, 0.25], vals=[0.5, 0.8, 0.6], tests=[0.1, 0.2, 0.3])
    assert list(tmp_path.glob("events.out.tfevents.*"))
    tb = scalars(tmp_path)
    approx = lambda pts: [(step, pytest.approx(v)) for step, v in pts]  # noqa: E731 (float32 values)
    assert tb["train/loss"] == approx([(1, 1.0), (2, 0.5), (3, 0.25)])
    assert tb[f"eval/val_{s['metric']}"] == approx([(1, 0.5), (2, 0.8), (3, 0.6)])
    assert tb[f"eval/test_{s['metric']}"] == approx([(1, 0.1), (2, 0.2), (3, 0.3)])
    # the scripted step counts 50 all-reduce bytes per batch
    assert tb["bytes_per_batch/allreduce"] == approx([(1, 50), (2, 50), (3, 50)])
    assert tb["bytes_per_batch/app"] == tb["bytes_per_batch/allreduce"]
    sampling = [v for _, v in tb["time_per_batch_s/sampling"]]
    assert len(sampling) == 3 and all(v > 0 for v in sampling)
    assert [v for _, v in tb["run/train_time_s"]] == sorted(v for _, v in tb["run/train_time_s"])


def test_event_files_of_a_run_resumed_into_its_own_directory_keep_steps_unique(tmp_path):
    pytest.importorskip("tensorboard")
    import time

    # TensorBoard reads a directory's event files in name order, and a name is the writer's
    # second, host, pid and a per-process counter: a resumed run (a later process) sorts after
    # the run it resumes. Here every run is in this one process, so each starts in a new second
    # (otherwise the counter decides, and 10 sorts before 9).
    run(tmp_path, "train.epochs=2")
    at_2 = (tmp_path / "checkpoint.pt").read_bytes()
    time.sleep(1.1)
    run(tmp_path, "train.epochs=3", f"resume={tmp_path}")
    # as if the run had logged epoch 3 and died before checkpointing it
    (tmp_path / "checkpoint.pt").write_bytes(at_2)
    time.sleep(1.1)
    s = run(tmp_path, "train.epochs=4", f"resume={tmp_path}", losses=[7.0] * 4)
    assert s["epochs"] == 4
    assert scalars(tmp_path)["train/loss"] == [(1, 1.0), (2, 0.5), (3, 7.0), (4, 7.0)]
    # resumed into a new directory, the old curve lines are written there too
    other = tmp_path / "next"
    run(other, "train.epochs=5", f"resume={tmp_path}")
    assert [step for step, _ in scalars(other)["train/loss"]] == [1, 2, 3, 4, 5]


def test_without_tensorboard_one_info_line_and_no_event_files(tmp_path, monkeypatch, caplog):
    import degnn.metrics.tracking as tracking

    monkeypatch.setattr(tracking, "summary_writer_class", lambda: None)
    with caplog.at_level(logging.INFO, logger="t"):
        s = run(tmp_path, "train.epochs=2")
    assert s["status"] == "ok" and len(strict_curve(tmp_path)) == 2
    assert not list(tmp_path.glob("events.out.tfevents.*"))
    lines = [r.getMessage() for r in caplog.records if "tensorboard" in r.getMessage()]
    assert len(lines) == 1 and "not installed" in lines[0]
    other = tmp_path / "off"
    run(other, "train.epochs=1", "train.tensorboard=false")
    assert not list(other.glob("events.out.tfevents.*"))


class _Held:
    """An object a reference cycle keeps alive (a set-up's temporary graph, say)."""


class CycleInSetup(Scripted):
    """Leaves a reference cycle behind in its set-up and notes whether the collector was on."""

    seen = {}

    def setup(self):
        super().setup()
        held = _Held()
        held.me = held
        CycleInSetup.seen.update(collector_on=gc.isenabled(), held=weakref.ref(held))


def test_the_loop_resumes_the_collector_the_entry_paused_once_set_up_is_done(tmp_path):
    """degnn.train pauses the garbage collector for start-up (degnn/startup.py); the loop turns it
    back on after the pipeline's set-up, having freed the cyclic garbage set-up left (frozen, it
    would never be freed)."""
    from degnn.startup import pause_collector

    pause_collector()
    try:
        s = run(tmp_path, "train.epochs=1", cls=CycleInSetup)
        on_after = gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
    assert s["status"] == "ok"
    assert CycleInSetup.seen["collector_on"] is False and on_after is True
    assert CycleInSetup.seen["held"]() is None, "set-up's cyclic garbage was not freed before the freeze"
