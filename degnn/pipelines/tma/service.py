"""The averaging service: a DGL RPC service on graph server 0 that replaces every collective of a
TMA run, so that the run outlives a dead trainer.

Why not gloo: an all-reduce, barrier or all_gather blocks forever (or aborts) when one peer is dead
(docs/design.md, pitfalls). Here every exchange is a request to server 0 with a deadline kept by the
server, and a trainer that misses a deadline is simply left out:

round r (r = 0 is the start: the lowest rank's initial weights go to everyone, so every replica
starts identical, and the training clocks start together):
  1. each trainer `submit`s its flattened parameters (and its weight, and its stats) for round r;
  2. it `poll_mean`s until the round is closed: when every trainer still counted alive has
     submitted, or `round_timeout` after the first submission; whoever has not submitted by then
     is counted dead (it re-joins if it submits a later round). The answer is the weighted mean
     of the submissions, who contributed, and who evaluates (the lowest contributing rank);
  3. the evaluator (LLCG: corrects the mean first), evaluates, and `release`s the round,
     sending the corrected weights if there are any; it sends `beat`s while it works;
  4. the others `poll_release` until then. If the evaluator sends nothing for
     `evaluator_timeout`, it is counted dead and the next contributing rank is told to evaluate
     the round instead;
  5. everyone `poll_start`s until every live contributor has the released weights (round 0:
     the initial weights), or `round_timeout` has passed, and the next round's training starts.

A round in which every contributor that trained reports a non-finite loss has diverged: the
mean is not finite either, so nothing can come of going on. Its answer (`poll_mean`) carries
`diverged` (the error line) and every trainer ends the run (`end_diverged`): the round's
evaluator records it (a `diverged` line in curve.jsonl, summary.json with status failed), and
every trainer exits non-zero, as the epoch-loop pipelines do on a non-finite loss.

The server loop is single-threaded and has no timers, so deadlines are checked whenever a request
arrives (trainers poll every few tens of milliseconds while they wait). Every request is answered,
errors included: an exception inside a DGL server would kill the server (docs/background.md).

This module is imported by every server (degnn.runtime.services); it imports dgl and torch only.
"""
from __future__ import annotations

import math
import time
import traceback
from typing import Dict, List, Optional

import torch
from dgl.distributed import rpc

AVG_SERVICE_ID = 774201  # far from DGL's own ids (6657-6662, 901231-901240)
COORDINATOR_SERVER = 0  # the service lives on graph server 0 (machine 0's first server)

EMPTY = torch.zeros(0)


class _Round:
    def __init__(self):
        self.sum: Optional[torch.Tensor] = None
        self.wsum = 0.0
        self.init: Optional[torch.Tensor] = None  # round 0: the lowest rank's tensor
        self.init_rank: Optional[int] = None
        self.contributors: Dict[int, dict] = {}  # rank -> its stats
        self.first_t: Optional[float] = None
        self.closed = False
        self.mean: Optional[torch.Tensor] = None
        self.evaluator: Optional[int] = None
        self.last_beat = 0.0
        self.released = False
        self.release_tensor: Optional[torch.Tensor] = None
        self.release_meta: dict = {}
        self.release_t = 0.0
        self.picked: set = set()  # ranks that have the released weights
        self.got_mean: set = set()  # ranks that have the mean (round 0: the initial weights)
        self.close_t = 0.0
        self.diverged: Optional[str] = None  # the error line of a round whose losses are all non-finite


class Coordinator:
    """Server-side state of one run (one per server process; servers live for one run)."""

    def __init__(self, active: List[int], round_timeout_s: float, start_timeout_s: float,
                 evaluator_timeout_s: float):
        self.alive = set(active)
        self.dead: set = set()
        self.round_timeout_s = round_timeout_s
        self.start_timeout_s = start_timeout_s
        self.evaluator_timeout_s = evaluator_timeout_s
        self.rounds: Dict[int, _Round] = {}
        self.last_stats: Dict[int, dict] = {}  # every trainer's latest stats (dead ones too)
        self.log: List[str] = []

    def _round(self, r: int) -> _Round:
        if r not in self.rounds:
            self.rounds[r] = _Round()
        return self.rounds[r]

    def _close_if_due(self, r: int, now: float) -> None:
        rd = self._round(r)
        if rd.closed or rd.first_t is None:
            return
        timeout = self.start_timeout_s if r == 0 else self.round_timeout_s
        missing = self.alive - set(rd.contributors)
        if missing and now - rd.first_t < timeout:
            return
        for rank in missing:
            self.alive.discard(rank)
            self.dead.add(rank)
            self.log.append(f"round {r}: rank {rank} did not submit within {timeout:.0f}s; counted dead")
        rd.closed = True
        rd.mean = rd.init if r == 0 else rd.sum / rd.wsum
        rd.sum = None
        rd.evaluator = min(rd.contributors)
        rd.last_beat = rd.close_t = now
        if r > 0:
            rd.diverged = diverged_round(r, rd.contributors)
            if rd.diverged:
                self.log.append(rd.diverged)

    def submit(self, r: int, rank: int, tensor: torch.Tensor, meta: dict, now: float) -> str:
        rd = self._round(r)
        self.last_stats[rank] = meta.get("stats", {})
        if rank in self.dead:  # it was only late: count it again from the next round on
            self.dead.discard(rank)
            self.log.append(f"round {r}: rank {rank} is back")
        self.alive.add(rank)
        if rd.closed:
            return "late"
        if rank not in rd.contributors:
            rd.contributors[rank] = meta.get("stats", {})
            if rd.first_t is None:
                rd.first_t = now
            if r == 0:
                if rd.init_rank is None or rank < rd.init_rank:
                    rd.init, rd.init_rank = tensor.clone(), rank
                rd.wsum += 1.0
            else:
                w = float(meta.get("weight", 1.0))
                contrib = tensor.to(torch.float64) * w
                rd.sum = contrib if rd.sum is None else rd.sum + contrib
                rd.wsum += w
        self._close_if_due(r, now)
        return "ok"

    def poll_mean(self, r: int, rank: int, now: float):
        rd = self._round(r)
        self._close_if_due(r, now)
        if not rd.closed:
            return "wait", EMPTY, {}
        rd.got_mean.add(rank)
        return "mean", rd.mean.to(torch.float32), self._round_meta(rd)

    def _round_meta(self, rd: _Round) -> dict:
        meta = {"contributors": sorted(rd.contributors), "evaluator": rd.evaluator,
                "stats": dict(rd.contributors), "all_stats": dict(self.last_stats),
                "dead": sorted(self.dead), "log": list(self.log)}
        if rd.diverged:
            meta["diverged"] = rd.diverged
        return meta

    def beat(self, r: int, rank: int, now: float) -> str:
        rd = self._round(r)
        if rd.evaluator == rank:
            rd.last_beat = now
            return "ok"
        return "not-evaluator"  # it was declared dead and replaced: it must stop evaluating

    def release(self, r: int, rank: int, tensor: torch.Tensor, meta: dict, now: float) -> str:
        rd = self._round(r)
        if rd.evaluator != rank:
            return "not-evaluator"
        rd.released = True
        rd.release_tensor = tensor if tensor.numel() else None
        rd.release_meta = meta
        rd.release_t = now
        rd.picked.add(rank)
        return "ok"

    def poll_start(self, r: int, now: float) -> str:
        """'go' once every live contributor has the released weights (or `round_timeout` after the
        release): the next round starts together everywhere, and no averaging traffic is still
        under way while a trainer trains (the wire counters of the training intervals stay clean)."""
        rd = self._round(r)
        if r == 0:  # the start: every live trainer has the initial weights
            if not rd.closed:
                return "wait"
            have, since = rd.got_mean, rd.close_t
        else:
            if not rd.released:
                return "wait"
            have, since = rd.picked, rd.release_t
        waiting = (set(rd.contributors) & self.alive) - have
        return "go" if not waiting or now - since > self.round_timeout_s else "wait"

    def poll_release(self, r: int, rank: int, now: float):
        rd = self._round(r)
        self._close_if_due(r, now)
        if rd.released:
            rd.picked.add(rank)
            t = rd.release_tensor if rd.release_tensor is not None else EMPTY
            return "released", t, dict(rd.release_meta)
        if rd.closed and now - rd.last_beat > self.evaluator_timeout_s:
            old = rd.evaluator
            self.alive.discard(old)
            self.dead.add(old)
            candidates = sorted(c for c in rd.contributors if c not in self.dead)
            self.log.append(f"round {r}: evaluator rank {old} silent for "
                            f"{self.evaluator_timeout_s:.0f}s; counted dead")
            if candidates:
                rd.evaluator = candidates[0]
                rd.last_beat = now
        if rd.closed and rd.evaluator == rank:
            return "evaluate", rd.mean.to(torch.float32), self._round_meta(rd)
        return "wait", EMPTY, {}


def diverged_round(r: int, contributors: Dict[int, dict]) -> Optional[str]:
    """The error line of round r when every contributor that trained in it (round_steps > 0)
    reports a non-finite loss, else None."""
    trained = {rank: s.get("loss") for rank, s in contributors.items() if s.get("round_steps")}
    if not trained or any(isinstance(v, (int, float)) and math.isfinite(v) for v in trained.values()):
        return None
    return (f"diverged at round {r}: the training loss of every live trainer (ranks "
            f"{', '.join(map(str, sorted(trained)))}) is not finite; lower train.lr or check the data")


def end_diverged(ctx, r: int, meta: dict, wall0: float) -> dict:
    """A trainer's end of a diverged run (the coordinator's verdict in `meta`): the round's
    evaluator records it (curve.jsonl, summary.json with status failed; the launcher adds the
    rounds done), and every trainer returns the failed status (its exit code is then 1)."""
    from degnn.metrics import append_curve, write_summary

    error = meta["diverged"]
    ctx.log.error(error)
    if meta.get("evaluator") == ctx.rank:
        append_curve(ctx.run_dir, {"round": r, "loss": None, "diverged": True,
                                   "wall_s": round(time.time() - wall0, 3)})
        write_summary(ctx.run_dir, {"status": "failed", "error": error})
    return {"status": "failed", "error": error}


_STATE: Dict[str, Coordinator] = {}


class AvgRequest(rpc.Request):
    """One call to the coordinator: op, round, rank, a tensor (flat parameters) and a small dict."""

    def __init__(self, op: str, round_: int, rank: int, tensor: Optional[torch.Tensor] = None,
                 meta: Optional[dict] = None):
        self.op, self.round, self.rank = op, round_, rank
        self.tensor = EMPTY if tensor is None else tensor
        self.meta = meta or {}

    def __getstate__(self):
        # tensors as top-level members: DGL ships them as raw payloads, the rest is pickled
        return self.op, self.round, self.rank, self.tensor, self.meta

    def __setstate__(self, state):
        self.op, self.round, self.rank, self.tensor, self.meta = state

    def process_request(self, server_state):
        try:
            return self._process(time.time())
        except Exception:  # noqa: BLE001 - an exception here would kill the server
            return AvgResponse("error", EMPTY, {"error": traceback.format_exc(limit=5)})

    def _process(self, now: float):
        coord = _STATE.get("run")
        if self.op == "hello":
            if coord is None:
                m = self.meta
                coord = _STATE["run"] = Coordinator(m["active"], m["round_timeout_s"],
                                                    m["start_timeout_s"], m["evaluator_timeout_s"])
            return AvgResponse("ok", EMPTY, {})
        if coord is None:
            return AvgResponse("error", EMPTY, {"error": "coordinator not started (no hello)"})
        if self.op == "submit":
            return AvgResponse(coord.submit(self.round, self.rank, self.tensor, self.meta, now), EMPTY, {})
        if self.op == "poll_mean":
            return AvgResponse(*coord.poll_mean(self.round, self.rank, now))
        if self.op == "beat":
            return AvgResponse(coord.beat(self.round, self.rank, now), EMPTY, {})
        if self.op == "release":
            return AvgResponse(coord.release(self.round, self.rank, self.tensor, self.meta, now), EMPTY, {})
        if self.op == "poll_start":
            return AvgResponse(coord.poll_start(self.round, now), EMPTY, {})
        if self.op == "poll_release":
            return AvgResponse(*coord.poll_release(self.round, self.rank, now))
        return AvgResponse("error", EMPTY, {"error": f"unknown op {self.op!r}"})


class AvgResponse(rpc.Response):
    def __init__(self, status: str, tensor: torch.Tensor, meta: dict):
        self.status, self.tensor, self.meta = status, tensor, meta

    def __getstate__(self):
        return self.status, self.tensor, self.meta

    def __setstate__(self, state):
        self.status, self.tensor, self.meta = state


SERVICES = [(AVG_SERVICE_ID, AvgRequest, AvgResponse)]


class CoordinatorError(RuntimeError):
    pass


class CoordinatorClient:
    """The trainer side: one request, one response, in this process's RPC order.

    Counts the bytes it moves (tensor payloads; the pickled remainder is a few hundred bytes) in
    the run's ByteCounter under `averaging`, unless the caller names another category (None: the
    caller has counted them itself).
    """

    def __init__(self, rank: int, counter, poll_s: float = 0.05):
        self.rank = rank
        self.counter = counter
        self.poll_s = poll_s

    def call(self, op: str, r: int, tensor: Optional[torch.Tensor] = None, meta: Optional[dict] = None,
             category: str = "averaging") -> AvgResponse:
        req = AvgRequest(op, r, self.rank, tensor, meta)
        rpc.send_request(COORDINATOR_SERVER, req)
        res = rpc.recv_response()
        if res.status == "error":
            raise CoordinatorError(f"averaging service on server {COORDINATOR_SERVER}: {res.meta.get('error')}")
        if self.counter is not None and category is not None:
            self.counter.add(category, req.tensor.numel() * req.tensor.element_size()
                             + res.tensor.numel() * res.tensor.element_size())
        return res

    def wait(self, op: str, r: int, until: tuple, beat=None, category: Optional[str] = "averaging") -> AvgResponse:
        """Poll `op` for round r until the status is one of `until`."""
        while True:
            res = self.call(op, r, category=category)
            if res.status in until:
                return res
            if beat is not None:
                beat()
            time.sleep(self.poll_s)
