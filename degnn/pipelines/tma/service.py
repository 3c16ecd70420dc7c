"""The averaging service's messages: DGL RPC requests to graph server 0, where each is handed to
the run's Coordinator (coordinator.py has the round they make up). The services are registered
in every server and trainer (`pipeline.services` in conf/pipeline/tma.yaml,
degnn.runtime.services); this module imports dgl and torch only.

One dataclass per message, as LAMP's service does (degnn.runtime.services' MessageRequest: the
fields are the RPC state, tensors shipped raw; `process` runs in the server):

| id     | request     | fields                                             | answer: its statuses                        |
|--------|-------------|----------------------------------------------------|---------------------------------------------|
| 774201 | Hello       | rank, the run's plan (ranks, timeouts, units, ...) | Status: ok                                  |
| 774202 | Submit      | round, rank, weights, weight, stats                | Status: ok, late                            |
| 774203 | PollMean    | round, rank                                        | Weights: wait, mean                         |
| 774204 | Beat        | round, rank, unit (None: the lead)                 | Status: ok, not-holder, not-evaluator       |
| 774205 | EvalPoll    | round, rank                                        | Weights: wait, lead, work, scored, released |
| 774206 | EvalOpen    | round, rank, weights (LLCG), corr_s                | Status: ok, not-evaluator                   |
| 774207 | EvalDone    | round, rank, phase, unit, partial, stats           | Status: ok, late                            |
| 774208 | Release     | round, rank, weights, state                        | Status: ok, not-evaluator                   |
| 774209 | PollStart   | round, rank                                        | Status: go, wait                            |
| 774210 | PollRelease | round, rank                                        | Weights: wait, released                     |

An answer's `error` (non-empty) says why the server could not answer; the client raises
CoordinatorError with it. Every request is answered, errors included: an exception inside a DGL
server would kill the server (docs/background.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from dgl.distributed import rpc

from degnn.runtime.services import MessageRequest, MessageResponse, tensor_bytes

from .coordinator import EMPTY, Coordinator

COORDINATOR_SERVER = 0  # the service lives on graph server 0 (machine 0's first server)
FIRST_SERVICE_ID = 774201  # far from DGL's own ids (6657-6662, 901231-901240) and LAMP's (7710-7716)

# the server's coordinator of this run (one per server process; servers live for one run)
STATE: Dict[str, Coordinator] = {}


class CoordinatorError(RuntimeError):
    pass


def _empty() -> torch.Tensor:
    return EMPTY


# --- answers -------------------------------------------------------------------------------------
@dataclass(eq=False)
class Status(MessageResponse):
    status: str = ""


@dataclass(eq=False)
class Weights(MessageResponse):
    """A status with weights (empty: none for this rank) and the round's facts (`meta`)."""
    status: str = ""
    weights: torch.Tensor = field(default_factory=_empty)
    meta: dict = field(default_factory=dict)


def _weights(answer: tuple) -> Weights:
    status, weights, meta = answer
    return Weights(status=status, weights=weights, meta=meta)


# --- requests ------------------------------------------------------------------------------------
class _CoordinatorRequest(MessageRequest):
    response_cls = Status

    def process(self, server_state):
        coord = STATE.get("run")
        if coord is None:
            raise CoordinatorError("coordinator not started (no Hello)")
        return self.answer(coord, time.time())

    def answer(self, coord: Coordinator, now: float):
        raise NotImplementedError


@dataclass(eq=False)
class Hello(_CoordinatorRequest):
    """Every trainer's first request; the first one starts the run's coordinator."""
    rank: int
    active: List[int]
    start_timeout_s: float
    round_timeout_s: float
    evaluator_timeout_s: float
    homes: List[int]
    phases: int
    corrects: bool
    eval_every: int
    rounds_total: int

    def process(self, server_state):
        if "run" not in STATE:
            STATE["run"] = Coordinator(self.active, self.round_timeout_s, self.start_timeout_s,
                                       self.evaluator_timeout_s, self.homes, self.phases, self.corrects,
                                       self.eval_every, self.rounds_total)
        return Status(status="ok")


@dataclass(eq=False)
class Submit(_CoordinatorRequest):
    """A trainer's parameters for round r (round 0: its initial ones) and its stats."""
    round: int
    rank: int
    weights: torch.Tensor
    weight: float = 1.0
    stats: dict = field(default_factory=dict)

    def answer(self, coord, now):
        meta = {"weight": self.weight, "stats": self.stats}
        return Status(status=coord.submit(self.round, self.rank, self.weights, meta, now))


@dataclass(eq=False)
class PollMean(_CoordinatorRequest):
    round: int
    rank: int
    response_cls = Weights

    def answer(self, coord, now):
        return _weights(coord.poll_mean(self.round, self.rank, now))


@dataclass(eq=False)
class Beat(_CoordinatorRequest):
    """A sign of life of the round's lead (`unit` None) or of the worker computing `unit`."""
    round: int
    rank: int
    unit: Optional[int] = None

    def answer(self, coord, now):
        return Status(status=coord.beat(self.round, self.rank, now, self.unit))


@dataclass(eq=False)
class EvalPoll(_CoordinatorRequest):
    round: int
    rank: int
    response_cls = Weights

    def answer(self, coord, now):
        return _weights(coord.eval_poll(self.round, self.rank, now))


@dataclass(eq=False)
class EvalOpen(_CoordinatorRequest):
    """The lead opens the evaluation (LLCG: with the corrected weights and the correction's time)."""
    round: int
    rank: int
    weights: torch.Tensor = field(default_factory=_empty)
    corr_s: float = 0.0

    def answer(self, coord, now):
        return Status(status=coord.eval_open(self.round, self.rank, self.weights, {"corr_s": self.corr_s}, now))


@dataclass(eq=False)
class EvalDone(_CoordinatorRequest):
    """A unit computed: a layer's rows ({}) or the scoring's metric sums (`partial`)."""
    round: int
    rank: int
    phase: int
    unit: int
    partial: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)

    def answer(self, coord, now):
        meta = {"phase": self.phase, "unit": self.unit, "partial": self.partial, "stats": self.stats}
        return Status(status=coord.eval_done(self.round, self.rank, meta, now))


@dataclass(eq=False)
class Release(_CoordinatorRequest):
    """The lead has recorded round r: its shared `state` goes to every trainer."""
    round: int
    rank: int
    weights: torch.Tensor = field(default_factory=_empty)
    state: dict = field(default_factory=dict)

    def answer(self, coord, now):
        return Status(status=coord.release(self.round, self.rank, self.weights, {"state": self.state}, now))


@dataclass(eq=False)
class PollStart(_CoordinatorRequest):
    round: int
    rank: int

    def answer(self, coord, now):
        return Status(status=coord.poll_start(self.round, now))


@dataclass(eq=False)
class PollRelease(_CoordinatorRequest):
    round: int
    rank: int
    response_cls = Weights

    def answer(self, coord, now):
        return _weights(coord.poll_release(self.round, self.rank, now))


REQUESTS = (Hello, Submit, PollMean, Beat, EvalPoll, EvalOpen, EvalDone, Release, PollStart, PollRelease)
SERVICES = [(FIRST_SERVICE_ID + i, req, req.response_cls) for i, req in enumerate(REQUESTS)]


# --- the trainer side ------------------------------------------------------------------------------
class CoordinatorClient:
    """One request, one response, in this process's RPC order.

    Counts the bytes it moves (tensor payloads; the pickled remainder is a few hundred bytes) in
    the run's ByteCounter under `averaging`, unless the caller names another category (None: the
    caller has counted them itself).
    """

    def __init__(self, rank: int, counter, poll_s: float = 0.05):
        self.rank = rank
        self.counter = counter
        self.poll_s = poll_s

    def exchange(self, req):
        """The server's answer to `req` (a test may answer in-process instead)."""
        rpc.send_request(COORDINATOR_SERVER, req)
        return rpc.recv_response()

    def call(self, req, category: Optional[str] = "averaging"):
        res = self.exchange(req)
        if res.error:
            raise CoordinatorError(f"averaging service on server {COORDINATOR_SERVER}: {res.error}")
        if self.counter is not None and category is not None:
            self.counter.add(category, tensor_bytes(req) + tensor_bytes(res))
        return res

    def wait(self, req, until: tuple, category: Optional[str] = "averaging"):
        """Send `req` until the answer's status is one of `until`."""
        while True:
            res = self.call(req, category=category)
            if res.status in until:
                return res
            time.sleep(self.poll_s)
