"""LAMP's DGL RPC services, run inside the graph servers (registered through
degnn.runtime.services.SERVICE_MODULES in every server and trainer before
`dgl.distributed.initialize`). Imports dgl and torch only at import time.

Each request is a small class whose `process_request(server_state)` runs in the server that
received it (the layout of DGL's graph_services.py). The state LAMP keeps in a server (model
replica, its version, halo features, the quantized histories of degnn/pipelines/lamp/history.py) is
module state of that server process, set by the requests below:

| id   | request           | from                         | does                                                  |
|------|-------------------|------------------------------|-------------------------------------------------------|
| 7710 | LampSetup         | the machine's own trainer    | model shape, fan-outs, bits; halo nodes' features     |
| 7711 | SetWeights        | the machine's own trainer    | layers 1..L-1 of the model, with its version (step)   |
| 7712 | HistoryPush       | the machine's own trainer    | write quantized rows (local ids) into the histories  |
| 7713 | HistoryPull       | own trainer / other machines | read rows (local ids, or global ids of owned nodes)   |
| 7714 | Lamp              | any trainer                  | prepare h^(L-1) of the roots (global ids it owns)     |

An exception inside `process_request` is answered as a response whose `error` names it; the
server keeps serving (DGL's default would kill the server and hang every trainer). The trainer
side (`call`) raises LampServiceError with that message.
"""
from __future__ import annotations

import traceback
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from dgl.distributed import rpc

ID_SETUP, ID_WEIGHTS, ID_PUSH, ID_PULL, ID_LAMP, ID_GRAD, ID_GRAD_PULL = 7710, 7711, 7712, 7713, 7714, 7715, 7716
MSG_OVERHEAD = 64  # DGL RPC message header (ids, sizes) beyond the pickled fields and the tensors
# how long a server polls its queue for more requests to merge (ms; DGL's smallest timeout)
DRAIN_POLL_MS = 1


class LampServiceError(RuntimeError):
    """A LAMP request failed inside a graph server (the server keeps running)."""


class _ServerState:
    """What LAMP keeps in one graph server process."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.meta = None
        self.lg = None
        self.model = None
        self.version = -1
        self.history = None
        self.halo_x = None
        self.feat = None
        self.boundary = None
        self.gen = torch.Generator().manual_seed(0)
        self.grads = {}  # grad=push: parameter gradients from pushed rows, not yet pulled
        self.grad_rows = 0


STATE = _ServerState()


def _local_graph(server_state):
    from degnn.pipelines.lamp.graph import LocalGraph

    if STATE.lg is None:
        STATE.lg = LocalGraph.from_partition(server_state.graph)
    return STATE.lg


def _features(server_state):
    if STATE.feat is None:
        store = server_state.kv_store.data_store
        names = [k for k in store if k.split("~")[-1] == "feat"]
        if len(names) != 1:
            raise KeyError(f"no unique node feature 'feat' in this server's KVStore: {sorted(store)}")
        STATE.feat = store[names[0]]
    return STATE.feat


def _require_setup():
    if STATE.meta is None or STATE.history is None:
        raise RuntimeError("LAMP is not set up on this server (no LampSetup request yet)")


def owned_local_ids(pb, gids: torch.Tensor, what: str) -> torch.Tensor:
    """Local ids of `gids`, global ids that must all be nodes this machine owns (ValueError
    naming `what` otherwise). Servers and the trainer engine check every id they are sent."""
    gids = gids.long()
    if len(gids) and not bool((pb.nid2partid(gids) == pb.partid).all()):
        raise ValueError(f"{what} must be nodes this machine owns")
    return pb.nid2localnid(gids, pb.partid).long()


def payload_bytes(obj) -> int:
    """Bytes a request or response puts on the wire: pickled fields + tensors + header."""
    data, tensors = rpc.serialize_to_payload(obj)
    return len(data) + sum(t.numel() * t.element_size() for t in tensors) + MSG_OVERHEAD


# --- responses -------------------------------------------------------------------------------
class AckResponse(rpc.Response):
    def __init__(self, error: str = ""):
        self.error = error

    def __getstate__(self):
        return self.error

    def __setstate__(self, state):
        self.error = state


class RowsResponse(rpc.Response):
    """Quantized rows (codes, scale, offset), their stamps, which request rows they are (`sel`,
    empty = all, in order) and, for Lamp, the ages of the history rows the server used, the
    version of the weights it computed with, and `counts` of (node, layer) computations
    (computed, without request fusion, without any fusion: see graph.fusion_counts) plus the
    number of requests answered by that one computation. A computation shared by several requests
    reports its ages and counts in one answer only (the others carry zeros)."""

    def __init__(self, codes=None, scale=None, offset=None, stamp=None, sel=None, ages=(0, 0, 0),
                 version: int = -1, counts=(0, 0, 0, 0), error: str = ""):
        e = torch.empty(0)
        self.codes = e if codes is None else codes
        self.scale = e if scale is None else scale
        self.offset = e if offset is None else offset
        self.stamp = torch.empty(0, dtype=torch.int64) if stamp is None else stamp
        self.sel = torch.empty(0, dtype=torch.int64) if sel is None else sel
        self.ages, self.version, self.counts, self.error = tuple(ages), version, tuple(counts), error

    def __getstate__(self):
        return (self.codes, self.scale, self.offset, self.stamp, self.sel, self.ages, self.version, self.counts,
                self.error)

    def __setstate__(self, state):
        (self.codes, self.scale, self.offset, self.stamp, self.sel, self.ages, self.version, self.counts,
         self.error) = state


# --- requests --------------------------------------------------------------------------------
class _Guarded(rpc.Request):
    """process_request never raises: an error becomes the response's `error`."""
    response_cls = AckResponse

    def process_request(self, server_state):
        try:
            return self.process(server_state)
        except Exception as e:  # noqa: BLE001 - answered, not raised: the server must live on
            msg = f"{type(self).__name__} on server: {type(e).__name__}: {e}"
            print("degnn lamp service error:\n" + traceback.format_exc(), flush=True)
            return self.response_cls(error=msg)

    def process(self, server_state):
        raise NotImplementedError


class LampSetupRequest(_Guarded):
    """meta: dict(kind, in_dim, hidden, out_dim, layers, dropout, heads, fanouts, bits, seed);
    halo_ids: local ids of halo nodes, halo_x: their input features; boundary: local ids of own
    nodes that are halo nodes of other machines (the only own rows anyone reads from here)."""

    def __init__(self, meta: dict, halo_ids: torch.Tensor, halo_x: torch.Tensor, boundary: torch.Tensor):
        self.meta, self.halo_ids, self.halo_x, self.boundary = meta, halo_ids, halo_x, boundary

    def __getstate__(self):
        return self.meta, self.halo_ids, self.halo_x, self.boundary

    def __setstate__(self, state):
        self.meta, self.halo_ids, self.halo_x, self.boundary = state

    def process(self, server_state):
        from degnn.models import GNN
        from degnn.pipelines.lamp.history import History

        m = self.meta
        lg = _local_graph(server_state)
        feat = _features(server_state)
        STATE.reset()
        STATE.lg, STATE.feat = lg, feat
        STATE.meta = dict(m)
        STATE.model = GNN(m["kind"], m["in_dim"], m["hidden"], m["out_dim"], m["layers"], m["dropout"],
                          m["heads"]).eval()
        # h^(1..L-2): the layers read as leaves (the top hidden layer, h^(L-1), is always prepared
        # fresh by the owners, so its history would never be read)
        STATE.history = History(lg.num_nodes, m["hidden"], m["layers"] - 2, m["bits"])
        STATE.halo_x = torch.zeros(lg.num_nodes, feat.shape[1])
        STATE.halo_x[self.halo_ids] = self.halo_x.float()
        STATE.boundary = torch.zeros(lg.num_nodes, dtype=torch.bool)
        STATE.boundary[self.boundary.long()] = True
        STATE.gen.manual_seed(int(m.get("seed", 0)))
        return AckResponse()


class SetWeightsRequest(_Guarded):
    """The model's parameters that owners need (layers below the top one) and their version."""

    def __init__(self, version: int, names: List[str], tensors: Sequence[torch.Tensor]):
        self.version, self.names, self.tensors = version, list(names), list(tensors)

    def __getstate__(self):
        return (self.version, self.names) + tuple(self.tensors)

    def __setstate__(self, state):
        self.version, self.names = state[0], state[1]
        self.tensors = list(state[2:])

    def process(self, server_state):
        _require_setup()
        missing = STATE.model.load_state_dict(dict(zip(self.names, self.tensors)), strict=False).unexpected_keys
        if missing:
            raise KeyError(f"unknown parameters {missing}")
        STATE.version = max(STATE.version, int(self.version))
        return AckResponse()


class HistoryPushRequest(_Guarded):
    """Write rows of history `layer` for local ids `ids` (already quantized, with stamps)."""

    def __init__(self, layer: int, ids, codes, scale, offset, stamp):
        self.layer, self.ids, self.codes, self.scale, self.offset, self.stamp = layer, ids, codes, scale, offset, stamp

    def __getstate__(self):
        return self.layer, self.ids, self.codes, self.scale, self.offset, self.stamp

    def __setstate__(self, state):
        self.layer, self.ids, self.codes, self.scale, self.offset, self.stamp = state

    def process(self, server_state):
        from degnn.pipelines.lamp.quantize import QRows

        _require_setup()
        STATE.history.push_codes(self.layer, self.ids.long(), QRows(self.codes, self.scale, self.offset),
                                 self.stamp.long())
        return AckResponse()


class HistoryPullRequest(_Guarded):
    """Rows of history layers `layers[i]` for `ids[counts[:i].sum():counts[:i+1].sum()]` (for
    all of `ids` in every layer when `counts` is empty; the answer then lists layer after layer).

    `global_ids`: ids are global ids of nodes this machine owns (another machine's halo sync);
    else local ids of this machine's partition. `since` >= 0: only rows stamped after it."""
    response_cls = RowsResponse

    def __init__(self, layers: List[int], counts: List[int], ids: torch.Tensor, global_ids: bool = False,
                 since: int = -1):
        self.layers, self.counts, self.ids, self.global_ids, self.since = list(layers), list(counts), ids, global_ids, since

    def __getstate__(self):
        return self.layers, self.counts, self.ids, self.global_ids, self.since

    def __setstate__(self, state):
        self.layers, self.counts, self.ids, self.global_ids, self.since = state

    def process(self, server_state):
        _require_setup()
        return self.rows(STATE.history, server_state.partition_book if self.global_ids else None)

    def rows(self, history, pb) -> RowsResponse:
        """The answer from `history` (a server's, or a trainer's with pipeline.engine=trainer);
        `pb`, the partition book, is needed for global ids only."""
        from degnn.pipelines.lamp.quantize import QRows

        ids = owned_local_ids(pb, self.ids, "HistoryPull global ids") if self.global_ids else self.ids.long()
        parts, stamps, sels, start = [], [], [], 0
        shared = len(self.counts) == 0  # the same ids for every layer (the halo sync)
        for layer, n in zip(self.layers, [len(ids)] * len(self.layers) if shared else self.counts):
            chunk = ids if shared else ids[start:start + n]
            q, stamp = history.pull_codes(layer, chunk)
            if self.since >= 0:
                keep = torch.nonzero(stamp > self.since).flatten()
                q, stamp = QRows(*(t[keep] if len(t) else t for t in q)), stamp[keep]
                sels.append(keep + start)
            parts.append(q)
            stamps.append(stamp)
            start += n
        if not shared and start != len(ids):
            raise ValueError(f"HistoryPull: counts add up to {start}, got {len(ids)} ids")
        cat = [torch.cat([p[i] for p in parts]) if parts else torch.empty(0) for i in range(3)]
        sel = torch.cat(sels) if sels else None
        return RowsResponse(cat[0], cat[1], cat[2], torch.cat(stamps) if stamps else None, sel)


class LampRequest(_Guarded):
    """Prepare h^(L-1) of `roots` (global ids this machine owns): locality-aware computation graph
    of layers 1..L-1 below them, halo leaves from the histories, the server's model replica; fresh
    rows of owned nodes are written back to the histories. Answered quantized, in root order.

    Request fusion (`fusion` in the setup meta): before computing, the server takes every request
    already queued for it (DGL's loop would serve them one by one); the LAMP requests among them
    (other trainers', prefetched batches') are merged into this one computation graph (roots
    deduplicated, shared sub-graphs computed once) and each is answered its own rows; any other
    request is processed at once, in arrival order, as the loop would."""
    response_cls = RowsResponse

    def __init__(self, roots: torch.Tensor, version: int):
        self.roots, self.version = roots, version

    def __getstate__(self):
        return self.roots, self.version

    def __setstate__(self, state):
        self.roots, self.version = state

    @torch.no_grad()
    def process(self, server_state):
        _require_setup()
        if STATE.version < 0:
            raise RuntimeError("LAMP request before any SetWeights: the server has no model weights")
        pb = server_state.partition_book
        mine = rpc.get_msg_seq()  # the loop answers this request with the sequence number set now
        merged = [(self, None)] + (_drain(server_state) if STATE.meta.get("fusion", True) else [])
        groups = []
        for req, _ in merged:
            try:
                groups.append((req, owned_local_ids(pb, req.roots, "LAMP roots")))
            except ValueError as e:
                if req is self:
                    raise
                _answer(req, RowsResponse(error=f"LampRequest on server: ValueError: {e}"))
        answers = answer_merged(STATE.lg, STATE.model, STATE.feat, STATE.halo_x, STATE.history, STATE.boundary,
                                [g for _, g in groups], STATE.meta, STATE.version, STATE.gen)
        own = None
        for (req, _), res in zip(groups, answers):
            if req is self:
                own = res
            else:
                _answer(req, res)
        rpc.set_msg_seq(mine)
        return own


def _drain(server_state) -> list:
    """The requests already queued for this server: LAMP requests are returned (with where to
    answer them) for merging; any other one is processed and answered at once."""
    out = []
    while True:
        req, client, group = rpc.recv_request(DRAIN_POLL_MS)
        if req is None:
            return out
        req._reply_to = (rpc.get_msg_seq(), client, group)
        if isinstance(req, LampRequest):
            out.append((req, req._reply_to))
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


def answer_merged(lg, model, feat, halo_x, history, boundary, groups: List[torch.Tensor], meta: dict, version: int,
                  gen: torch.Generator) -> List[RowsResponse]:
    """An owner's answers to requests merged into one computation graph (`groups`: each request's
    roots, local ids; level-1 fusion): h^(L-1) of each request's roots, quantized. The first answer
    carries the ages of the history rows used and the counts; the computation they share reports
    them once. The graph servers' LampRequest and the trainer engine both answer with it."""
    from degnn.pipelines.lamp.history import ages_summary
    from degnn.pipelines.lamp.quantize import quantize

    local, inverse = torch.unique(torch.cat(groups), return_inverse=True)
    split = torch.split(inverse, [len(g) for g in groups])
    h, ages, counts = prepare(lg, model, feat, halo_x, history, local, meta["fanouts"][:-1], version, boundary,
                              fusion=meta.get("fusion", True), groups=split)
    out = []
    for i, idx in enumerate(split):
        q = quantize(h[idx], meta["bits"], generator=gen)
        out.append(RowsResponse(q.codes, q.scale, q.offset, version=version,
                                ages=ages_summary(ages) if i == 0 else (0, 0, 0),
                                counts=tuple(counts) + (len(groups),) if i == 0 else (0, 0, 0, 0)))
    return out


def add_grads(acc: Dict[str, torch.Tensor], grads) -> None:
    """Sum (name, gradient) pairs into `acc` (grad=push: owner gradients waiting for an all-reduce)."""
    for name, g in grads:
        acc[name] = acc[name] + g if name in acc else g


def lower_layer_grads(lg, model, feat, halo_x, history, roots_local: torch.Tensor, grad_rows: torch.Tensor,
                      meta: dict, version: int) -> Dict[str, torch.Tensor]:
    """grad=push at an owner: the gradient rows of h^(L-1) of `roots_local`, backpropagated into
    the model's lower layers (the top one only trainers run) through a fresh computation graph
    below the roots (owners keep no per-request autograd state), by parameter name."""
    top = f"layers.{meta['layers'] - 1}."
    params = [(n, p) for n, p in model.named_parameters() if not n.startswith(top)]
    with torch.enable_grad():
        h, _, _ = prepare(lg, model, feat, halo_x, history, roots_local, meta["fanouts"][:-1], version,
                          torch.zeros(lg.num_nodes, dtype=torch.bool))  # no write-back
        grads = torch.autograd.grad(h, [p for _, p in params], grad_rows, allow_unused=True)
    return {name: g for (name, _), g in zip(params, grads) if g is not None}


def prepare(lg, model, feat, halo_x, history, roots_local, fanouts, version: int,
            write_back: Optional[torch.Tensor] = None, fusion: bool = True, groups=None):
    """LAMP at an owner: h^(len(fanouts)) of `roots_local` (unique) through the model's first
    len(fanouts) layers (eval mode), on the locality-aware computation graph; halo leaves of
    block k >= 1 read history layer k; fresh rows of the nodes flagged in `write_back` (a mask
    over local ids: the nodes other machines read, all when None) are written back to the
    histories. `groups`: positions in `roots_local` of each merged request's roots (for the
    counts). fusion=False computes the unfolded graph (graph.unfold: every path once), as if
    nothing were shared. Returns (h, ages of history rows used, graph.fusion_counts)."""
    from degnn.pipelines.lamp.graph import fusion_counts, unfold

    cg = lg.build(roots_local, fanouts)
    counts = fusion_counts(cg, groups)
    if not fusion:
        cg = unfold(cg)
        counts = (counts[2],) * 3  # computed = what would be without fusion: nothing saved
    h = torch.cat([feat[cg.inner_src[0]].float(), halo_x[cg.leaves[0]]])
    ages = []
    for k, block in enumerate(cg.blocks):
        if k > 0:
            rows, age = history.pull(k, cg.leaves[k], version)
            ages.append(age)
            h = torch.cat([h, rows])
        h = model.layer_forward(k, block, h)
        if k + 1 > history.layers:
            continue
        keep = torch.ones(len(h), dtype=torch.bool) if write_back is None else write_back[cg.dst[k]]
        if bool(keep.any()):
            history.push(k + 1, cg.dst[k][keep], h[keep], version)
    return h, ages, counts


class GradsResponse(rpc.Response):
    """Parameter gradients (names, tensors) and how many pushed rows produced them."""

    def __init__(self, names=(), tensors=(), rows: int = 0, error: str = ""):
        self.names, self.tensors, self.rows, self.error = list(names), list(tensors), rows, error

    def __getstate__(self):
        return (self.names, self.rows, self.error) + tuple(self.tensors)

    def __setstate__(self, state):
        self.names, self.rows, self.error = state[0], state[1], state[2]
        self.tensors = list(state[3:])


class GradPushRequest(_Guarded):
    """grad=push (P3-style): the loss's gradient with respect to the h^(L-1) this machine answered
    for `roots`, quantized like the answers. The server recomputes its computation graph below the
    roots with autograd on (a fresh sample with its current weights: it keeps no per-request
    autograd state), backpropagates the rows into its replica's lower layers and keeps the
    parameter gradients for this machine's trainer (GradPullRequest), whose next all-reduce they
    join."""

    def __init__(self, roots: torch.Tensor, codes, scale, offset):
        self.roots, self.codes, self.scale, self.offset = roots, codes, scale, offset

    def __getstate__(self):
        return self.roots, self.codes, self.scale, self.offset

    def __setstate__(self, state):
        self.roots, self.codes, self.scale, self.offset = state

    def process(self, server_state):
        from degnn.pipelines.lamp.quantize import QRows, dequantize

        _require_setup()
        pb = server_state.partition_book
        roots = owned_local_ids(pb, self.roots, "pushed gradient rows' roots")
        m = STATE.meta
        grad = dequantize(QRows(self.codes, self.scale, self.offset), m["bits"], m["hidden"])
        grads = lower_layer_grads(STATE.lg, STATE.model, STATE.feat, STATE.halo_x, STATE.history, roots, grad, m,
                                  STATE.version)
        add_grads(STATE.grads, grads.items())
        STATE.grad_rows += len(roots)
        return AckResponse()


class GradPullRequest(_Guarded):
    """The parameter gradients accumulated from pushed rows since the last pull (then cleared)."""
    response_cls = GradsResponse

    def __getstate__(self):
        return 0

    def __setstate__(self, state):
        pass

    def process(self, server_state):
        _require_setup()
        names = sorted(STATE.grads)
        res = GradsResponse(names, [STATE.grads[n] for n in names], STATE.grad_rows)
        STATE.grads, STATE.grad_rows = {}, 0
        return res


SERVICES = [
    (ID_SETUP, LampSetupRequest, AckResponse),
    (ID_WEIGHTS, SetWeightsRequest, AckResponse),
    (ID_PUSH, HistoryPushRequest, AckResponse),
    (ID_PULL, HistoryPullRequest, RowsResponse),
    (ID_LAMP, LampRequest, RowsResponse),
    (ID_GRAD, GradPushRequest, AckResponse),
    (ID_GRAD_PULL, GradPullRequest, GradsResponse),
]


# --- trainer side ----------------------------------------------------------------------------
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
