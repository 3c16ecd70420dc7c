"""The averaging coordinator: the state of a TMA run kept on graph server 0 (service.py carries
its messages), which replaces every collective of a TMA run, so that the run outlives a dead
trainer.

Why not gloo: an all-reduce, barrier or all_gather blocks forever (or aborts) when one peer is dead
(docs/design.md, pitfalls). Here every exchange is a request to server 0 with a deadline kept by the
server, and a trainer that misses a deadline is simply left out:

round r (r = 0 is the start: the lowest rank's initial weights go to everyone, so every replica
starts identical, and the training clocks start together):
  1. each trainer `Submit`s its flattened parameters (and its weight, and its stats) for round r;
  2. it `PollMean`s until the round is closed: when every trainer still counted alive has
     submitted, or `round_timeout_s` after the first submission; whoever has not submitted by then
     is counted dead (it re-joins if it submits a later round). The answer is the weighted mean
     of the submissions, who contributed, and who leads the evaluation (the lowest contributing
     rank);
  3. the evaluation of the mean (every `train.eval_every`-th round and the last; in the
     others the lead only records and releases the round, step 4), split over the live
     trainers (docs/design.md, "TMA's evaluation"): every trainer `EvalPoll`s and is given one
     unit of work at a time (a layer's output for a range of nodes, or the scores of a share of
     the validation and test set), its own partition's units first, then those of partitions
     whose trainer is not alive; a phase (a layer, then the scoring) is handed out once the
     previous one is done. A worker `Beat`s while it computes a unit and reports it with
     `EvalDone` (the scoring: its metric sums).
     LLCG: the evaluation opens once the lead has corrected the mean (`EvalOpen` with the
     corrected weights, which go to every trainer with its first unit or the release);
  4. when every unit of the scoring is done, the lead is answered `scored` (the metric over
     every unit), records the round and `Release`s it; the others `EvalPoll` until then.
     Nothing waits on a dead peer: a trainer the evaluation waits for (the lead, a worker holding
     a unit, the trainer of a partition whose units are not taken) that sends nothing for
     `evaluator_timeout_s` is counted dead, its units go back to be handed to a live one, and the
     next contributing rank leads if it led;
  5. everyone `PollStart`s until every live contributor has the released weights (round 0:
     the initial weights), or `round_timeout_s` has passed, and the next round's training starts.

A round in which every contributor that trained reports a non-finite loss has diverged: the
mean is not finite either, so nothing can come of going on. Its answer (`PollMean`) carries
`diverged` (the error line) and every trainer ends the run (rounds.py, `end_diverged`): the
round's evaluator records it through its RunRecord (a `diverged` line in curve.jsonl,
summary.json with status failed), and every trainer exits non-zero, as the epoch-loop pipelines do on a non-finite loss.

The server loop is single-threaded and has no timers, so deadlines are checked whenever a request
arrives (trainers poll every few tens of milliseconds while they wait). Every request is answered,
errors included: an exception inside a DGL server would kill the server (docs/background.md).

Imported by every server through service.py; it imports torch only. The requests' names are
service.py's message classes (`Submit`, `PollMean`, ...).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

import torch

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
        self.first_evaluator: Optional[int] = None
        # the evaluation: open once the model to evaluate is known (LLCG: corrected by the lead)
        self.open_t: Optional[float] = None
        self.eval_model: Optional[torch.Tensor] = None  # LLCG's corrected weights
        self.model_to: set = set()  # ranks that have the evaluated model
        self.corr_s = 0.0
        self.phase = 0
        self.pending: set = set()  # units of the current phase nobody holds
        self.held: Dict[int, int] = {}  # unit -> the rank computing it
        self.done: Dict[int, int] = {}  # unit -> the rank that computed it (current phase)
        self.sums: Dict[str, List[float]] = {}  # the scoring's metric sums: key -> [sum, count]
        self.handed_on = 0  # units computed by another trainer than their partition's
        self.workers: set = set()
        self.scored_t: Optional[float] = None
        self.evaluated = True  # False: a round train.eval_every skips (averaged, not evaluated)


class Coordinator:
    """Server-side state of one run (one per server process; servers live for one run)."""

    def __init__(self, active: List[int], round_timeout_s: float, start_timeout_s: float,
                 evaluator_timeout_s: float, homes: Optional[List[int]] = None, phases: int = 1,
                 corrects: bool = False, eval_every: int = 1, rounds_total: Optional[int] = None):
        # the evaluation's plan: homes[u] is the rank whose partition unit u covers (every phase
        # has the same units), `phases` the layers plus the scoring; LLCG opens it after correcting
        self.homes = list(homes) if homes is not None else list(active)
        self.phases = phases
        self.corrects = corrects
        # rounds evaluated: every `eval_every`-th and the last (train.eval_every)
        self.eval_every = max(1, int(eval_every))
        self.rounds_total = rounds_total
        self.seen: Dict[int, float] = {}  # rank -> when it last sent anything
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

    def evaluates(self, r: int) -> bool:
        return r % self.eval_every == 0 or (self.rounds_total is not None and r >= self.rounds_total)

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
        rd.evaluator = rd.first_evaluator = min(rd.contributors)
        rd.last_beat = rd.close_t = now
        if r > 0:
            rd.evaluated = self.evaluates(r)
            rd.diverged = diverged_round(r, rd.contributors)
            if rd.diverged:
                self.log.append(rd.diverged)
            elif not self.corrects:
                self._open(rd, None, now)

    # --- the evaluation ------------------------------------------------------------------------
    def _open(self, rd: _Round, model: Optional[torch.Tensor], now: float) -> None:
        rd.open_t = now
        rd.eval_model = model
        rd.phase = 0
        if rd.evaluated:
            rd.pending = set(range(len(self.homes)))
        else:  # nothing to compute: the lead records the round (no metric) and releases it
            rd.scored_t = now

    def _count_dead(self, r: int, rd: _Round, rank: int, silent_s: float, now: float) -> None:
        self.alive.discard(rank)
        self.dead.add(rank)
        units = sorted(u for u, h in rd.held.items() if h == rank)
        for u in units:
            del rd.held[u]
            rd.pending.add(u)
        if rank == rd.evaluator:
            self.log.append(f"round {r}: evaluator rank {rank} silent for {silent_s:.0f}s; counted dead")
            candidates = sorted(c for c in rd.contributors if c not in self.dead)
            if candidates:
                rd.evaluator = candidates[0]
                rd.last_beat = now
        else:
            self.log.append(f"round {r}: rank {rank} silent for {silent_s:.0f}s while evaluating; counted dead")
        if units:
            self.log.append(f"round {r}: units {units} of phase {rd.phase} that rank {rank} held go to live trainers")

    def _expire(self, r: int, rd: _Round, now: float) -> None:
        """Count dead whoever the evaluation waits for and has not been heard of for
        `evaluator_timeout_s`: the lead, a worker holding a unit, the trainer of a pending unit."""
        if r == 0 or not rd.closed or rd.released or rd.diverged:
            return
        timeout = self.evaluator_timeout_s
        if rd.evaluator not in self.dead and now - rd.last_beat > timeout:
            self._count_dead(r, rd, rd.evaluator, now - rd.last_beat, now)
        if rd.open_t is None or rd.scored_t is not None:
            return
        waiting = set(rd.held.values()) | {self.homes[u] for u in rd.pending if self.homes[u] in self.alive}
        for rank in sorted(waiting - self.dead - {rd.evaluator}):
            last = max(self.seen.get(rank, 0.0), rd.open_t)
            if now - last > timeout:
                self._count_dead(r, rd, rank, now - last, now)

    def _with_model(self, rd: _Round, rank: int) -> torch.Tensor:
        """The evaluated model's weights for a rank that does not have them yet (LLCG), else nothing."""
        if rd.eval_model is None or rank in rd.model_to:
            return EMPTY
        rd.model_to.add(rank)
        return rd.eval_model

    def eval_open(self, r: int, rank: int, tensor: torch.Tensor, meta: dict, now: float) -> str:
        rd = self._round(r)
        self._heard(rd, rank, now)
        if rd.evaluator != rank:
            return "not-evaluator"
        if rd.open_t is None:
            rd.corr_s = float(meta.get("corr_s", 0.0))
            self._open(rd, tensor.clone() if tensor.numel() else None, now)
            rd.model_to.add(rank)
        return "ok"

    def eval_poll(self, r: int, rank: int, now: float):
        """What `rank` does next for round r's evaluation: `work` (meta: phase, unit), `lead`
        (open it: LLCG's correction of the mean, sent along), `scored` (the lead: record and
        release), `released`, or `wait`."""
        rd = self._round(r)
        self._close_if_due(r, now)
        self._heard(rd, rank, now)
        if rd.released:
            return self.poll_release(r, rank, now)
        self._expire(r, rd, now)
        if not rd.closed:
            return "wait", EMPTY, {}
        if rank == rd.evaluator and rank not in self.dead:
            if rd.open_t is None:
                return "lead", rd.mean.to(torch.float32), self._round_meta(rd)
            if rd.scored_t is not None:
                return "scored", self._with_model(rd, rank), {**self._round_meta(rd), **self._eval_meta(rd)}
        if rd.open_t is None or rd.scored_t is not None or rank in self.dead:
            return "wait", EMPTY, {}
        mine = sorted(u for u in rd.pending if self.homes[u] == rank)
        orphans = sorted(u for u in rd.pending if self.homes[u] not in self.alive)
        if not mine and not orphans:
            return "wait", EMPTY, {}
        unit = (mine or orphans)[0]
        rd.pending.discard(unit)
        rd.held[unit] = rank
        return "work", self._with_model(rd, rank), {"phase": rd.phase, "unit": unit}

    def eval_done(self, r: int, rank: int, meta: dict, now: float) -> str:
        rd = self._round(r)
        self._heard(rd, rank, now)
        if "stats" in meta:
            self.last_stats[rank] = meta["stats"]
        unit = meta["unit"]
        if rd.open_t is None or meta["phase"] != rd.phase or unit in rd.done or rd.scored_t is not None:
            return "late"
        rd.done[unit] = rank
        rd.pending.discard(unit)
        rd.held.pop(unit, None)
        rd.workers.add(rank)
        if self.homes[unit] != rank:
            rd.handed_on += 1
        for key, (total, count) in meta.get("partial", {}).items():
            acc = rd.sums.setdefault(key, [0.0, 0])
            acc[0] += float(total)
            acc[1] += int(count)
        if len(rd.done) == len(self.homes):  # the phase is complete: the next one, or the scores
            rd.phase += 1
            rd.done, rd.held = {}, {}
            if rd.phase == self.phases:
                rd.scored_t = now
            else:
                rd.pending = set(range(len(self.homes)))
        return "ok"

    def _eval_meta(self, rd: _Round) -> dict:
        return {"evaluated": rd.evaluated, "sums": {k: list(v) for k, v in rd.sums.items()},
                "corr_s": rd.corr_s,
                "eval_s": (rd.scored_t or 0.0) - (rd.open_t or 0.0), "handed_on": rd.handed_on,
                "workers": sorted(rd.workers)}

    def _heard(self, rd: _Round, rank: int, now: float) -> None:
        self.seen[rank] = now
        if rank == rd.evaluator:
            rd.last_beat = now

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
                "first_evaluator": rd.first_evaluator,
                "stats": dict(rd.contributors), "all_stats": dict(self.last_stats),
                "dead": sorted(self.dead), "log": list(self.log)}
        if rd.diverged:
            meta["diverged"] = rd.diverged
        return meta

    def beat(self, r: int, rank: int, now: float, unit: Optional[int] = None) -> str:
        """A sign of life of the lead (`unit` None) or of the worker computing `unit`; anything
        but "ok" means the work went to another trainer and must stop."""
        rd = self._round(r)
        self._heard(rd, rank, now)
        self._expire(r, rd, now)
        if unit is not None:
            return "ok" if rd.held.get(unit) == rank else "not-holder"
        if rd.evaluator == rank:
            return "ok"
        return "not-evaluator"  # it was declared dead and replaced: it must stop evaluating

    def release(self, r: int, rank: int, tensor: torch.Tensor, meta: dict, now: float) -> str:
        rd = self._round(r)
        if rd.evaluator != rank:
            return "not-evaluator"
        rd.released = True
        rd.release_tensor = tensor if tensor.numel() else rd.eval_model
        rd.release_meta = meta
        rd.release_t = now
        rd.picked.add(rank)
        return "ok"

    def poll_start(self, r: int, now: float) -> str:
        """'go' once every live contributor has the released weights (or `round_timeout_s` after the
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
        """`released` (with the evaluated model's weights where this rank lacks them) or `wait`:
        a trainer that takes no part in the evaluation (a dropped partition's) waits with it."""
        rd = self._round(r)
        self._close_if_due(r, now)
        if not rd.released:
            return "wait", EMPTY, {}
        rd.picked.add(rank)
        t = rd.release_tensor if rd.release_tensor is not None and rank not in rd.model_to else EMPTY
        rd.model_to.add(rank)
        return "released", t, dict(rd.release_meta)


def diverged_round(r: int, contributors: Dict[int, dict]) -> Optional[str]:
    """The error line of round r when every contributor that trained in it (round_steps > 0)
    reports a non-finite loss, else None."""
    trained = {rank: s.get("loss") for rank, s in contributors.items() if s.get("round_steps")}
    if not trained or any(isinstance(v, (int, float)) and math.isfinite(v) for v in trained.values()):
        return None
    return (f"diverged at round {r}: the training loss of every live trainer (ranks "
            f"{', '.join(map(str, sorted(trained)))}) is not finite; lower train.lr or check the data")
