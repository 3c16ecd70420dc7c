"""TMA's round driver and its contract without a cluster: the coordinator's messages as DGL
serialises them, and RoundLoop over small fake pipelines (degnn/pipelines/tma/contract.py)
whose requests a lock-guarded in-process coordinator answers, as graph server 0 would."""
from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import fields
from types import SimpleNamespace

import pytest
import torch
from dgl.distributed import rpc
from timing import budget
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from degnn.entry import compose_config
from degnn.metrics import read_curve
from degnn.pipelines.base import Pipeline
from degnn.pipelines.tma import TMAPipeline
from degnn.pipelines.tma import service
from degnn.pipelines.tma.contract import RoundPipeline, RoundPlan
from degnn.pipelines.tma.rounds import RoundLoop
from degnn.runtime.context import RunContext
from degnn.runtime.services import MessageRequest, MessageResponse

W = torch.tensor([1.5, -2.0, 0.25])
SAMPLES = [
    service.Hello(2, [0, 1, 2], 180.0, 5.0, 10.0, [0, 0, 1], 3, True, 2, 7),
    service.Submit(4, 1, W, 2.5, {"loss": 0.5, "round_steps": 3}),
    service.PollMean(4, 2),
    service.Beat(4, 0, 3),
    service.Beat(4, 0, None),
    service.EvalPoll(4, 1),
    service.EvalOpen(4, 0, W, 0.75),
    service.EvalDone(4, 2, 1, 5, {"val": [1.5, 3]}, {"steps": 9}),
    service.Release(4, 0, torch.zeros(0), {"epoch": 4}),
    service.PollStart(4, 1),
    service.PollRelease(4, 3),
    service.Status(status="late"),
    service.Weights(status="mean", weights=W, meta={"contributors": [0, 2]}),
    service.Status(error="boom"),
]


def _wire(msg):
    """`msg` as the other side of a DGL RPC sees it (its own copy of the tensors)."""
    data, tensors = rpc.serialize_to_payload(msg)
    return rpc.deserialize_from_payload(type(msg), data, [t.clone() for t in tensors])


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_each_message_round_trips_its_fields(msg):
    back = _wire(msg)
    for f in fields(msg):
        a, b = getattr(msg, f.name), getattr(back, f.name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, f.name
    # tensors travel as DGL's raw payloads, not pickled
    _, tensors = rpc.serialize_to_payload(msg)
    assert len(tensors) == sum(isinstance(getattr(msg, f.name), torch.Tensor) for f in fields(msg))


def test_every_request_has_its_own_service_id_and_a_message_answer():
    ids = [sid for sid, _, _ in service.SERVICES]
    assert len(set(ids)) == len(ids) == len(service.REQUESTS) == 10
    for _, req, res in service.SERVICES:
        assert issubclass(req, MessageRequest) and issubclass(res, MessageResponse) and res is req.response_cls
    assert {type(m) for m in SAMPLES if isinstance(m, MessageRequest)} == set(service.REQUESTS)


def test_a_request_before_hello_is_answered_with_an_error_and_the_client_raises_it(capsys):
    service.STATE.clear()
    res = service.PollMean(1, 0).process_request(None)
    assert isinstance(res, service.Weights) and "coordinator not started" in res.error
    client = InProcessClient(0, None, threading.Lock())
    with pytest.raises(service.CoordinatorError, match="coordinator not started"):
        client.call(service.Submit(1, 0, W))
    assert "degnn service error" in capsys.readouterr().out  # the server's log says it too


# ---- the driver over fake pipelines ------------------------------------------------------------------------
class InProcessClient(service.CoordinatorClient):
    """Answers each request in this process, one at a time (the server loop is single-threaded),
    through DGL's serialisation both ways."""

    def __init__(self, rank, counter, lock):
        super().__init__(rank, counter, poll_s=0.005)
        self.lock = lock

    def exchange(self, req):
        with self.lock:
            return _wire(_wire(req).process_request(None))


class FakeRounds(Pipeline):
    """A round-based pipeline of one 3-parameter model: a round's training adds rank + 1 to
    every parameter (weight rank + 1 in the mean); a scoring unit reports the mean parameter as
    its validation metric. `nan_from` makes every loss non-finite from that round on; `dies_at`
    ends this trainer (its thread) in that round's training."""

    def __init__(self, ctx, plan_of, nan_from=None, dies_at=None):
        super().__init__(ctx, SimpleNamespace(metric="acc", summary=dict))
        self.plan_of, self.nan_from, self.dies_at = plan_of, nan_from, dies_at
        self.round, self.units = 0, []
        self.trained, self.loaded = [], []  # what it submitted after each round's training; every load

    def setup(self):
        self.model = torch.nn.Linear(3, 1, bias=False)
        with torch.no_grad():
            self.model.weight.fill_(float(self.ctx.rank))  # round 0 must replace these with rank 0's
        self.optimizer = torch.optim.Adam(self.model.parameters())
        self.plan = self.plan_of(self)

    def train_for(self, seconds):
        self.round += 1
        if self.round == self.dies_at:
            raise SystemExit("killed")
        with torch.no_grad():
            self.model.weight.add_(self.ctx.rank + 1.0)
        self.trained.append(self.export_weights())
        self.batches += 1
        return 1, float("nan") if self.nan_from and self.round >= self.nan_from else 0.5

    def export_weights(self):
        return parameters_to_vector(self.model.parameters()).detach().clone()

    def load_weights(self, flat):
        self.loaded.append(flat.clone())
        with torch.no_grad():
            vector_to_parameters(flat.float(), self.model.parameters())

    def correct(self, beat):
        return None

    def eval_unit(self, r, phase, unit, still_mine):
        assert still_mine()
        self.units.append((r, phase, unit))
        if phase < self.plan.phases - 1:
            return {}
        return {"val": [self.model.weight.mean().item(), 1], "test": [0.5, 1]}

    def own_state(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "steps": self.batches, "train_s": 0.0, "wire_train_bytes": 0}

    def load_own_state(self, state):
        self.model.load_state_dict(state["model"])

    def rank_stats(self):
        return {"rank": self.ctx.rank, "local_epochs": float(self.batches)}


def _run(tmp_path, n=3, rounds=3, **kw):
    """n fake trainers' drivers, each in a thread: (pipelines, drivers, results)."""
    service.STATE.clear()
    cfg = compose_config(["pipeline=tma", "dataset=synthetic-tiny", "train.tensorboard=false"])
    lock = threading.Lock()

    def plan_of(p):
        return RoundPlan(sync_s=0.01, limit_s=0.01 * rounds, active=list(range(n)), trains=True,
                         homes=list(range(n)), phases=2, corrects=False, eval_every=1,
                         round_timeout_s=0.5, evaluator_timeout_s=1.0, weight=p.ctx.rank + 1.0,
                         round_bytes=2 * p.param_bytes())

    pipes, drivers, results = [], [], {}
    for rank in range(n):
        ctx = RunContext(cfg=cfg, run_dir=tmp_path, rank=rank, world_size=n, local_rank=0, machines=n,
                         part_config=tmp_path, graph=None, log=logging.getLogger(f"fake{rank}"))
        ctx.counter.declare(TMAPipeline.byte_categories)
        pipes.append(FakeRounds(ctx, plan_of, **{k: v.get(rank) for k, v in kw.items()}))
        drivers.append(RoundLoop(pipes[-1], InProcessClient(rank, ctx.counter, lock)))

    def run(rank):
        try:
            results[rank] = drivers[rank].run()
        except SystemExit:
            results[rank] = "died"

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(budget(60))  # 10-30 s on this 2-core host beside a test suite; a loaded host stretches it
    assert not any(t.is_alive() for t in threads)
    return pipes, drivers, results


def _assert_each_round_released_the_weighted_mean_of_the_live(pipes, weights):
    """After round r every trainer that submitted it loaded sum(w_k theta_k) / sum(w_k) over the
    submissions of round r (theta_k: what rank k trained), and nothing else; round 0 is rank 0's
    initial weights."""
    for p in pipes:
        if p.trained:
            assert torch.equal(p.loaded[0], torch.zeros(3)), (p.ctx.rank, p.loaded[0])
    for r in range(1, max(len(p.trained) for p in pipes) + 1):
        live = [k for k, p in enumerate(pipes) if len(p.loaded) > r]
        mean = sum(weights[k] * pipes[k].trained[r - 1].double() for k in live) / sum(weights[k] for k in live)
        for k in live:
            assert torch.allclose(pipes[k].loaded[r].double(), mean), f"round {r}, rank {k}: {pipes[k].loaded[r]} != {mean}"


def test_the_fake_pipeline_is_a_round_pipeline(tmp_path):
    pipes, _, _ = _run(tmp_path, n=1, rounds=1)
    assert isinstance(pipes[0], RoundPipeline)


def test_the_driver_runs_the_rounds_with_the_weighted_mean(tmp_path):
    pipes, drivers, results = _run(tmp_path)
    # round 0 hands everyone rank 0's zeros; each round adds k + 1 on rank k, weighted k + 1:
    # the mean grows by (1*1 + 2*2 + 3*3) / (1 + 2 + 3) = 14/6 a round
    for p in pipes:
        assert torch.allclose(p.export_weights(), torch.full((3,), 3 * 14 / 6))
    _assert_each_round_released_the_weighted_mean_of_the_live(pipes, [1.0, 2.0, 3.0])
    curve = read_curve(tmp_path)
    assert [c["round"] for c in curve] == [1, 2, 3]
    assert all(c["trainers"] == [0, 1, 2] and c["steps"] == {"0": 1, "1": 1, "2": 1} for c in curve)
    assert [round(c["val"], 6) for c in curve] == [round(r * 14 / 6, 6) for r in (1, 2, 3)]
    assert all(c["averaging_bytes"] == 3 * 2 * 12 and c["eval_trainers"] == [0, 1, 2] for c in curve)
    # every trainer computed its own partition's unit of both phases, every round
    for rank, p in enumerate(pipes):
        assert p.units == [(r, ph, rank) for r in (1, 2, 3) for ph in (0, 1)]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "ok" and s["epochs"] == 3 and s["best_epoch"] == 3
    assert math.isclose(s["best_val"], 7.0, rel_tol=1e-6)
    assert results[0] == s and results[1] == results[2] == {"status": "ok"}
    assert all(d.all_trainers_alive for d in drivers)
    assert {f"tma_rank{k}.pt" for k in range(3)} <= {f.name for f in tmp_path.iterdir()}


def test_a_dead_trainer_is_left_out_and_its_units_handed_on(tmp_path):
    pipes, drivers, results = _run(tmp_path, dies_at={2: 2})
    assert results[2] == "died" and results[0]["status"] == "ok"
    curve = read_curve(tmp_path)
    assert [c["trainers"] for c in curve] == [[0, 1, 2], [0, 1], [0, 1]]
    # after round 1 (14/6) only ranks 0 and 1 add: (1*1 + 2*2) / 3 = 5/3 a round
    for p in pipes[:2]:
        assert torch.allclose(p.export_weights(), torch.full((3,), 14 / 6 + 2 * 5 / 3))
    assert [len(p.loaded) for p in pipes] == [4, 4, 2]  # rank 2 loaded rounds 0 and 1 only
    _assert_each_round_released_the_weighted_mean_of_the_live(pipes, [1.0, 2.0, 3.0])
    assert sorted(u for p in pipes[:2] for (r, ph, u) in p.units if r == 3 and ph == 1) == [0, 1, 2]
    assert not drivers[0].all_trainers_alive


def test_a_diverged_round_ends_the_run_through_the_record(tmp_path):
    _, drivers, results = _run(tmp_path, nan_from={0: 2, 1: 2, 2: 2})
    assert all(r["status"] == "failed" and r["error"].startswith("diverged at round 2: ") for r in results.values())
    curve = read_curve(tmp_path)
    assert [c["round"] for c in curve] == [1, 2] and curve[-1]["diverged"] is True and curve[-1]["loss"] is None
    # the round's lead wrote the whole summary (status failed, the rounds done) through the RunRecord
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"] == results[1]["error"] and s["epochs"] == 1
    assert drivers[0].record.wrote_summary and not drivers[1].record.wrote_summary


def test_tma_implements_every_member_of_the_contract_with_its_signature():
    import inspect

    methods = [n for n, v in vars(RoundPipeline).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert {"setup", "train_for", "export_weights", "load_weights", "correct", "eval_unit"} <= set(methods)
    for name in methods:
        want = list(inspect.signature(getattr(RoundPipeline, name)).parameters)
        assert list(inspect.signature(getattr(TMAPipeline, name)).parameters) == want, name
