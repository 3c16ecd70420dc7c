"""pipeline.engine=server: the owners are DGL's graph servers, asked over DGL RPC. The services
are registered in every server and trainer (`pipeline.services` in conf/pipeline/lamp.yaml,
degnn.runtime.services) before `dgl.distributed.initialize`; this module imports dgl and torch
only.

Each request wraps one message of compute.py; its `process_request(server_state)` runs in the
server that received it (the layout of DGL's graph_services.py) and hands the message to the
server's compute.Owner, module state of the server process (`STATE`):

| id   | request           | from                         | message      | answer          |
|------|-------------------|------------------------------|--------------|-----------------|
| 7710 | LampSetup         | the machine's own trainer    | Setup        | ack             |
| 7711 | SetWeights        | the machine's own trainer    | Weights      | ack             |
| 7712 | HistoryPush       | the machine's own trainer    | HistoryRows  | ack             |
| 7713 | HistoryPull       | own trainer / other machines | HistoryPull  | Rows            |
| 7714 | Lamp              | any trainer                  | Roots        | Rows: h^(L-1)   |
| 7715 | GradPush          | any trainer (grad=push)      | GradRows     | ack             |
| 7716 | GradPull          | the machine's own trainer    | -            | Grads           |

An exception inside `process_request` is answered as a response whose `error` names it
(degnn.runtime.services.answer_or_error, as the TMA coordinator's messages are); the server keeps
serving (DGL's default would kill the server and hang every trainer). The trainer
side (`receive`) raises LampServiceError with that message. `ServerOwners` (engine.Owners) is
the trainer's side of this engine.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from dgl.distributed import rpc

from degnn.pipelines.lamp.compute import (Grads, GradRows, HistoryPull, HistoryRows, Owner, Roots, Rows, Setup,
                                          Weights, flat, owned_local_ids, unflat)
from degnn.pipelines.lamp.engine import Answers, LampServiceError, Owners, Ticket
from degnn.runtime.services import answer_or_error

ID_SETUP, ID_WEIGHTS, ID_PUSH, ID_PULL, ID_LAMP, ID_GRAD, ID_GRAD_PULL = 7710, 7711, 7712, 7713, 7714, 7715, 7716
MSG_OVERHEAD = 64  # DGL RPC message header (ids, sizes) beyond the pickled fields and the tensors
# how long a server polls its queue for more requests to merge (ms; DGL's smallest timeout)
DRAIN_POLL_MS = 1


class _ServerState:
    """What LAMP keeps in one graph server process: its partition's graph and features (read once)
    and the owner set up by LampSetup."""

    def __init__(self):
        self.lg = self.feat = None
        self.owner: Optional[Owner] = None

    def ready(self) -> Owner:
        if self.owner is None:
            raise RuntimeError("LAMP is not set up on this server (no LampSetup request yet)")
        return self.owner


STATE = _ServerState()


def _partition(server_state):
    """(LocalGraph, own nodes' features) of this server's partition."""
    from degnn.pipelines.lamp.graph import LocalGraph

    if STATE.lg is None:
        STATE.lg = LocalGraph.from_partition(server_state.graph)
    if STATE.feat is None:
        store = server_state.kv_store.data_store
        names = [k for k in store if k.split("~")[-1] == "feat"]
        if len(names) != 1:
            raise KeyError(f"no unique node feature 'feat' in this server's KVStore: {sorted(store)}")
        STATE.feat = store[names[0]]
    return STATE.lg, STATE.feat


def payload_bytes(obj) -> int:
    """Bytes a request or response puts on the wire: pickled fields + tensors + header."""
    data, tensors = rpc.serialize_to_payload(obj)
    return len(data) + sum(t.numel() * t.element_size() for t in tensors) + MSG_OVERHEAD


# --- responses: an error and a message ---------------------------------------------------------
class _Response(rpc.Response):
    message = None  # the compute.py class answered; None: an ack

    def __init__(self, msg=None, error: str = ""):
        self.msg = msg if msg is not None or self.message is None else self.message()
        self.error = error

    def __getstate__(self):
        return (self.error,) + (flat(self.msg) if self.message else ())

    def __setstate__(self, state):
        state = state if isinstance(state, tuple) else (state,)  # (DGL unwraps a 1-tuple)
        self.error = state[0]
        self.msg = unflat(self.message, state[1:]) if self.message else None


class AckResponse(_Response):
    pass


class RowsResponse(_Response):
    message = Rows


class GradsResponse(_Response):
    message = Grads


# --- requests: a message each -------------------------------------------------------------------
class _Request(rpc.Request):
    """process_request never raises: an error becomes the response's `error`."""
    message = None
    response_cls = AckResponse

    def __init__(self, msg=None):
        self.msg = msg

    def __getstate__(self):
        return flat(self.msg) if self.message else 0

    def __setstate__(self, state):
        self.msg = unflat(self.message, state) if self.message else None

    def process_request(self, server_state):
        return answer_or_error(self, server_state, self.response_cls)

    def process(self, server_state):
        raise NotImplementedError


class LampSetupRequest(_Request):
    message = Setup

    def process(self, server_state):
        lg, feat = _partition(server_state)
        STATE.owner = Owner.build(lg, feat, self.msg)


class SetWeightsRequest(_Request):
    message = Weights

    def process(self, server_state):
        STATE.ready().load(self.msg)


class HistoryPushRequest(_Request):
    message = HistoryRows

    def process(self, server_state):
        STATE.ready().store(self.msg)


class HistoryPullRequest(_Request):
    message, response_cls = HistoryPull, RowsResponse

    def process(self, server_state):
        return STATE.ready().rows(self.msg, server_state.partition_book if self.msg.global_ids else None)


class GradPushRequest(_Request):
    """grad=push: the owner's parameter gradients are kept for this machine's trainer
    (GradPullRequest), whose next all-reduce they join."""
    message = GradRows

    def process(self, server_state):
        owner = STATE.ready()
        owner.keep_grads(owner.backprop(self.msg, server_state.partition_book), len(self.msg.roots))


class GradPullRequest(_Request):
    """The parameter gradients kept from pushed rows since the last pull (then cleared)."""
    response_cls = GradsResponse

    def process(self, server_state):
        return STATE.ready().take_grads()


class LampRequest(_Request):
    """Request fusion (`fusion` in the setup meta): before computing, the server takes every request
    already queued for it (DGL's loop would serve them one by one); the LAMP requests among them
    (other trainers', prefetched batches') are merged into this one computation graph (roots
    deduplicated, shared sub-graphs computed once) and each is answered its own rows; any other
    request is processed at once, in arrival order, as the loop would."""
    message, response_cls = Roots, RowsResponse

    def process(self, server_state):
        owner = STATE.ready()
        owner.check_weights()
        pb = server_state.partition_book
        mine = rpc.get_msg_seq()  # the loop answers this request with the sequence number set now
        merged = [self] + (_drain(server_state) if owner.meta.get("fusion", True) else [])
        groups = []
        for req in merged:
            try:
                groups.append((req, owned_local_ids(pb, req.msg.roots, "LAMP roots")))
            except ValueError as e:
                if req is self:
                    raise
                _answer(req, RowsResponse(error=f"LampRequest on server: ValueError: {e}"))
        own = None
        for (req, _), rows in zip(groups, owner.answer([g for _, g in groups])):
            if req is self:
                own = rows
            else:
                _answer(req, RowsResponse(rows))
        rpc.set_msg_seq(mine)
        return own


def _drain(server_state) -> list:
    """The LAMP requests already queued for this server (each knowing where to answer), for
    merging; any other request is processed and answered at once."""
    out = []
    while True:
        req, client, group = rpc.recv_request(DRAIN_POLL_MS)
        if req is None:
            return out
        req._reply_to = (rpc.get_msg_seq(), client, group)
        if isinstance(req, LampRequest):
            out.append(req)
            continue
        res = req.process_request(server_state)  # as DGL's server loop would (rpc_server.py)
        if isinstance(res, list):
            for target, r in res:
                rpc.send_response(target, r, group)
        elif isinstance(res, str):  # only DGL's shut-down asks this: never while a trainer waits
            print(f"degnn lamp service: request {type(req).__name__} answered {res!r} while merging "
                  f"LAMP requests; ignored", flush=True)
        elif res is not None:
            _answer(req, res)


def _answer(req, res) -> None:
    seq, client, group = req._reply_to
    rpc.set_msg_seq(seq)
    rpc.send_response(client, res, group)


SERVICES = [
    (ID_SETUP, LampSetupRequest, AckResponse),
    (ID_WEIGHTS, SetWeightsRequest, AckResponse),
    (ID_PUSH, HistoryPushRequest, AckResponse),
    (ID_PULL, HistoryPullRequest, RowsResponse),
    (ID_LAMP, LampRequest, RowsResponse),
    (ID_GRAD, GradPushRequest, AckResponse),
    (ID_GRAD_PULL, GradPullRequest, GradsResponse),
]


# --- trainer side: sending and routing answers -------------------------------------------------
def servers_of(machine: int) -> List[int]:
    per = rpc.get_num_server_per_machine()
    return list(range(machine * per, (machine + 1) * per))


def send(pairs: List[Tuple[int, rpc.Request]], pending: Optional[dict] = None) -> dict:
    """Send every (server id, request) without waiting; returns (or extends) the pending map
    that `receive` takes. Requests sent together are answered in any order; several pending maps
    may be in flight at once (prefetch, background history traffic)."""
    pending = {} if pending is None else pending
    for server, req in pairs:
        seq = rpc.incr_msg_seq()  # (rpc.send_request, keeping the sequence number)
        data, tensors = rpc.serialize_to_payload(req)
        rpc.send_rpc_message(rpc.RPCMessage(req.service_id, seq, rpc.get_rank(), server, data, tensors,
                                            group_id=rpc.get_group_id()), server)
        pending[seq] = (len(pending), server, req)
        _IN_FLIGHT.add(seq)
    return pending


# Answers that arrived while another pending map was being received (by sequence number), and
# the sequence numbers of everything sent and not yet received. DGL's own recv_responses would
# fail on an answer it did not ask for, so nothing else may receive while requests are in flight:
# the LAMP trainer makes no DGL RPC between an epoch's first send and its last receive.
_INBOX: dict = {}
_IN_FLIGHT: set = set()


def receive(pending: dict) -> list:
    """The responses to everything in `pending`, in the order sent; raises LampServiceError when
    a server answered with an error. Answers to other pending maps are kept for their turn."""
    if not pending:
        return []
    res = [None] * len(pending)
    for seq in [s for s in pending if s in _INBOX]:
        res[pending[seq][0]] = _INBOX.pop(seq)
    missing = sum(r is None for r in res)
    while missing:
        msg = rpc.recv_rpc_message(0)
        _, res_cls = rpc.SERVICE_ID_TO_PROPERTY[msg.service_id]
        if msg.msg_seq not in _IN_FLIGHT or res_cls is None:
            raise LampServiceError(f"an answer to no request of this trainer (service {msg.service_id}, "
                                   f"sequence {msg.msg_seq})")
        _IN_FLIGHT.discard(msg.msg_seq)
        r = rpc.deserialize_from_payload(res_cls, msg.data, msg.tensors)
        if msg.msg_seq in pending:
            res[pending[msg.msg_seq][0]] = r
            missing -= 1
        else:
            _INBOX[msg.msg_seq] = r
    for seq in pending:
        _IN_FLIGHT.discard(seq)
    for (i, server, req) in pending.values():
        if getattr(res[i], "error", ""):
            raise LampServiceError(f"graph server {server} failed a {type(req).__name__}: {res[i].error}")
    return res


def call(pairs: List[Tuple[int, rpc.Request]]) -> list:
    """Send every (server id, request), then collect the responses in the same order."""
    return receive(send(pairs))


# --- the trainer's side of engine=server -------------------------------------------------------
class ServerOwners(Owners):
    """engine=server: every message is a request to a graph server. The ones to this machine's
    own servers (set-up, weights, history pushes and reads, owner gradients) are loopback,
    counted in `local_bytes`; LAMP asks, the halo sync and pushed gradient rows cross machines."""

    def __init__(self, counter, me: int, setup: Optional[Setup]):
        super().__init__(counter)
        self.local_servers = servers_of(me)
        self.background: List[dict] = []  # pending maps of pushes and weights (their acks)
        self.sync_pending = None  # the halo sync in flight: (requests, pending map)
        self.grad_pull = None  # grad=push: the pull of owner gradients in flight
        if setup is not None:  # this machine's leader sets its servers up
            self._call_local("setup", [LampSetupRequest(setup)])

    def answerers(self, machine: int) -> List[int]:
        return servers_of(machine)

    def _local(self, category: str, nbytes: int) -> None:
        self.local_bytes[category] = self.local_bytes.get(category, 0) + int(nbytes)

    def _pairs(self, category: str, requests: list, servers: Optional[list]) -> list:
        pairs = [(s, r) for r in requests for s in (servers or self.local_servers)]
        for _, r in pairs:
            self._local(category, payload_bytes(r))
        return pairs

    def _call_local(self, category: str, requests: list) -> list:
        """Every request to every graph server of this machine, waited for."""
        return call(self._pairs(category, requests, None))

    def _send_local(self, category: str, requests: list, servers: Optional[list] = None) -> None:
        """Every request to every graph server of this machine (or to `servers`); `drain` collects
        the acks."""
        pairs = self._pairs(category, requests, servers)
        if pairs:
            self.background.append(send(pairs))

    def init_history(self, rows: List[HistoryRows]) -> None:
        if rows:
            self._call_local("setup", [HistoryPushRequest(r) for r in rows])

    def ship_weights(self, w: Weights, wait: bool) -> None:
        (self._call_local if wait else self._send_local)("weights", [SetWeightsRequest(w)])

    def ask(self, asks: List[Tuple[int, Roots]]) -> Ticket:
        self.rounds += 1 if asks else 0
        return Ticket(asks, send([(s, LampRequest(r)) for s, r in asks]))

    def ask_local(self, ticket: Ticket, pull: HistoryPull) -> None:
        ticket.pull = pull
        send([(self.local_servers[0], HistoryPullRequest(pull))], ticket.pending)

    def answers(self, ticket: Ticket) -> Answers:
        res = receive(ticket.pending)
        for (_, roots), r in zip(ticket.asks, res):
            self.counter.add("lamp_request", payload_bytes(LampRequest(roots)))
            self.counter.add("lamp_response", payload_bytes(r))
        pull = None
        if ticket.pull is not None:
            self._local("history_pull", payload_bytes(HistoryPullRequest(ticket.pull)) + payload_bytes(res[-1]))
            pull = res[-1].msg
        return Answers([r.msg for r in res[:len(ticket.asks)]], pull, None)

    def push_history(self, rows: List[HistoryRows]) -> None:
        # own rows are read only by other machines' halo sync, which asks every server of this
        # machine: one copy is enough (the halo rows and the weights go to every server)
        self._send_local("history_push", [HistoryPushRequest(r) for r in rows], self.local_servers[:1])

    def sync_halo(self, asks: List[Tuple[int, HistoryPull]]) -> None:
        reqs = [(s, HistoryPullRequest(p)) for s, p in asks]
        self.rounds += 1 if reqs else 0
        self.sync_pending = (reqs, send(reqs))

    def halo_answers(self) -> Optional[Dict[int, Rows]]:
        if self.sync_pending is None:
            return None
        reqs, pending = self.sync_pending
        self.sync_pending = None
        res = receive(pending)
        for (_, req), r in zip(reqs, res):
            self.counter.add("history_sync", payload_bytes(req) + payload_bytes(r))
        return {s: r.msg for (s, _), r in zip(reqs, res)}

    def store_halo(self, rows: List[HistoryRows]) -> None:
        self._send_local("history_sync_store", [HistoryPushRequest(r) for r in rows])

    def push_grads(self, pushes: List[Tuple[int, GradRows]]) -> None:
        for server, g in pushes:
            req = GradPushRequest(g)
            self.counter.add("grad_push", payload_bytes(req) + payload_bytes(AckResponse()))
            self.background.append(send([(server, req)]))
        self.rounds += 1 if pushes else 0  # a second round to the owners per batch

    def ask_owner_grads(self) -> None:
        if self.grad_pull is None:
            self.grad_pull = send(self._pairs("grad_pull", [GradPullRequest()], None))

    def owner_grads(self) -> List[Grads]:
        if self.grad_pull is None:
            return []
        res, self.grad_pull = receive(self.grad_pull), None
        return [r.msg for r in res]

    def drain(self) -> None:
        while self.background:
            receive(self.background.pop(0))
