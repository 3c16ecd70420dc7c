"""pipeline=tma: config schema and launcher checks, the averaging coordinator, the fault policy of
the supervisor, and real runs on netns clusters (each variant on 2 machines, a dropped partition,
a trainer killed mid-run, the evaluating trainer killed mid-run, resume)."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import fake_entry
from netns_support import needs_netns
from degnn.launch.netns import list_namespaces
from degnn.launch.plan import Plan, Proc
from degnn.launch.supervisor import Supervisor
from degnn.metrics import read_curve
from degnn.proc import environ_of
from degnn.pipelines.tma import VARIANT_PARTITION, TMAPipeline
from degnn.pipelines.tma.coordinator import Coordinator
from degnn.entry import compose_config

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


# ---- config ------------------------------------------------------------------------------------------
def test_tma_keys_are_checked_at_compose_time():
    cfg = compose_config(["pipeline=tma", "pipeline.sync_every_s=120", "pipeline.drop_parts=[1]",
                          "pipeline.variant=llcg", "pipeline.corr_steps=3", "pipeline.weighting=train_nodes"])
    assert cfg.pipeline.sync_every_s == 120 and list(cfg.pipeline.drop_parts) == [1]
    assert cfg.pipeline.corr_steps == 3 and cfg.pipeline.grad_clip == 1.0
    bad = [["pipeline=tma", "pipeline.sync_evry=30s"],  # typo
           ["pipeline=tma", "pipeline.corr_steps=two"],  # type
           ["pipeline=tma", "pipeline.drop_parts=[a]"],
           ["pipeline=distdgl", "pipeline.sync_every_s=30"]]  # distdgl has no TMA keys
    for overrides in bad:
        with pytest.raises(Exception) as e:
            compose_config(overrides)
        assert "pipeline." in str(e.value), overrides
    assert "sync_every_s" not in compose_config(["pipeline=distdgl"]).pipeline


def test_durations_are_seconds_like_every_duration_key():
    """One unit for every duration of degnn: seconds, in keys named `_s` (train.time_limit_s,
    cluster.hang_timeout_s, pipeline.sync_every_s, ...); a duration string is refused, naming the key."""
    assert compose_config(["pipeline=tma", "pipeline.time_limit_s=45.5"]).pipeline.time_limit_s == 45.5
    with pytest.raises(ValueError, match=r"pipeline.sync_every_s='30s': pipeline=tma expects float"):
        compose_config(["pipeline=tma", "pipeline.sync_every_s=30s"])


def _cfg(*overrides):
    cfg = compose_config(["pipeline=tma", "cluster=netns", "cluster.machines=4", *overrides])
    OmegaConf.set_struct(cfg, True)
    return cfg


@pytest.mark.parametrize("overrides, message", [
    (["pipeline.variant=fast"], "pipeline.variant='fast'"),
    (["pipeline.sync_every_s=-1"], "pipeline.sync_every_s=-1.0: must be a positive number of seconds"),
    (["pipeline.time_limit_s=0"], "pipeline.time_limit_s=0.0: must be a positive number of seconds"),
    (["pipeline.weighting=edges"], "pipeline.weighting='edges'"),
    (["pipeline.drop_parts=[4]"], "distinct partition indices 0..3"),
    (["pipeline.drop_parts=[1,1]"], "distinct partition indices"),
    (["pipeline.drop_parts=[0,1,2,3]"], "drops every partition"),
    (["pipeline.kill_rank=4"], "pipeline.kill_rank=4"),
    (["pipeline.kill_at_s=-2"], "pipeline.kill_at_s=-2.0: must be >= 0 seconds"),
    (["pipeline.kill_during=setup"], "pipeline.kill_during='setup'"),
])
def test_launcher_preflight_rejects(overrides, message):
    with pytest.raises(ValueError, match=None) as e:
        TMAPipeline.prepare_launch(_cfg(*overrides), overrides)
    assert message in str(e.value)


def test_one_trainer_a_machine_is_what_the_pipeline_declares():
    from degnn.pipelines import check_trainers

    with pytest.raises(ValueError, match="cluster.trainers_per_machine=1"):
        check_trainers(TMAPipeline, _cfg("cluster.trainers_per_machine=2"))
    check_trainers(TMAPipeline, _cfg())


@pytest.mark.parametrize("variant", sorted(VARIANT_PARTITION))
def test_variant_picks_the_partition_unless_given(variant):
    cfg = _cfg(f"pipeline.variant={variant}")
    extra = TMAPipeline.prepare_launch(cfg, [f"pipeline.variant={variant}"])
    method = VARIANT_PARTITION[variant]
    assert extra == [f"partition={method}"] and cfg.partition.method == method
    # as composing partition=<method> would: supernode is not edge-balanced, metis is
    ref = compose_config(["pipeline=tma", "cluster=netns", "cluster.machines=4", f"partition={method}"])
    assert cfg.partition == ref.partition
    # an explicit choice wins, and a single partition key given by the user is kept
    given = ["partition=metis", f"pipeline.variant={variant}"]
    cfg = _cfg(*given)
    assert TMAPipeline.prepare_launch(cfg, given) == [] and cfg.partition.method == "metis"
    given = [f"pipeline.variant={variant}", "partition.balance_edges=false"]
    cfg = _cfg(*given)
    TMAPipeline.prepare_launch(cfg, given)
    assert cfg.partition.method == method and cfg.partition.balance_edges is False


def test_launcher_rejects_bad_tma_config_before_anything_starts(tmp_path):
    p = subprocess.run([PY, "-m", "degnn.launch", "pipeline=tma", "pipeline.sync_every_s=often",
                        f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "pipeline.sync_every_s='often': pipeline=tma expects float there" in p.stderr
    assert p.stderr.strip().count("\n") == 0
    assert not (tmp_path / "summary.json").exists()


# ---- the coordinator (server side, no processes) ---------------------------------------------------------
def _coord(active=(0, 1, 2)):
    return Coordinator(list(active), round_timeout_s=5, start_timeout_s=60, evaluator_timeout_s=10)


def test_round0_gives_everyone_the_lowest_ranks_weights():
    c = _coord()
    for rank in (2, 0, 1):
        assert c.poll_mean(0, rank, 0.0)[0] == "wait"
        c.submit(0, rank, torch.full((3,), float(rank)), {}, now=1.0)
    status, tensor, meta = c.poll_mean(0, 0, 1.0)
    assert status == "mean" and torch.equal(tensor, torch.zeros(3)) and meta["contributors"] == [0, 1, 2]
    # training starts once every trainer has them (no download overlaps anyone's training)
    assert c.poll_start(0, now=1.0) == "wait"
    c.poll_mean(0, 1, 1.1)
    c.poll_mean(0, 2, 1.2)
    assert c.poll_start(0, now=1.2) == "go"


def test_round_closes_when_all_submitted_with_the_weighted_mean():
    c = _coord()
    c.submit(1, 0, torch.tensor([1.0, 2.0]), {"weight": 1.0}, now=0.0)
    c.submit(1, 1, torch.tensor([3.0, 4.0]), {"weight": 1.0}, now=0.1)
    assert c.poll_mean(1, 0, 0.2)[0] == "wait"  # rank 2 still alive and within the deadline
    c.submit(1, 2, torch.tensor([8.0, 0.0]), {"weight": 2.0}, now=0.3)
    status, mean, meta = c.poll_mean(1, 0, 0.3)
    assert status == "mean" and torch.allclose(mean, torch.tensor([5.0, 1.5]))  # (1+3+16)/4, (2+4+0)/4
    assert meta["evaluator"] == 0 and meta["dead"] == []


def test_a_silent_trainer_is_left_out_after_the_deadline_and_rejoins_if_late():
    c = _coord()
    c.submit(1, 1, torch.tensor([2.0]), {}, now=0.0)
    c.submit(1, 2, torch.tensor([4.0]), {}, now=0.5)
    assert c.poll_mean(1, 0, 4.9)[0] == "wait"
    status, mean, meta = c.poll_mean(1, 0, 5.1)
    assert status == "mean" and mean.item() == 3.0 and meta["contributors"] == [1, 2]
    assert meta["evaluator"] == 1 and meta["dead"] == [0]
    # the next round does not wait for the dead one
    c.submit(2, 1, torch.tensor([1.0]), {}, now=10.0)
    c.submit(2, 2, torch.tensor([3.0]), {}, now=10.1)
    assert c.poll_mean(2, 0, 10.1)[1].item() == 2.0
    # a trainer that was only late gets the closed round's mean, and counts again afterwards
    assert c.submit(2, 0, torch.tensor([100.0]), {}, now=11.0) == "late"
    assert c.poll_mean(2, 0, 11.0)[1].item() == 2.0
    c.submit(3, 1, torch.tensor([0.0]), {}, now=20.0)
    c.submit(3, 2, torch.tensor([0.0]), {}, now=20.0)
    assert c.poll_mean(3, 0, 20.0)[0] == "wait"  # rank 0 is expected again


def _work(c, r, rank, now):
    """One eval_poll: (phase, unit) when it hands out work, else the status."""
    status, _, meta = c.eval_poll(r, rank, now)
    return (meta["phase"], meta["unit"]) if status == "work" else status


def test_the_evaluation_is_split_over_the_live_trainers_and_a_dead_ones_units_are_handed_on():
    """Two units per partition, one layer and the scoring: each trainer computes its own
    partition's units; rank 2 goes silent holding one, and after evaluator_timeout_s (10 s) its units
    go to the live trainers, so the scores still cover every unit."""
    c = Coordinator([0, 1, 2], round_timeout_s=5, start_timeout_s=60, evaluator_timeout_s=10,
                    homes=[0, 0, 1, 1, 2, 2], phases=2)
    for rank in range(3):
        c.submit(1, rank, torch.tensor([1.0]), {}, now=0.0)
    assert _work(c, 1, 0, 0.1) == (0, 0) and _work(c, 1, 1, 0.1) == (0, 2) and _work(c, 1, 2, 0.1) == (0, 4)
    for rank, unit in ((0, 0), (1, 2)):
        assert c.eval_done(1, rank, {"phase": 0, "unit": unit}, now=1.0) == "ok"
    assert _work(c, 1, 0, 1.0) == (0, 1) and _work(c, 1, 1, 1.0) == (0, 3)
    c.eval_done(1, 0, {"phase": 0, "unit": 1}, now=2.0)
    c.eval_done(1, 1, {"phase": 0, "unit": 3}, now=2.0)
    # rank 2's units are its own while it may still be alive: the others wait, the next phase too
    assert _work(c, 1, 0, 9.0) == "wait" and _work(c, 1, 1, 9.0) == "wait"
    assert c.beat(1, 2, now=9.0, unit=4) == "ok"
    assert _work(c, 1, 0, 19.5) == (0, 4)  # silent since 9 s: counted dead, unit 4 handed on
    assert c.beat(1, 2, now=19.6, unit=4) == "not-holder"  # it would learn that it lost the unit
    assert _work(c, 1, 1, 19.6) == (0, 5)
    assert c.eval_done(1, 0, {"phase": 0, "unit": 4}, now=20.0) == "ok"
    assert c.eval_done(1, 2, {"phase": 0, "unit": 4}, now=20.0) == "late"  # done already
    assert _work(c, 1, 0, 20.0) == "wait"  # phase 1 only once every unit of phase 0 is done
    c.eval_done(1, 1, {"phase": 0, "unit": 5}, now=20.1)
    # the scoring: the units of the dead rank's partition are handed out at once
    got = {rank: [] for rank in (0, 1)}
    for t in range(6):
        for rank in (0, 1):
            w = _work(c, 1, rank, 21.0 + t)
            if isinstance(w, tuple):
                got[rank].append(w[1])
                c.eval_done(1, rank, {"phase": 1, "unit": w[1], "partial": {"val": [0.5 * (w[1] + 1), w[1] + 1],
                                                                              "test": [1.0, 2]}}, now=21.0 + t)
    assert sorted(got[0] + got[1]) == list(range(6)) and got[0][:2] == [0, 1] and got[1][:2] == [2, 3]
    assert _work(c, 1, 1, 30.0) == "wait"  # the lead records the round
    status, _, meta = c.eval_poll(1, 0, 30.0)
    assert status == "scored" and meta["sums"] == {"val": [10.5, 21], "test": [6.0, 12]}
    assert meta["handed_on"] == 2 + 2 and meta["workers"] == [0, 1] and meta["dead"] == [2]
    assert any("rank 2 silent for 10s while evaluating" in line for line in meta["log"])
    assert c.release(1, 0, torch.zeros(0), {"state": {}}, now=30.0) == "ok"
    assert c.eval_poll(1, 1, 30.1)[0] == "released"
    # the next round: rank 2 is dead, its partition's units are everyone's from the start
    for rank in (0, 1):
        c.submit(2, rank, torch.tensor([1.0]), {}, now=40.0)
    assert [_work(c, 2, 0, 40.0), _work(c, 2, 0, 40.0), _work(c, 2, 0, 40.0)] == [(0, 0), (0, 1), (0, 4)]


def test_a_silent_lead_is_replaced_and_the_corrected_model_reaches_everyone():
    """LLCG: the lead corrects the mean before the evaluation opens; it dies doing so, the next
    contributing rank leads instead, and its corrected weights go to every trainer once."""
    c = Coordinator([0, 1, 2], round_timeout_s=5, start_timeout_s=60, evaluator_timeout_s=10,
                    homes=[0, 1, 2], phases=1, corrects=True)
    for rank in range(3):
        c.submit(1, rank, torch.tensor([float(rank)]), {}, now=0.0)
    status, tensor, meta = c.eval_poll(1, 0, 0.0)
    assert status == "lead" and tensor.item() == 1.0 and meta["first_evaluator"] == 0
    assert c.eval_poll(1, 1, 0.1)[0] == "wait"  # nothing to do before the correction
    assert c.beat(1, 0, now=8.0) == "ok"
    assert c.eval_poll(1, 1, 15.0)[0] == "wait"  # beat at 8 s: still within 10 s
    assert c.eval_poll(1, 2, 18.5)[0] == "wait"  # rank 0 silent: rank 1 leads, not 2
    status, tensor, meta = c.eval_poll(1, 1, 18.6)
    assert status == "lead" and tensor.item() == 1.0 and meta["evaluator"] == 1 and 0 in meta["dead"]
    assert c.beat(1, 0, now=19.0) == "not-evaluator"  # the old lead learns it was replaced
    assert c.eval_open(1, 0, torch.tensor([5.0]), {}, now=19.0) == "not-evaluator"
    assert c.eval_open(1, 1, torch.tensor([7.0]), {"corr_s": 0.5}, now=19.0) == "ok"
    status, tensor, meta = c.eval_poll(1, 2, 19.1)
    assert status == "work" and tensor.item() == 7.0 and meta == {"phase": 0, "unit": 2}
    status, tensor, _ = c.eval_poll(1, 1, 19.1)
    assert status == "work" and tensor.numel() == 0  # the lead has them: its own correction
    status, tensor, _ = c.eval_poll(1, 2, 19.2)
    assert status == "work" and tensor.numel() == 0  # sent once
    for rank, unit in ((1, 1), (2, 2), (2, 0)):  # rank 0's unit goes to whoever asks
        c.eval_done(1, rank, {"phase": 0, "unit": unit, "partial": {"val": [1.0, 1], "test": [0.0, 1]}}, now=19.3)
    status, _, meta = c.eval_poll(1, 1, 19.4)
    assert status == "scored" and meta["corr_s"] == 0.5 and meta["sums"]["val"] == [3.0, 3]
    assert c.poll_start(1, now=19.4) == "wait"
    assert c.release(1, 1, torch.zeros(0), {"state": {"x": 1}}, now=19.5) == "ok"
    assert c.poll_start(1, now=19.5) == "wait"  # rank 2 has not picked up the release yet
    status, tensor, meta = c.eval_poll(1, 2, 19.6)
    assert status == "released" and tensor.numel() == 0 and meta == {"state": {"x": 1}}
    assert c.poll_start(1, now=19.6) == "go"  # every live contributor has it (rank 0 is dead)
    assert c.poll_release(1, 3, now=19.7)[1].item() == 7.0  # a dropped partition's trainer gets them


def test_only_every_eval_every_th_round_and_the_last_are_evaluated():
    """train.eval_every=2 over 3 rounds: round 1 is averaged and released without any unit of
    evaluation (LLCG still corrects it first), rounds 2 and 3 (the last) are evaluated."""
    c = Coordinator([0, 1], round_timeout_s=5, start_timeout_s=60, evaluator_timeout_s=10,
                    homes=[0, 1], phases=2, corrects=True, eval_every=2, rounds_total=3)
    assert [c.evaluates(r) for r in (1, 2, 3)] == [False, True, True]
    for rank in (0, 1):
        c.submit(1, rank, torch.tensor([float(rank)]), {}, now=0.0)
    assert c.eval_poll(1, 0, 0.1)[0] == "lead"  # the correction is training: it still happens
    assert c.eval_poll(1, 1, 0.1)[0] == "wait"
    assert c.eval_open(1, 0, torch.tensor([3.0]), {"corr_s": 0.2}, now=0.2) == "ok"
    assert c.eval_poll(1, 1, 0.3)[0] == "wait"  # no unit to compute
    status, _, meta = c.eval_poll(1, 0, 0.3)
    assert status == "scored" and meta["evaluated"] is False and meta["sums"] == {} and meta["corr_s"] == 0.2
    c.release(1, 0, torch.zeros(0), {"state": {}}, now=0.4)
    status, tensor, _ = c.eval_poll(1, 1, 0.5)
    assert status == "released" and tensor.item() == 3.0  # the corrected weights reach everyone
    for r in (2, 3):
        for rank in (0, 1):
            c.submit(r, rank, torch.tensor([1.0]), {}, now=10.0 * r)
        c.eval_poll(r, 0, 10.0 * r)
        c.eval_open(r, 0, torch.tensor([1.0]), {}, now=10.0 * r)
        assert _work(c, r, 0, 10.0 * r) == (0, 0) and _work(c, r, 1, 10.0 * r) == (0, 1)


def test_the_next_round_starts_without_a_trainer_that_never_picks_up_the_release():
    c = _coord()
    for rank in range(3):
        c.submit(1, rank, torch.tensor([1.0]), {}, now=0.0)
    c.poll_mean(1, 0, 0.0)
    c.release(1, 0, torch.zeros(0), {}, now=1.0)
    c.poll_release(1, 1, now=1.0)
    assert c.poll_start(1, now=5.9) == "wait"  # rank 2 may still come
    assert c.poll_start(1, now=6.1) == "go"  # round_timeout_s (5 s) after the release


# ---- the supervisor's fault policy (plain processes) -------------------------------------------------------
def _plan(tmp_path, trainer_code: str, server_code: str = "import time; time.sleep(600)") -> Plan:
    plan = Plan(machines=[("127.0.0.1", 1)], ip_config=str(tmp_path / "ip"))
    plan.procs.append(Proc("server", 0, 0, [PY, "-c", server_code], {}, str(tmp_path / "server0.log")))
    for rank in range(3):
        plan.procs.append(Proc("trainer", 0, rank, [PY, "-c", trainer_code], {"RANK": str(rank)},
                               str(tmp_path / f"rank{rank}.log")))
    return plan


RANK1_DIES = "import os, sys, time; r = int(os.environ['RANK']); time.sleep(0.5 if r == 1 else 2); sys.exit(r == 1)"


def test_supervisor_lets_the_others_finish_when_the_pipeline_tolerates_it(tmp_path):
    said = []
    t0 = time.monotonic()
    out = Supervisor(_plan(tmp_path, RANK1_DIES), tolerate_trainer_faults=True, poll_s=0.1,
                     console=open(os.devnull, "wb"), say=said.append).run()
    assert out.ok and [p.index for p in out.dead_trainers] == [1]
    assert any("trainer rank 1 (machine 0)" in s and "go on without it" in s for s in said)
    assert time.monotonic() - t0 < 15  # servers stopped at once, not after the grace period
    assert not fake_entry.processes_mentioning("time.sleep(600)")


def test_supervisor_default_policy_stops_everything_when_a_trainer_dies(tmp_path):
    out = Supervisor(_plan(tmp_path, RANK1_DIES), poll_s=0.1, console=open(os.devnull, "wb"),
                     say=lambda m: None).run()
    assert not out.ok and out.failed.index == 1 and out.failed.role == "trainer"


ALL_DIE = "import os, sys, time; time.sleep(0.5 + 0.7 * int(os.environ['RANK'])); sys.exit(1)"


def test_supervisor_tolerant_policy_still_stops_on_a_dead_server_or_no_trainer_left(tmp_path):
    out = Supervisor(_plan(tmp_path, "import time; time.sleep(600)", "import sys; sys.exit(3)"),
                     tolerate_trainer_faults=True, poll_s=0.1, console=open(os.devnull, "wb"),
                     say=lambda m: None).run()
    assert not out.ok and out.failed.role == "server"
    said = []
    out = Supervisor(_plan(tmp_path, ALL_DIE), tolerate_trainer_faults=True, poll_s=0.1,
                     console=open(os.devnull, "wb"), say=said.append).run()
    assert not out.ok and out.failed.role == "trainer" and len(out.dead_trainers) == 3
    deaths = [s for s in said if "exited with code 1" in s and s.startswith("trainer rank")]
    assert [d.split(" (")[0] for d in deaths] == ["trainer rank 0", "trainer rank 1", "trainer rank 2"]
    assert all("the other trainers go on without it" in d for d in deaths[:2]), deaths
    assert "no trainer is left" in deaths[2] and "go on" not in deaths[2], deaths
    # the fault line names every trainer that died, not only the last one
    assert out.message.startswith("every trainer died, no trainer is left: "), out.message
    assert all(f"trainer rank {r} (machine 0) pid " in out.message for r in range(3)), out.message
    assert not fake_entry.processes_mentioning("time.sleep(600)")


# rank 1 stops itself with SIGSTOP; the others run on (rank 0 and 2 finish after 8 s)
RANK1_STOPS = ("import os, signal, time; r = int(os.environ['RANK']); time.sleep(0.3)\n"
               "if r == 1: os.kill(os.getpid(), signal.SIGSTOP)\n"
               "time.sleep(8 if r != 1 else 600)")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tolerant", [False, True])
def test_supervisor_names_a_stopped_trainer_within_seconds(tmp_path, tolerant):
    said = []
    t0 = time.monotonic()
    sup = Supervisor(_plan(tmp_path, RANK1_STOPS), tolerate_trainer_faults=tolerant, poll_s=0.1,
                     hang_timeout_s=300, console=open(os.devnull, "wb"), say=said.append)
    out = sup.run()
    line = [s for s in said if "is stopped" in s]
    assert len(line) == 1 and "trainer rank 1 (machine 0) pid " in line[0], said
    assert "SIGSTOP" in line[0] and "kill -CONT" in line[0] and "rank1.log" in line[0]
    if tolerant:  # left behind like a dead trainer: the others finish, the run succeeds
        assert out.ok and [p.index for p in out.dead_trainers] == [1]
        assert "the other trainers go on without it" in line[0]
    else:
        assert not out.ok and out.failed.index == 1 and out.message == line[0]
        assert "stopping every other process" in line[0]
        assert time.monotonic() - t0 < 15  # the hang timeout (300 s) is not waited for
    assert not fake_entry.processes_mentioning("time.sleep(600)")


# ---- real runs (netns) ---------------------------------------------------------------------------------------
netns = needs_netns
BASE = ["-m", "degnn.launch", "pipeline=tma", "cluster=netns", "dataset=synthetic-tiny"]


def _launch(run_dir, *overrides, timeout=240, base=BASE):
    r = subprocess.run([PY, *base, *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    return r


def _summary(run_dir) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def _nothing_left(run_dir) -> None:
    assert not fake_entry.processes_mentioning(str(run_dir))
    from degnn.launch.netns import _ours
    from degnn.proc import pid_alive
    assert not [n for n in list_namespaces() if _ours(n) is not None and not pid_alive(_ours(n))]


@netns
@pytest.mark.parametrize("variant,backend", [("random", "dgl"), ("llcg", "torch")])
def test_each_variant_trains_averages_and_evaluates_on_two_machines(tmp_path, variant, backend):
    """random and llcg here; supernode and psgd-pa, which differ from random only in the partition
    they train on (VARIANT_PARTITION), run in the dropped-partition and the resume tests below.
    random trains on a chunked graph (the streaming generator's), partitioned in passes over its
    chunks (partitioners/stream_random.py); llcg runs with the plain-torch layers
    (model.backend=torch: local training, the correction and the shared evaluation) and learns as
    well. random keeps the shared evaluation's hidden layer in float16 (train.eval_hidden_dtype):
    its accuracy bar is met through those tables."""
    run_dir = tmp_path / "run"
    # LLCG evaluates only the last of its 2 rounds (train.eval_every=2): round 1 is averaged,
    # corrected and released without an evaluation
    every = 2 if variant == "llcg" else 1
    chunked = variant == "random"
    base = [a if a != "dataset=synthetic-tiny" else "dataset=synthetic-chunked-tiny" for a in BASE] if chunked else BASE
    r = _launch(run_dir, "cluster.machines=2", f"pipeline.variant={variant}", "pipeline.time_limit_s=8",
                "pipeline.sync_every_s=4", f"train.eval_every={every}", f"model.backend={backend}",
                f"train.eval_hidden_dtype={'float16' if chunked else 'float32'}", base=base)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert f"result: pipeline=tma/{variant}" in r.stdout
    s = _summary(run_dir)
    assert s["status"] == "ok" and s["rounds"] == 2 and s["epochs"] == 2
    assert s["trainers_alive"] == 2 and s["trainers_dead_ranks"] == [] and "trainers_died" not in s
    assert s["partition_method"] == VARIANT_PARTITION[variant]
    if chunked:  # trained on the chunked graph, cut by the random assignment of its seed
        from degnn.chunked import open_chunked, read_whole
        from degnn.data.chunked_dataset import chunked_folder
        from partitioners.assign import random_assignment
        from partitioners.stats import digest

        from omegaconf import OmegaConf
        cfg = OmegaConf.load(REPO / "conf" / "dataset" / "synthetic-chunked-tiny.yaml")
        cfg.root = str(REPO / "data")
        src, dst, nd = read_whole(open_chunked(chunked_folder(cfg)))
        assert s["graph_digest"] == digest(src, dst, nd["train_mask"], nd["label"]), s
        assert s["partition_digest"] == digest(random_assignment(len(nd["label"]), 2, 0)), s
        assert s["partition_streamed"] is True, s  # cut in passes over the chunks, never loaded whole
    assert s["best_val"] > 0.4 and s["test"] is not None and s["test_final"] is not None  # 8 classes
    steps = s["steps_per_trainer"]
    assert set(steps) == {"0", "1"} and min(steps.values()) > 0 and s["batches"] == sum(steps.values())
    # parameters up and the mean down per trainer and round, round 0 included (LLCG: + the correction)
    per_round = 3 if variant == "llcg" else 2
    assert s["averaging_bytes"] == s["param_bytes"] * 2 * (2 + per_round * s["rounds"])
    assert (s["correction_bytes"] > 0) == (variant == "llcg")
    # local training moves no graph, feature or sampling data, and rounds start only once the
    # averaging traffic is over: while the trainers trained, all links together carried less than
    # one copy of the model (TCP acks and the like)
    assert s["net_bytes_train"] < s["param_bytes"], s["net_bytes_train_per_trainer"]
    curve = read_curve(run_dir)
    assert [c["round"] for c in curve] == [1, 2]
    assert all(c["trainers"] == [0, 1] and set(c["steps"]) == {"0", "1"} for c in curve)
    assert sum(c["averaging_bytes"] for c in curve) == s["averaging_bytes"] - 4 * s["param_bytes"]  # - round 0
    assert curve[1]["train_time_s"] > curve[0]["train_time_s"] >= 4
    evaluated = [c["round"] for c in curve if "val" in c]
    assert evaluated == ([2] if every == 2 else [1, 2]) and s["best_epoch"] in evaluated
    assert [c["round"] for c in curve if "eval_s" in c] == evaluated
    if importlib.util.find_spec("tensorboard") is not None:  # the evaluator's event file, per round
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run_dir))
        acc.Reload()
        assert [e.step for e in acc.Scalars(f"eval/val_{s['metric']}")] == evaluated
        assert [e.value for e in acc.Scalars("run/averaging_bytes")] == [c["averaging_bytes"] for c in curve]
    assert (run_dir / "best_model.pt").is_file() and (run_dir / "tma_rank1.pt").is_file()
    # the averaging itself: after the last round every trainer holds the same model (the mean, or
    # LLCG's correction of it), and it is the model the evaluator scored and checkpointed
    own = [torch.load(run_dir / f"tma_rank{r}.pt", weights_only=True) for r in (0, 1)]
    shared = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    assert own[0]["round"] == own[1]["round"] == 2
    for name, t in shared.items():
        assert torch.equal(own[0]["model"][name], t) and torch.equal(own[1]["model"][name], t), name
    _nothing_left(run_dir)


@netns
def test_a_dropped_partition_is_never_trained(tmp_path):
    run_dir = tmp_path / "run"
    r = _launch(run_dir, "cluster.machines=2", "pipeline.variant=supernode", "pipeline.drop_parts=[1]",
                "pipeline.time_limit_s=6", "pipeline.sync_every_s=3")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    s = _summary(run_dir)
    assert s["status"] == "ok" and s["trainers_alive"] == 1 and s["drop_parts"] == [1]
    assert s["partition_method"] == "supernode" and "result: pipeline=tma/supernode" in r.stdout
    assert s["best_val"] > 0.4  # 8 classes: one trainer alone learns on its supernode partition
    assert set(s["steps_per_trainer"]) == {"0"} and s["steps_per_trainer"]["0"] > 0
    assert all(c["trainers"] == [0] for c in read_curve(run_dir))
    assert "was dropped" in (run_dir / "rank1.log").read_text()
    _nothing_left(run_dir)


def _split_sizes(run_dir) -> dict:
    """The validation and test nodes of the run's dataset (read from the dataset, not the run)."""
    from degnn.data import load_dataset

    g = load_dataset(OmegaConf.load(Path(run_dir) / "config.yaml").dataset).graph
    return {k: int(g.ndata[f"{k}_mask"].sum()) for k in ("val", "test")}


def _assert_the_evaluation_went_on_without(run_dir, s, curve, machines: int, victim: int) -> None:
    """Every evaluation scored every validation and test node, by the live trainers: the dead one's
    partition evaluated by the others (4 units a partition; 2 layers and the scoring; round 2 from
    its second layer where it died evaluating), and its bytes counted as the wire carried them."""
    sizes = _split_sizes(run_dir)
    assert s["eval_counts"] == sizes and all(c["eval_counts"] == sizes for c in curve), sizes
    assert curve[0]["eval_trainers"] == list(range(machines)) and curve[0]["eval_handed_on"] == 0
    assert curve[1]["eval_handed_on"] >= (8 if victim == 0 else 12)
    assert all(c["eval_trainers"] == curve[-1]["trainers"] and c["eval_handed_on"] == 12 for c in curve[2:])
    # every trainer's evaluation bytes are in the summary: the count is the wire's (evaluation is
    # most of the traffic here; the dead one's unfinished unit and rank 0's local averaging aside)
    app = sum(s["app_bytes_by_category"].values())
    assert abs(app - s["net_bytes_total"]) < 0.05 * s["net_bytes_total"], (s["app_bytes_by_category"], s["net_bytes_total"])
    assert s["best_val"] > 0.4
    assert s["net_bytes_train"] < s["param_bytes"], s["net_bytes_train_per_trainer"]


@netns
def test_the_lead_killed_while_evaluating_does_not_stop_training(tmp_path):
    """Rank 0, the lead of the evaluation, SIGKILLs itself in the middle of round 2's evaluation,
    holding a unit of the second layer (pipeline.kill_rank, the benchmarks' fault injection): after
    evaluator_timeout_s its units go to the live trainers and the lowest live rank leads round 2
    instead. Every evaluation, the one it died in too, scores every validation and test node. (A
    trainer stopped from outside between rounds: the SIGSTOP test below.)"""
    run_dir = tmp_path / "run"
    machines, victim = 3, 0
    p = subprocess.Popen([PY, *BASE, f"cluster.machines={machines}", "pipeline.time_limit_s=12",
                          "pipeline.sync_every_s=4", "pipeline.round_timeout_s=3", "pipeline.evaluator_timeout_s=6",
                          f"pipeline.kill_rank={victim}", "pipeline.kill_at_s=6", "pipeline.kill_during=eval",
                          f"hydra.run.dir={run_dir}"], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=200)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, (out[-2000:], err[-3000:])
    assert f"trainer rank {victim} (machine {victim})" in err and "was killed by SIGKILL" in err
    assert "go on without it" in err
    s = _summary(run_dir)
    assert s["status"] == "ok" and s["rounds"] == 3
    assert s["trainers_alive"] == machines - 1 and s["trainers_died"] == [victim]
    assert s["trainers_dead_ranks"] == [victim] and victim not in s["trainers_alive_ranks"]
    assert "killing myself (SIGKILL) in the evaluation of round 2" in (run_dir / "rank0.log").read_text()
    # the next contributing rank leads (rank 2 if rank 1 was late for round 2 on a loaded host)
    logs = (run_dir / "rank1.log").read_text() + (run_dir / "rank2.log").read_text()
    assert "round 2: taking over evaluation from rank 0" in logs
    assert "evaluator rank 0 silent" in logs
    curve = read_curve(run_dir)
    assert [c["round"] for c in curve] == [1, 2, 3]  # every round evaluated exactly once
    assert curve[0]["trainers"] == list(range(machines))
    assert curve[-1]["trainers"] == [1, 2]
    assert curve[1]["trainers"] == [0, 1, 2]  # it had submitted round 2 before it died evaluating it
    assert "units [0] of phase 1 that rank 0 held go to live trainers" in logs
    _assert_the_evaluation_went_on_without(run_dir, s, curve, machines, victim)
    _nothing_left(run_dir)


@netns
def test_a_hung_trainer_is_left_behind_and_stopped_at_the_end(tmp_path):
    """SIGSTOP (not kill) rank 2 of 3 from outside after round 1: the coordinator counts it dead at
    the next deadline, the others finish, evaluating its partition for it (as for a killed one),
    and the launcher kills the stopped process within seconds (hang.STOPPED_LIMIT_S, not
    hang_timeout_s)."""
    run_dir = tmp_path / "run"
    p = subprocess.Popen([PY, *BASE, "cluster.machines=3", "pipeline.time_limit_s=12", "pipeline.sync_every_s=4",
                          "pipeline.round_timeout_s=3", "pipeline.evaluator_timeout_s=6", "cluster.hang_timeout_s=10",
                          f"hydra.run.dir={run_dir}"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 200
        pid = None
        while pid is None and time.monotonic() < deadline and p.poll() is None:
            if read_curve(run_dir):
                pid = next((q for q in fake_entry.processes_mentioning(str(run_dir))
                            if environ_of(q).get("RANK") == "2" and environ_of(q).get("DGL_ROLE") == "client"), None)
            time.sleep(0.2)
        assert pid, "round 1 never came"
        os.kill(pid, signal.SIGSTOP)
        out, err = p.communicate(timeout=200)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-3000:]
    # stopped by a signal: named within seconds and left behind like a dead trainer
    assert f"trainer rank 2 (machine 2) pid {pid} is stopped by a signal (SIGSTOP" in err, err[-3000:]
    s = _summary(run_dir)
    assert s["status"] == "ok" and s["rounds"] == 3 and s["trainers_alive"] == 2 and s["trainers_died"] == [2]
    assert s["trainers_dead_ranks"] == [2] and 2 not in s["trainers_alive_ranks"]
    curve = read_curve(run_dir)
    assert [c["trainers"] for c in curve] == [[0, 1, 2], [0, 1], [0, 1]]
    _assert_the_evaluation_went_on_without(run_dir, s, curve, 3, 2)
    _nothing_left(run_dir)


@netns
def test_resume_continues_the_rounds(tmp_path):
    run1, run2 = tmp_path / "run1", tmp_path / "run2"
    common = ["cluster.machines=2", "pipeline.variant=psgd-pa", "pipeline.sync_every_s=3"]
    r = _launch(run1, *common, "pipeline.time_limit_s=6")
    assert r.returncode == 0, r.stderr[-3000:]
    r = _launch(run2, *common, "pipeline.time_limit_s=9", f"resume={run1}")
    assert r.returncode == 0, r.stderr[-3000:]
    c1, c2 = read_curve(run1), read_curve(run2)
    assert [c["round"] for c in c2] == [1, 2, 3] and c2[:2] == c1
    assert c2[2]["train_time_s"] > c1[1]["train_time_s"]
    s1, s2 = _summary(run1), _summary(run2)
    assert s2["rounds"] == 3 and s1["partition_method"] == s2["partition_method"] == "metis"
    assert s2["best_val"] > 0.4 and s2["test"] is not None  # psgd-pa learns (8 classes)
    # each trainer continued from its own step count (its checkpointed model and optimizer)
    for rank in ("0", "1"):
        assert s2["steps_per_trainer"][rank] > s1["steps_per_trainer"][rank]


# ---- bench=tma and its report ---------------------------------------------------------------------------------
def test_bench_tma_composes_and_every_job_is_a_valid_tma_or_distdgl_run():
    from hydra import compose, initialize_config_dir

    from degnn.config import CONF_DIR, register_configs

    from benchmarks.config import compose_bench

    register_configs()
    bench = compose_bench(["bench=tma"])
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        seen = set()
        for suite in bench.bench.suites:
            sweeps = [[o] if "[" in o else [f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")]
                      for o in suite.overrides]
            import itertools
            for job in itertools.product(*sweeps):
                cfg = compose("config", overrides=list(job))
                if cfg.pipeline.name == "tma":
                    OmegaConf.set_struct(cfg, True)
                    TMAPipeline.prepare_launch(cfg, list(job))  # the launcher's own checks
                    budget = cfg.pipeline.time_limit_s
                else:
                    budget = cfg.train.time_limit_s
                # one budget and the paper's fan-outs for every method
                assert budget == 90 and cfg.cluster.machines == 4, suite.name
                if cfg.pipeline.name == "tma":  # at least 30 averaging rounds in the budget
                    assert budget / cfg.pipeline.sync_every_s >= 30, suite.name
                assert list(cfg.model.fanouts) == [10, 25], suite.name
                seen.add((cfg.pipeline.name, cfg.pipeline.get("variant"), cfg.cluster.bandwidth,
                          cfg.pipeline.get("kill_rank"), tuple(cfg.pipeline.get("drop_parts", ()))))
    for variant in VARIANT_PARTITION:
        assert ("tma", variant, "100mbit", None, ()) in seen
    assert ("distdgl", "default", "100mbit", None, ()) in seen and ("distdgl", "default", "1gbit", None, ()) in seen
    assert ("tma", "random", "100mbit", 3, ()) in seen and ("tma", "random", "100mbit", None, (3,)) in seen


def _fake(root, name, curve, **summary):
    d = root / name
    d.mkdir(parents=True)
    base = {"status": "ok", "dataset": "wordnet", "machines": 4, "layers": 2, "model": "sage", "metric": "acc",
            "bandwidth": "100mbit"}
    (d / "summary.json").write_text(json.dumps({**base, **summary}))
    (d / "curve.jsonl").write_text("".join(json.dumps({"train_time_s": t, "val": v}) + "\n" for t, v in curve))


def test_report_has_the_tma_tables_without_variants_overwriting_each_other(tmp_path):
    from benchmarks.report import write_report

    _fake(tmp_path, "d/0", [(10, 0.60), (20, 0.70), (40, 0.72)], pipeline="distdgl", variant="default",
          best_val=0.72, test=0.70, test_final=0.69, batches=400, trainers=4, train_time_s=40.0,
          net_bytes_total=9e8, net_bytes_train=8e8)
    tma = dict(pipeline="tma", trainers=4, rounds=5, train_time_s=45.0, averaging_bytes=2e6, net_bytes_total=1e8,
               net_bytes_train=1000, steps_per_s_per_trainer={"0": 10.0, "1": 12.0})
    _fake(tmp_path, "t/0", [(9, 0.65), (18, 0.715)], variant="random", best_val=0.715, test=0.71, test_final=0.70,
          label_tv_mean=0.01, partition_method="random", edges_kept_fraction=0.25, **tma)
    _fake(tmp_path, "t/1", [(9, 0.60), (18, 0.66)], variant="psgd-pa", best_val=0.66, test=0.65, test_final=0.65,
          label_tv_mean=0.30, partition_method="metis", edges_kept_fraction=0.85, **tma)
    _fake(tmp_path, "k/0", [(9, 0.64), (18, 0.70)], variant="random", best_val=0.70, test=0.695, test_final=0.69,
          kill_rank=3, kill_at_s=15.0, trainers_alive=3, **tma)
    text = write_report(tmp_path).read_text()
    assert "### wordnet, 4 machines, 100mbit links, 2 layers, sage" in text
    assert "Target validation: 0.7100 (distdgl reached it at 40.0s)" in text
    # RandomTMA reaches 0.71 at 18 s: 40 / 18 = 2.22x; PSGD-PA never does
    assert "| tma/random | random | 0.250 | 0.010 | 0.7150 | 0.7100 | 0.7000 | 18.0 | 2.22x | 11.0 | 5 |" in text
    assert "| tma/psgd-pa | metis | 0.850 | 0.300 | 0.6600 | 0.6500 | 0.6500 | – | – | 11.0 | 5 |" in text
    assert "| distdgl | – | 1.000 | – | 0.7200 | 0.7000 | 0.6900 | 40.0 | 1.00x | 2.5 |" in text
    # the failure run against the same method without it: 0.71 - 0.695 = 1.5 points
    assert "| wordnet 100mbit | tma/random | rank 3 killed at 15s | 3 | 0.6950 | 0.7100 | +1.50 | ok |" in text
    assert (tmp_path / "tma-curves-wordnet-100mbit-sage.png").stat().st_size > 1000
    # the general table tells the variants and the failure apart
    assert "| tma/random | wordnet |" in text and "| tma/psgd-pa | wordnet |" in text
    assert "| tma/random (rank 3 killed at 15s) | wordnet |" in text


@netns
def test_distdgl_honours_the_same_wall_time_budget(tmp_path):
    """bench=tma gives distdgl the TMA runs' budget: train.time_limit_s stops it after the epoch
    in which its training time (evaluation excluded) reached the limit."""
    run_dir = tmp_path / "run"
    r = subprocess.run([PY, "-m", "degnn.launch", "pipeline=distdgl", "cluster=netns", "cluster.machines=2",
                        "dataset=synthetic-tiny", "train.epochs=500", "train.time_limit_s=3",
                        f"hydra.run.dir={run_dir}"], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    s, curve = _summary(run_dir), read_curve(run_dir)
    assert s["status"] == "ok" and 1 <= s["epochs"] < 500
    # the curve rounds to ms: a time just under the limit (2.9996 s) is written as 3.0
    assert curve[-1]["train_time_s"] >= 3 >= curve[-2]["train_time_s"] if len(curve) > 1 else curve[-1]["train_time_s"] >= 3, curve[-2:]
    assert "val" in curve[-1]  # the last epoch is evaluated
    assert "time limit" in (run_dir / "rank0.log").read_text()
