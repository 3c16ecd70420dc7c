"""pipeline.engine=trainer: the owners' preparation runs in the trainer processes, not in DGL's
graph servers. Each machine's one trainer answers for its partition, over torch.distributed.

What moves into the trainer: the owner state of service.py, a model replica, the quantized
histories (history.py) and the halo features. Two consequences:
* weights reach the replica by an in-process copy, not a loopback RPC;
* history pushes and the middle blocks' reads are local tensor writes and reads.

One *round* per batch, run by a background thread of every trainer on its own gloo group, so the
round overlaps the main thread's training (pipeline.prefetch):
1. every trainer sends each peer what it asks of it (torch.distributed.all_to_all): the roots of
   one batch it needs prepared, halo history rows (a halo sync, when one is due), and gradient
   rows of earlier answers (grad=push);
2. every trainer answers every peer. All peers' roots are merged into one computation graph
   (level-1 fusion: the round brings every peer's request at once). The rows come from its
   History. Pushed gradient rows are backpropagated through the replica; the parameter
   gradients join this trainer's next all-reduce;
3. the answers go back (all_to_all), and the trainer that asked takes them at `_complete`.

Every trainer runs the same number of rounds, one per batch (DDP already gives every trainer the
same number of batches), so the collectives match. The price is lockstep: a round needs every peer's request
for the same batch, so the slowest trainer paces everyone's answers; prefetch gives it slack.
An owner-side error is answered (the asking trainer raises LampServiceError) rather than raised, so
the collectives stay matched and every process reaches a clean error exit.
"""
from __future__ import annotations

import copy
import pickle
import queue
import threading
import traceback
from collections import Counter, defaultdict
from concurrent.futures import Future
from typing import Dict, List, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from degnn.pipelines.lamp.graph import LocalGraph
from degnn.pipelines.lamp.history import History
from degnn.pipelines.lamp.quantize import QRows, dequantize
from degnn.pipelines.lamp.service import (HistoryPullRequest, LampServiceError, RowsResponse, add_grads,
                                          answer_merged, lower_layer_grads, owned_local_ids)

# the ByteCounter category of each section of a round, asked and answered (wire bytes)
REQUEST_CATEGORY = {"lamp": "lamp_request", "sync": "history_sync", "grad": "grad_push"}
ANSWER_CATEGORY = {"lamp": "lamp_response", "sync": "history_sync", "error": "lamp_response"}


def _pack(obj) -> bytes:
    """Pickle with tensors as numpy arrays (a compact, header-light form)."""
    def conv(x):
        if isinstance(x, torch.Tensor):
            return ("t", x.numpy())
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        return x
    return pickle.dumps(conv(obj), protocol=pickle.HIGHEST_PROTOCOL)


def _unpack(data: bytes):
    def conv(x):
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and x[0] == "t":
            return torch.from_numpy(np.array(x[1]))
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        return x
    return conv(pickle.loads(data))


class LockedHistory(History):
    """The trainer's History, shared by its main thread (own pushes, middle-block reads) and the
    engine thread (owners' write-backs and reads, halo-sync answers)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.lock = threading.Lock()

    def push_codes(self, layer, ids, q, stamp):
        with self.lock:
            super().push_codes(layer, ids, q, stamp)

    def pull_codes(self, layer, ids):
        with self.lock:
            return super().pull_codes(layer, ids)


class RoundResult(NamedTuple):
    """What one round brought back, by owner machine: LAMP answers and halo-sync rows
    (RowsResponse), and the bytes each section moved (request + answer; what crosses machines)."""
    lamp: Dict[int, RowsResponse]
    sync: Dict[int, RowsResponse]
    nbytes: Dict[int, Dict[str, int]]


class TrainerEngine:
    def __init__(self, lg, feat, halo_x, boundary, model, meta: dict, pb, rank_of: Dict[int, int], group):
        # its own LocalGraph over the same arrays: the builder's scratch is not for two threads
        self.lg = LocalGraph(lg.indptr, lg.indices, lg.inner, lg.nid)
        self.feat, self.halo_x, self.boundary, self.meta = feat, halo_x, boundary, meta
        self.pb, self.rank_of, self.group = pb, rank_of, group
        self.world = len(rank_of)
        self.replica = copy.deepcopy(model).eval()
        self.version = -1
        self.history = LockedHistory(lg.num_nodes, meta["hidden"], meta["layers"] - 2, meta["bits"])
        self.gen = torch.Generator().manual_seed(int(meta["seed"]))
        self._weights = None  # (version, state) waiting to be loaded into the replica
        self._asks: Dict[int, dict] = {}  # sync and gradient asks for the next round, by owner
        self.lock = threading.Lock()
        self.owner_grads: Dict[str, torch.Tensor] = {}  # grad=push, from peers' pushed rows
        self.owner_grad_rows = 0
        self._jobs: queue.Queue = queue.Queue()
        # a daemon thread: a trainer that fails in its main thread must not hang at exit on a
        # round blocked in a collective
        threading.Thread(target=self._serve, name="lamp-engine", daemon=True).start()

    # --- main thread --------------------------------------------------------------------------
    def set_weights(self, version: int, state: Dict[str, torch.Tensor]) -> None:
        """The trainer's current weights for the replica (loaded at the start of the next round:
        the replica never changes under a computation)."""
        with self.lock:
            self._weights = (version, {k: v.detach().clone() for k, v in state.items()})

    def ask(self, owner: int, section: str, payload) -> None:
        """Add a halo-sync ask (`sync`) or gradient rows (`grad`) for `owner` to the next round."""
        with self.lock:
            self._asks.setdefault(owner, {}).setdefault(section, []).append(payload)

    def submit(self, roots_by_owner: Dict[int, torch.Tensor]) -> Future:
        """Start a round asking each owner for its roots; the Future gives a RoundResult."""
        with self.lock:
            asks, self._asks = self._asks, {}
        for m, roots in roots_by_owner.items():
            asks.setdefault(m, {})["lamp"] = roots
        fut: Future = Future()
        self._jobs.put((asks, fut))
        return fut

    def take_owner_grads(self):
        with self.lock:
            grads, rows = self.owner_grads, self.owner_grad_rows
            self.owner_grads, self.owner_grad_rows = {}, 0
        return grads, rows

    # --- engine thread ------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            asks, fut = self._jobs.get()
            try:
                fut.set_result(self._round(asks))
            except BaseException as e:  # noqa: BLE001 - handed to the main thread's result()
                fut.set_exception(e)

    def _exchange(self, out: List[bytes]) -> List[bytes]:
        """all_to_all of byte strings of any length: the sizes first, then one all_to_all_single
        with those splits (gloo's list all_to_all needs equal sizes)."""
        sizes = torch.tensor([len(b) for b in out], dtype=torch.int64)
        got = torch.zeros(len(out), dtype=torch.int64)
        dist.all_to_all_single(got, sizes, group=self.group)
        data = b"".join(out)
        send = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
        recv = torch.empty(int(got.sum()), dtype=torch.uint8)
        dist.all_to_all_single(recv, send, got.tolist(), sizes.tolist(), group=self.group)
        raw = recv.numpy().tobytes()
        ends = got.cumsum(0).tolist()
        return [raw[e - int(n):e] for e, n in zip(ends, got.tolist())]

    def _round(self, asks: Dict[int, dict]) -> RoundResult:
        with self.lock:
            if self._weights is not None:
                self.version, state = self._weights
                self._weights = None
                self.replica.load_state_dict(state, strict=False)
        out = [b""] * self.world
        sent: Dict[int, Dict[str, int]] = {}
        for m, ask in asks.items():
            sections = {k: _pack(v) for k, v in ask.items()}
            out[self.rank_of[m]] = pickle.dumps(sections)
            sent[m] = {k: len(v) for k, v in sections.items()}
        incoming = [pickle.loads(b) if b else {} for b in self._exchange(out)]
        answers = self._answer([{k: _unpack(v) for k, v in s.items()} for s in incoming])
        back = self._exchange([pickle.dumps({k: _pack(v) for k, v in a.items()}) if a else b"" for a in answers])
        part_of = {r: m for m, r in self.rank_of.items()}
        lamp, sync = {}, {}
        nbytes: Dict[int, Counter] = defaultdict(Counter)
        for m, s in sent.items():
            for k, n in s.items():
                nbytes[m][REQUEST_CATEGORY[k]] += n
        for r, b in enumerate(back):
            if not b:
                continue
            m = part_of[r]
            sections = pickle.loads(b)
            for k, v in sections.items():
                nbytes[m][ANSWER_CATEGORY[k]] += len(v)
            got = {k: _unpack(v) for k, v in sections.items()}
            if "error" in got:
                raise LampServiceError(f"the trainer of machine {m} failed to answer a LAMP round: {got['error']}")
            if "lamp" in got:
                lamp[m] = RowsResponse(*got["lamp"])
            if "sync" in got:
                sync[m] = RowsResponse(*got["sync"])
        return RoundResult(lamp, sync, {m: dict(c) for m, c in nbytes.items()})

    def _answer(self, incoming: List[dict]) -> List[dict]:
        """This trainer's answers to every peer's asks (by rank); an error is answered, not raised."""
        answers: List[dict] = [{} for _ in incoming]
        try:
            self._answer_lamp(incoming, answers)
            for r, ask in enumerate(incoming):
                for state in ask.get("sync", []):  # a HistoryPullRequest's fields
                    res = HistoryPullRequest(*state).rows(self.history, self.pb)
                    answers[r]["sync"] = (res.codes, res.scale, res.offset, res.stamp, res.sel)
                for roots, codes, scale, offset in ask.get("grad", []):
                    self._backprop(roots, QRows(codes, scale, offset))
        except Exception as e:  # noqa: BLE001 - every asking peer is told; the collectives stay matched
            msg = f"{type(e).__name__}: {e}"
            print("degnn lamp engine error:\n" + traceback.format_exc(), flush=True)
            return [{"error": msg} if ask else {} for ask in incoming]
        return answers

    @torch.no_grad()
    def _answer_lamp(self, incoming: List[dict], answers: List[dict]) -> None:
        peers = [(r, owned_local_ids(self.pb, ask["lamp"], "LAMP roots")) for r, ask in enumerate(incoming)
                 if "lamp" in ask]
        if not peers:
            return
        if self.version < 0:
            raise RuntimeError("LAMP round before any weights reached the engine")
        # fusion: every peer's roots in one computation graph; without: each request on its own,
        # unfolded (graph.unfold), as a server without fusion computes them
        jobs = [peers] if self.meta["fusion"] else [[p] for p in peers]
        for job in jobs:
            res = answer_merged(self.lg, self.replica, self.feat, self.halo_x, self.history, self.boundary,
                                [ids for _, ids in job], self.meta, self.version, self.gen)
            for (r, _), a in zip(job, res):
                answers[r]["lamp"] = (a.codes, a.scale, a.offset, None, None, a.ages, a.version, a.counts)

    def _backprop(self, roots: torch.Tensor, q: QRows) -> None:
        """grad=push: the gradient rows of answered roots, backpropagated through the replica's
        lower layers on a fresh computation graph (as GradPushRequest does in a server)."""
        grad = dequantize(q, self.meta["bits"], self.meta["hidden"])
        grads = lower_layer_grads(self.lg, self.replica, self.feat, self.halo_x, self.history,
                                  owned_local_ids(self.pb, roots, "pushed gradient rows' roots"), grad, self.meta,
                                  self.version)
        with self.lock:
            add_grads(self.owner_grads, grads.items())
            self.owner_grad_rows += len(roots)
