"""The owners as one trainer sees them: the machines that own a batch's remote roots, behind one
interface (`Owners`), chosen once at setup (`make_owners`, `pipeline.engine`):

* `TrainerOwners` (engine=trainer, the default, below): each machine's trainer process is the
  owner of its partition (a compute.Owner in the process: histories, halo features, a model
  replica); one round per batch over torch.distributed;
* `ServerOwners` (engine=server, service.py): DGL's graph servers are the owners, asked over
  DGL RPC (one server of the owner machine per LAMP ask; several trainers a machine possible).

Every message is a compute.py dataclass, whatever the engine. Wire bytes are counted by the
owners into the run's ByteCounter (lamp_request, lamp_response, history_sync, grad_push);
loopback traffic to this machine's own servers into `local_bytes`.

The trainer engine's *round*, run by a background thread of every trainer on its own gloo group,
so the round overlaps the main thread's training (pipeline.prefetch):
1. every trainer sends each peer what it asks of it (torch.distributed.all_to_all): the roots of
   one batch it needs prepared, a halo-sync ask (when one is due) and gradient rows of earlier
   answers (grad=push);
2. every trainer answers every peer: all peers' roots merged into one computation graph (level-1
   fusion: the round brings every peer's ask at once), halo rows from its histories, pushed
   gradient rows backpropagated through the replica (the parameter gradients join this trainer's
   next all-reduce);
3. the answers go back (all_to_all), and the trainer that asked takes them (`answers`).
Every trainer runs one round per batch (DDP gives every trainer the same number of batches), so
the collectives match. The price is lockstep: the slowest trainer paces everyone's answers;
prefetch gives it slack. An owner-side error is answered (the asking trainer raises
LampServiceError), so the collectives stay matched and every process reaches a clean error exit.
"""
from __future__ import annotations

import copy
import pickle
import queue
import threading
import traceback
from collections import Counter, defaultdict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from degnn.pipelines.lamp.compute import (Grads, GradRows, HistoryPull, HistoryRows, Owner, Roots, Rows, Weights,
                                          flat, owned_local_ids, unflat)
from degnn.pipelines.lamp.graph import LocalGraph
from degnn.pipelines.lamp.history import History


@dataclass
class Ticket:
    """One batch's asks in flight, from `ask` to `answers`: (answerer, Roots) per owner machine,
    the transport's handle, and the history rows of this machine that the batch's middle
    blocks read (`ask_local`: the request, and its answer when it is read in-process)."""
    asks: List[Tuple[int, Roots]]
    pending: object
    pull: Optional[HistoryPull] = None
    pull_rows: Optional[Rows] = None


class Answers(NamedTuple):
    lamp: List[Rows]                 # one per ask, in order
    pull: Optional[Rows]             # the middle blocks' history rows
    halo: Optional[Dict[int, Rows]]  # halo-sync answers that came back with them, by answerer


class Owners:
    """What a trainer asks of the owners. Methods send without waiting unless they say so; what
    they leave in flight is collected by `answers`, `halo_answers`, `owner_grads` and `drain`."""

    def __init__(self, counter):
        self.counter = counter
        self.local_bytes: Dict[str, int] = {}  # loopback traffic by category (never on the wire)
        self.rounds = 0  # round trips to other machines

    def answerers(self, machine: int) -> List[int]:
        """Who answers for `machine` (its graph servers, or its trainer)."""
        raise NotImplementedError

    def pick(self, machine: int) -> int:
        """The answerer of a LAMP ask to `machine`, drawn at random."""
        ids = self.answerers(machine)
        return ids[torch.randint(len(ids), (1,)).item()]

    def init_history(self, rows: List[HistoryRows]) -> None:
        """This machine's histories at setup (waits)."""
        raise NotImplementedError

    def ship_weights(self, w: Weights, wait: bool) -> None:
        """The weights this machine's owners compute with from now on."""
        raise NotImplementedError

    def ask(self, asks: List[Tuple[int, Roots]]) -> Ticket:
        """Send a batch's roots, one ask per owner machine."""
        raise NotImplementedError

    def ask_local(self, ticket: Ticket, pull: HistoryPull) -> None:
        """Add this machine's history rows for the batch's middle blocks to `ticket`."""
        raise NotImplementedError

    def answers(self, ticket: Ticket) -> Answers:
        """Wait for a batch's answers."""
        raise NotImplementedError

    def push_history(self, rows: List[HistoryRows]) -> None:
        """Fresh rows of this machine's own nodes into its histories."""
        raise NotImplementedError

    def sync_halo(self, asks: List[Tuple[int, HistoryPull]]) -> None:
        """Ask owners for halo rows: (answerer, pull) each (answered by `halo_answers`, or with a
        later batch's `answers`)."""
        raise NotImplementedError

    def halo_answers(self) -> Optional[Dict[int, Rows]]:
        """The halo sync's answers when they come apart from the batches' (waits), else None."""
        return None

    def store_halo(self, rows: List[HistoryRows]) -> None:
        """Synced halo rows into this machine's histories."""
        raise NotImplementedError

    def push_grads(self, pushes: List[Tuple[int, GradRows]]) -> None:
        """grad=push: gradient rows of answers, to their answerers."""
        raise NotImplementedError

    def ask_owner_grads(self) -> None:
        """grad=push: ask for the parameter gradients this machine's owners computed from pushed rows."""

    def owner_grads(self) -> List[Grads]:
        """Those gradients (waits for what `ask_owner_grads` asked)."""
        raise NotImplementedError

    def drain(self) -> None:
        """Wait for every acknowledgement still in flight."""


def make_owners(engine: str, ctx, lg, feat, halo_x, boundary, model, meta: dict, leader: bool) -> Owners:
    """The owners of `pipeline.engine` (every trainer calls it: collective with engine=trainer)."""
    if engine == "trainer":
        parts = [None] * ctx.world_size
        me = ctx.graph.get_partition_book().partid
        dist.all_gather_object(parts, me)
        group = dist.new_group(backend="gloo")  # the rounds' own group: they run beside DDP's all-reduce
        return TrainerOwners(ctx.counter, lg, feat, halo_x, boundary, model, meta, ctx.graph.get_partition_book(),
                             {p: r for r, p in enumerate(parts)}, group)
    from degnn.pipelines.lamp.compute import Setup
    from degnn.pipelines.lamp.service import ServerOwners

    halo = torch.nonzero(~lg.inner).flatten()
    setup = Setup(meta, halo, halo_x[halo], torch.nonzero(boundary).flatten())
    return ServerOwners(ctx.counter, ctx.graph.get_partition_book().partid, setup if leader else None)


# --- engine=trainer ----------------------------------------------------------------------------
# the ByteCounter category of each section of a round, asked and answered (wire bytes)
REQUEST_CATEGORY = {"lamp": "lamp_request", "sync": "history_sync", "grad": "grad_push"}
ANSWER_CATEGORY = {"lamp": "lamp_response", "sync": "history_sync", "error": "lamp_response"}
# the message of each section, asked and answered
ASKED = {"lamp": Roots, "sync": HistoryPull}
ANSWERED = {"lamp": Rows, "sync": Rows}


class LampServiceError(RuntimeError):
    """An owner failed to answer (the owner keeps running)."""


def _pack(obj) -> bytes:
    """Pickle with tensors as numpy arrays (a compact, header-light form)."""
    def conv(x):
        if isinstance(x, torch.Tensor):
            return ("t", x.numpy())
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        return x
    return pickle.dumps(conv(obj), protocol=pickle.HIGHEST_PROTOCOL)


def _unpack(data: bytes):
    def conv(x):
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and x[0] == "t":
            return torch.from_numpy(np.array(x[1]))
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        return x
    return conv(pickle.loads(data))


def pack_section(name: str, value) -> bytes:
    """A round's section on the wire: a message's fields (grad: a list of GradRows; error: a string)."""
    if name == "grad":
        return _pack([flat(g) for g in value])
    return _pack(value if name == "error" else flat(value))


def unpack_section(name: str, data: bytes, messages: dict):
    got = _unpack(data)
    if name == "grad":
        return [unflat(GradRows, g) for g in got]
    return got if name == "error" else unflat(messages[name], got)


class LockedHistory(History):
    """The trainer's History, shared by its main thread (own pushes, middle-block reads) and the
    round thread (owners' write-backs and reads, halo-sync answers)."""

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
    """What one round brought back, by owner machine: LAMP answers and halo-sync rows, and the
    bytes each section moved (ask + answer; what crosses machines)."""
    lamp: Dict[int, Rows]
    sync: Dict[int, Rows]
    nbytes: Dict[int, Dict[str, int]]


class TrainerOwners(Owners):
    """engine=trainer: this trainer is its machine's owner, and asks the other trainers."""

    def __init__(self, counter, lg, feat, halo_x, boundary, model, meta: dict, pb, rank_of: Dict[int, int], group):
        super().__init__(counter)
        history = LockedHistory(lg.num_nodes, meta["hidden"], meta["layers"] - 2, meta["bits"])
        # its own LocalGraph over the same arrays: the builder's scratch is not for two threads
        self.owner = Owner(LocalGraph(lg.indptr, lg.indices, lg.inner, lg.nid), feat, halo_x, boundary,
                           copy.deepcopy(model), meta, history)
        self.pb, self.rank_of, self.group = pb, rank_of, group
        self._weights: Optional[Weights] = None  # waiting to be loaded into the replica
        self._asks: Dict[int, dict] = {}  # halo-sync and gradient asks for the next round, by owner
        self.lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        # a daemon thread: a trainer that fails in its main thread must not hang at exit on a
        # round blocked in a collective
        threading.Thread(target=self._serve, name="lamp-engine", daemon=True).start()

    def answerers(self, machine: int) -> List[int]:
        return [machine]

    # --- main thread --------------------------------------------------------------------------
    def init_history(self, rows: List[HistoryRows]) -> None:
        for r in rows:
            self.owner.store(r)

    def ship_weights(self, w: Weights, wait: bool) -> None:
        """An in-process copy, loaded at the start of the next round (the replica never changes
        under a computation)."""
        with self.lock:
            self._weights = Weights(w.version, list(w.names), [t.detach().clone() for t in w.tensors])

    def _add(self, owner: int, section: str, msg) -> None:
        with self.lock:
            ask = self._asks.setdefault(owner, {})
            if section == "grad":
                ask.setdefault("grad", []).append(msg)
            else:
                ask[section] = msg

    def ask(self, asks: List[Tuple[int, Roots]]) -> Ticket:
        with self.lock:
            job, self._asks = self._asks, {}
        for m, roots in asks:
            job.setdefault(m, {})["lamp"] = roots
        fut: Future = Future()
        self._jobs.put((job, fut))
        self.rounds += 1 if asks else 0
        return Ticket(asks, fut)

    def ask_local(self, ticket: Ticket, pull: HistoryPull) -> None:
        ticket.pull, ticket.pull_rows = pull, self.owner.rows(pull)  # the histories are in this process

    def answers(self, ticket: Ticket) -> Answers:
        got = ticket.pending.result()
        for nbytes in got.nbytes.values():
            for cat, n in nbytes.items():
                self.counter.add(cat, n)
        return Answers([got.lamp[m] for m, _ in ticket.asks], ticket.pull_rows, got.sync or None)

    def push_history(self, rows: List[HistoryRows]) -> None:
        for r in rows:
            self.owner.store(r)

    def sync_halo(self, asks: List[Tuple[int, HistoryPull]]) -> None:
        for m, pull in asks:  # on the next round; the answers come back with it
            self._add(m, "sync", pull)

    def store_halo(self, rows: List[HistoryRows]) -> None:
        self.push_history(rows)

    def push_grads(self, pushes: List[Tuple[int, GradRows]]) -> None:
        for m, g in pushes:  # on the next round (which counts its bytes)
            self._add(m, "grad", g)

    def owner_grads(self) -> List[Grads]:
        with self.lock:
            return [self.owner.take_grads()]

    # --- round thread -------------------------------------------------------------------------
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
                self.owner.load(self._weights)
                self._weights = None
        out = [b""] * len(self.rank_of)
        nbytes: Dict[int, Counter] = defaultdict(Counter)
        for m, ask in asks.items():
            sections = {k: pack_section(k, v) for k, v in ask.items()}
            out[self.rank_of[m]] = pickle.dumps(sections)
            for k, v in sections.items():
                nbytes[m][REQUEST_CATEGORY[k]] += len(v)
        incoming = [pickle.loads(b) if b else {} for b in self._exchange(out)]
        answers = self._answer([{k: unpack_section(k, v, ASKED) for k, v in s.items()} for s in incoming])
        back = self._exchange([pickle.dumps({k: pack_section(k, v) for k, v in a.items()}) if a else b""
                               for a in answers])
        part_of = {r: m for m, r in self.rank_of.items()}
        lamp, sync = {}, {}
        for r, b in enumerate(back):
            if not b:
                continue
            m = part_of[r]
            sections = pickle.loads(b)
            for k, v in sections.items():
                nbytes[m][ANSWER_CATEGORY[k]] += len(v)
            got = {k: unpack_section(k, v, ANSWERED) for k, v in sections.items()}
            if "error" in got:
                raise LampServiceError(f"the trainer of machine {m} failed to answer a LAMP round: {got['error']}")
            if "lamp" in got:
                lamp[m] = got["lamp"]
            if "sync" in got:
                sync[m] = got["sync"]
        return RoundResult(lamp, sync, {m: dict(c) for m, c in nbytes.items()})

    def _answer(self, incoming: List[dict]) -> List[dict]:
        """This trainer's answers to every peer's asks (by rank); an error is answered, not raised."""
        answers: List[dict] = [{} for _ in incoming]
        try:
            peers = [(r, owned_local_ids(self.pb, ask["lamp"].roots, "LAMP roots"))
                     for r, ask in enumerate(incoming) if "lamp" in ask]
            if peers:
                for (r, _), rows in zip(peers, self.owner.answer([ids for _, ids in peers])):
                    answers[r]["lamp"] = rows
            for r, ask in enumerate(incoming):
                if "sync" in ask:
                    answers[r]["sync"] = self.owner.rows(ask["sync"], self.pb)
                for g in ask.get("grad", []):
                    grads = self.owner.backprop(g, self.pb)
                    with self.lock:
                        self.owner.keep_grads(grads, len(g.roots))
        except Exception as e:  # noqa: BLE001 - every asking peer is told; the collectives stay matched
            msg = f"{type(e).__name__}: {e}"
            print("degnn lamp engine error:\n" + traceback.format_exc(), flush=True)
            return [{"error": msg} if ask else {} for ask in incoming]
        return answers
