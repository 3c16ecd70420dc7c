"""The owners as one trainer sees them: the machines that own a batch's remote roots, behind one
interface (`Owners`), chosen once at setup (`make_owners`, `pipeline.engine`):

* `TrainerOwners` (engine=trainer, the default, below): each machine's first trainer (local
  rank 0) is the owner of its partition (a compute.Owner in the process: histories, halo
  features, a model replica) and answers for the machine; one round per batch over
  torch.distributed;
* `ServerOwners` (engine=server, service.py): DGL's graph servers are the owners, asked over
  DGL RPC (one server of the owner machine per LAMP ask; several trainers a machine possible).
The interface and what it hands back (Ticket, Answers, LampServiceError) are in engine.py, which
both engines' files import; only `make_owners` here imports service.py (no file imports back).

Every message is a compute.py dataclass, whatever the engine. Wire bytes are counted by the
owners into the run's ByteCounter (lamp_request, lamp_response, history_sync, grad_push);
loopback traffic to this machine's own servers into `local_bytes`.

The trainer engine's *round*, run by a background thread of every trainer on its own gloo group,
so the round overlaps the main thread's training (pipeline.prefetch):
1. every trainer sends each owner what it asks of it (torch.distributed.all_to_all): the roots of
   one batch it needs prepared, a halo-sync ask (when one is due) and gradient rows of earlier
   answers (grad=push); a trainer that is not its machine's owner (local rank > 0, with
   `cluster.trainers_per_machine` > 1) also sends its own owner its history pushes and the
   history rows its batch's middle blocks read (loopback: the two processes share a machine);
2. every owner answers: all trainers' roots merged into one computation graph (level-1 fusion:
   the round brings every trainer's ask at once), halo rows and its machine's trainers' history
   rows from its histories, pushed gradient rows backpropagated through the replica (the
   parameter gradients join this trainer's next all-reduce);
3. the answers go back (all_to_all), and the trainer that asked takes them (`answers`).
One owner a machine, whatever the number of its trainers: the trainers of a machine share its
partition (DGL's), so they share its histories (one table per layer, written by all of them) and
one replica (DDP keeps their weights equal: the owner's own trainer ships them).
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
from collections import Counter
from concurrent.futures import Future
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from degnn.pipelines.lamp.compute import (Grads, GradRows, HistoryPull, HistoryRows, Owner, Roots, Rows, Weights,
                                          flat, history_dir, owned_local_ids, row_codec, unflat)
from degnn.pipelines.lamp.engine import Answers, LampServiceError, Owners, Ticket
from degnn.pipelines.lamp.graph import LocalGraph
from degnn.pipelines.lamp.history import History


def make_owners(engine: str, ctx, lg, feat, halo_x, boundary, model, meta: dict, leader: bool,
                halo_path: str = "") -> Owners:
    """The owners of `pipeline.engine` (every trainer calls it: collective with engine=trainer).
    halo_path: where halo_x is shared with this machine's graph servers (compute.halo_table)."""
    if engine == "trainer":
        pb = ctx.graph.get_partition_book()
        ranks = [None] * ctx.world_size
        dist.all_gather_object(ranks, (pb.partid, ctx.local_rank))
        group = dist.new_group(backend="gloo")  # the rounds' own group: they run beside DDP's all-reduce
        return TrainerOwners(ctx.counter, lg, feat, halo_x, boundary, model, meta, pb, [m for m, _ in ranks],
                             {m: r for r, (m, local) in enumerate(ranks) if local == 0}, dist.get_rank(), group)
    from degnn.pipelines.lamp.compute import Setup
    from degnn.pipelines.lamp.service import ServerOwners

    setup = Setup(meta, halo_x.ids, torch.empty(0) if halo_path else halo_x.table, torch.nonzero(boundary).flatten(),
                  halo_path)
    return ServerOwners(ctx.counter, ctx.graph.get_partition_book().partid, setup if leader else None)


# --- engine=trainer ----------------------------------------------------------------------------
# the ByteCounter category of each section of a round, asked and answered (wire bytes)
# (push and pull: a trainer to its own machine's owner, loopback bytes)
REQUEST_CATEGORY = {"lamp": "lamp_request", "sync": "history_sync", "grad": "grad_push",
                    "push": "history_push", "pull": "history_pull"}
ANSWER_CATEGORY = {"lamp": "lamp_response", "sync": "history_sync", "pull": "history_pull", "error": "lamp_response"}
# the message of each section, asked and answered (grad and push: lists of them)
ASKED = {"lamp": Roots, "sync": HistoryPull, "pull": HistoryPull}
ANSWERED = {"lamp": Rows, "sync": Rows, "pull": Rows}
LISTS = {"grad": GradRows, "push": HistoryRows}


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
    """A round's section on the wire: a message's fields (grad, push: a list of messages; error: a
    string)."""
    if name in LISTS:
        return _pack([flat(g) for g in value])
    return _pack(value if name == "error" else flat(value))


def unpack_section(name: str, data: bytes, messages: dict):
    got = _unpack(data)
    if name in LISTS:
        return [unflat(LISTS[name], g) for g in got]
    return got if name == "error" else unflat(messages[name], got)


class LockedHistory(History):
    """The trainer's History, shared by its main thread (own pushes, middle-block reads) and the
    round thread (owners' write-backs and reads, halo-sync answers)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.lock = threading.Lock()

    def push_packed(self, layer, ids, rows, stamp):
        with self.lock:
            super().push_packed(layer, ids, rows, stamp)

    def pull_packed(self, layer, ids):
        with self.lock:
            return super().pull_packed(layer, ids)


class RoundResult(NamedTuple):
    """What one round brought back, by answering rank: LAMP answers and halo-sync rows, the
    middle blocks' history rows (from this machine's owner), and the bytes each section moved by
    category (ask + answer), on the wire and on loopback."""
    lamp: Dict[int, Rows]
    sync: Dict[int, Rows]
    pull: Optional[Rows]
    wire: Dict[str, int]
    local: Dict[str, int]


class TrainerOwners(Owners):
    """engine=trainer: every trainer asks the owners (each machine's first trainer) in rounds; this
    trainer is one of them when it is its machine's first (`owner` is not None)."""

    def __init__(self, counter, lg, feat, halo_x, boundary, model, meta: dict, pb, machine_of: List[int],
                 owner_rank: Dict[int, int], rank: int, group):
        super().__init__(counter)
        self.pb, self.machine_of, self.owner_rank, self.rank, self.group = pb, machine_of, owner_rank, rank, group
        self.home = owner_rank[pb.partid]  # this machine's owner
        self.owner: Optional[Owner] = None
        if self.home == rank:
            history = LockedHistory(lg.num_nodes, meta["history_layers"], row_codec(meta), history_dir(meta))
            # its own LocalGraph over the same arrays: the builder's scratch is not for two threads
            self.owner = Owner(LocalGraph(lg.indptr, lg.indices, lg.inner, lg.nid), feat, halo_x, boundary,
                               copy.deepcopy(model), meta, history)
        # a batch's middle blocks read this machine's histories: in this process, or asked of the
        # owner in the batch's round (`ask_local` hands the ask to the round thread)
        self.pull_in_round = self.owner is None and meta["history_layers"] > 0
        self._weights: Optional[Weights] = None  # waiting to be loaded into the replica
        self._asks: Dict[int, dict] = {}  # halo-sync, gradient and history asks for the next round, by rank
        self.lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        # a daemon thread: a trainer that fails in its main thread must not hang at exit on a
        # round blocked in a collective
        threading.Thread(target=self._serve, name="lamp-engine", daemon=True).start()

    def answerers(self, machine: int) -> List[int]:
        return [self.owner_rank[machine]]

    # --- main thread --------------------------------------------------------------------------
    def init_history(self, rows: List[HistoryRows]) -> None:
        for r in rows:
            self.owner.store(r)

    def release(self) -> None:
        if self.owner is not None:
            with self.lock:
                self.owner.release()

    def ship_weights(self, w: Weights, wait: bool) -> None:
        """An in-process copy, loaded at the start of the next round (the replica never changes
        under a computation); only the owner's own trainer ships them."""
        if self.owner is None:
            return
        with self.lock:
            self._weights = Weights(w.version, list(w.names), [t.detach().clone() for t in w.tensors])

    def _add(self, rank: int, section: str, msg) -> None:
        with self.lock:
            ask = self._asks.setdefault(rank, {})
            if section in LISTS:
                ask.setdefault(section, []).append(msg)
            else:
                ask[section] = msg

    def ask(self, asks: List[Tuple[int, Roots]]) -> Ticket:
        with self.lock:
            job, self._asks = self._asks, {}
        for r, roots in asks:
            job.setdefault(r, {})["lamp"] = roots
        fut: Future = Future()
        pull: Optional[Future] = Future() if self.pull_in_round else None
        self._jobs.put((job, fut, pull))
        self.rounds += 1 if asks else 0
        return Ticket(asks, (fut, pull))

    def ask_local(self, ticket: Ticket, pull: HistoryPull) -> None:
        ticket.pull = pull
        if self.owner is not None:  # the histories are in this process
            ticket.pull_rows = self.owner.rows(pull)
        else:  # to this machine's owner, in the batch's round (waiting for it)
            ticket.pending[1].set_result(pull)

    def answers(self, ticket: Ticket) -> Answers:
        got = ticket.pending[0].result()
        for cat, n in got.wire.items():
            self.counter.add(cat, n)
        for cat, n in got.local.items():
            self.local_bytes[cat] = self.local_bytes.get(cat, 0) + n
        pull = ticket.pull_rows if got.pull is None else got.pull
        return Answers([got.lamp[r] for r, _ in ticket.asks], pull, got.sync or None)

    def push_history(self, rows: List[HistoryRows]) -> None:
        if self.owner is None:  # to this machine's owner, on the next round
            for r in rows:
                self._add(self.home, "push", r)
            return
        for r in rows:
            self.owner.store(r)

    def sync_halo(self, asks: List[Tuple[int, HistoryPull]]) -> None:
        for r, pull in asks:  # on the next round; the answers come back with it
            self._add(r, "sync", pull)

    def store_halo(self, rows: List[HistoryRows]) -> None:
        self.push_history(rows)

    def push_grads(self, pushes: List[Tuple[int, GradRows]]) -> None:
        for r, g in pushes:  # on the next round (which counts its bytes)
            self._add(r, "grad", g)

    def owner_grads(self) -> List[Grads]:
        if self.owner is None:  # they join the all-reduce of the owner's own trainer
            return []
        with self.lock:
            return [self.owner.take_grads()]

    # --- round thread -------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            asks, fut, pull = self._jobs.get()
            try:
                if pull is not None:
                    asks.setdefault(self.home, {})["pull"] = pull.result()
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
        out = [b""] * len(self.machine_of)
        wire, local = Counter(), Counter()
        mine = self.machine_of[self.rank]

        def count(r: int, cat: str, n: int) -> None:
            (local if self.machine_of[r] == mine else wire)[cat] += n

        for r, ask in asks.items():
            sections = {k: pack_section(k, v) for k, v in ask.items()}
            out[r] = pickle.dumps(sections)
            for k, v in sections.items():
                count(r, REQUEST_CATEGORY[k], len(v))
        incoming = [pickle.loads(b) if b else {} for b in self._exchange(out)]
        answers = self._answer([{k: unpack_section(k, v, ASKED) for k, v in s.items()} for s in incoming])
        back = self._exchange([pickle.dumps({k: pack_section(k, v) for k, v in a.items()}) if a else b""
                               for a in answers])
        lamp, sync, pull = {}, {}, None
        for r, b in enumerate(back):
            if not b:
                continue
            sections = pickle.loads(b)
            for k, v in sections.items():
                count(r, ANSWER_CATEGORY[k], len(v))
            got = {k: unpack_section(k, v, ANSWERED) for k, v in sections.items()}
            if "error" in got:
                raise LampServiceError(f"the trainer of machine {self.machine_of[r]} (rank {r}) failed to answer "
                                       f"a LAMP round: {got['error']}")
            if "lamp" in got:
                lamp[r] = got["lamp"]
            if "sync" in got:
                sync[r] = got["sync"]
            if "pull" in got:
                pull = got["pull"]
        return RoundResult(lamp, sync, pull, dict(wire), dict(local))

    def _answer(self, incoming: List[dict]) -> List[dict]:
        """This owner's answers to every trainer's asks (by rank); an error is answered, not raised.
        History pushes of this machine's trainers are stored first (they were made before the
        asks of this round)."""
        answers: List[dict] = [{} for _ in incoming]
        if not any(incoming):
            return answers
        try:
            if self.owner is None:
                raise RuntimeError(f"rank {self.rank} was asked as an owner, but machine {self.machine_of[self.rank]}'s "
                                   f"owner is rank {self.home}")
            for ask in incoming:
                for rows in ask.get("push", []):
                    self.owner.store(rows)
            peers = [(r, owned_local_ids(self.pb, ask["lamp"].roots, "LAMP roots"))
                     for r, ask in enumerate(incoming) if "lamp" in ask]
            if peers:
                for (r, _), rows in zip(peers, self.owner.answer([ids for _, ids in peers])):
                    answers[r]["lamp"] = rows
            for r, ask in enumerate(incoming):
                if "sync" in ask:
                    answers[r]["sync"] = self.owner.rows(ask["sync"], self.pb)
                if "pull" in ask:
                    if self.machine_of[r] != self.machine_of[self.rank]:
                        raise ValueError(f"rank {r} asked for local history rows of another machine")
                    answers[r]["pull"] = self.owner.rows(ask["pull"])
                for g in ask.get("grad", []):
                    grads = self.owner.backprop(g, self.pb)
                    with self.lock:
                        self.owner.keep_grads(grads, len(g.roots))
        except Exception as e:  # noqa: BLE001 - every asking trainer is told; the collectives stay matched
            msg = f"{type(e).__name__}: {e}"
            print("degnn lamp engine error:\n" + traceback.format_exc(), flush=True)
            return [{"error": msg} if ask else {} for ask in incoming]
        return answers
