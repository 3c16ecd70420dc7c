"""What an owner does, whichever process it runs in (a graph server, `pipeline.engine=server`, or
a machine's trainer, `engine=trainer`), and the messages it is sent and answers.

An owner holds its partition's locality-aware graph (graph.py), the input features of its own
nodes and a replica of its halo nodes' features, the quantized histories h^(1..L-2)
(history.py) and a model replica (eval mode, no dropout: answers stand in for historical
embeddings, which should be expectations). For the roots a trainer sends it builds the graph of
layers 1..L-1 below them, reads its halo leaves from the histories, runs the replica, writes
fresh rows of its boundary nodes back, and answers h^(L-1) of the roots encoded by the run's
codec (codec.py); with grad=push it backpropagates gradient rows of its answers into the
replica's lower layers.

Messages are small dataclasses; both transports carry them unchanged (service.py wraps them in
DGL RPC requests, owners.py packs them into its rounds). Encoded rows are one field (`rows`, the
codec's packed value), opaque here. Imports torch and dgl only: graph servers import this module
through service.py before `dgl.distributed.initialize`.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Tuple

import torch

from degnn.pipelines.lamp.graph import fusion_counts, unfold
from degnn.pipelines.lamp.codec import Codec, Packed, make_codec, sparse_file
from degnn.pipelines.lamp.history import History, ages_summary

# the field of a message spread on the wire (`flat`): a packed value (a tuple of tensors) or a
# trailing list of tensors. DGL's RPC sends only a state's top-level tensors as raw buffers
ROWS = {"spread": tuple}
TENSORS = {"spread": list}


# --- messages --------------------------------------------------------------------------------
@dataclass
class Setup:
    """An owner's set-up (to a graph server, from its machine's trainer). meta: dict(kind, in_dim,
    hidden, out_dim, layers, dropout, heads, fanouts, codec, bits, seed, fusion, history_layers: the
    history tables kept, halo_bits); halo_ids: local ids of halo nodes, halo_x: their input
    features (HaloFeatures' table at meta halo_bits); boundary: local ids of own nodes that are
    halo nodes of other machines (the only own rows anyone reads from the histories); halo_path:
    where the trainer shares halo_x instead (a file its graph servers map, in the machine's
    /dev/shm or, with pipeline.halo_store=disk, on disk: `halo_table`; halo_x is then empty)."""
    meta: dict
    halo_ids: torch.Tensor
    halo_x: torch.Tensor
    boundary: torch.Tensor
    halo_path: str = ""


@dataclass
class Weights:
    """The model's parameters the owners compute with (every layer but the top) and their
    version (the trainer's step)."""
    version: int
    names: List[str]
    tensors: List[torch.Tensor] = field(metadata=TENSORS)


@dataclass
class HistoryRows:
    """Rows of history `layer` for local ids `ids`, already encoded, with their stamps."""
    layer: int
    ids: torch.Tensor
    rows: Packed = field(metadata=ROWS)
    stamp: torch.Tensor

    @classmethod
    def of(cls, layer: int, ids: torch.Tensor, x: torch.Tensor, version: int, codec: Codec) -> "HistoryRows":
        return cls(layer, ids, codec.encode(x), torch.full((len(ids),), version, dtype=torch.int64))


@dataclass
class HistoryPull:
    """Rows of history layers `layers[i]` for `ids[counts[:i].sum():counts[:i+1].sum()]` (all of
    `ids` in every layer when `counts` is empty; the answer then lists layer after layer).
    `global_ids`: ids are global ids of nodes the owner owns (another machine's halo sync), else
    local ids of the owner's partition. `since` >= 0: only rows stamped after it."""
    layers: List[int]
    counts: List[int]
    ids: torch.Tensor
    global_ids: bool = False
    since: int = -1


@dataclass
class Roots:
    """A trainer's LAMP ask: prepare h^(L-1) of `roots` (global ids the owner owns); `version`:
    the trainer's step when it asked."""
    roots: torch.Tensor
    version: int


@dataclass
class Rows:
    """Encoded rows (the codec's packed value) and, for history rows, their stamps and which asked
    rows they are (`sel`, None = all, in order). A LAMP answer also carries the ages of the
    history rows the owner used, the version of the weights it computed with, and `counts` of
    (node, layer) computations (computed, without request fusion, without any fusion: see
    graph.fusion_counts) plus the number of requests that one computation answered. A computation
    shared by several requests reports its ages and counts in one answer only (the others carry
    zeros)."""
    rows: Packed = field(default=(), metadata=ROWS)
    stamp: Optional[torch.Tensor] = None
    sel: Optional[torch.Tensor] = None
    ages: Tuple[int, int, int] = (0, 0, 0)
    version: int = -1
    counts: Tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclass
class GradRows:
    """grad=push: the loss's gradient with respect to the h^(L-1) an owner answered for `roots`
    (global ids), encoded like the answers."""
    roots: torch.Tensor
    rows: Packed = field(metadata=ROWS)


@dataclass
class Grads:
    """Parameter gradients an owner computed from pushed rows (by name), and how many rows."""
    names: List[str] = field(default_factory=list)
    rows: int = 0
    tensors: List[torch.Tensor] = field(default_factory=list, metadata=TENSORS)


def _spread(cls) -> int:
    """The position of `cls`'s spread field (ROWS, TENSORS: at most one a message), or -1."""
    return next((i for i, f in enumerate(fields(cls)) if "spread" in f.metadata), -1)


def flat(msg) -> tuple:
    """A message's fields in order, its spread field's tensors in its place (DGL's RPC sends the
    top-level tensors of a tuple as raw buffers: a codec's parts travel as they would as fields of
    their own)."""
    vals = [getattr(msg, f.name) for f in fields(msg)]
    i = _spread(type(msg))
    return tuple(vals) if i < 0 else tuple(vals[:i]) + tuple(vals[i]) + tuple(vals[i + 1:])


def unflat(cls, state):
    """The message of class `cls` from `flat`'s tuple (the spread field takes what the others leave)."""
    i, n = _spread(cls), len(fields(cls))
    if i < 0:
        return cls(*state)
    k = len(state) - (n - 1)
    return cls(*state[:i], fields(cls)[i].metadata["spread"](state[i:i + k]), *state[i + k:])


# --- the computation -------------------------------------------------------------------------
class HaloFeatures:
    """The input features of a partition's halo nodes, stored for those nodes only and indexed by
    local id like a full table (`halo_x[local_ids]`, float32 rows). A table sized to every node of
    the partition would hold a dead zero row for each own node: on bench=scale's 4M graph that was
    0.5 GB a trainer (own nodes read their features from the KVStore's local partition instead).
    Only halo ids may be looked up.

    `table`: uint8 [rows, codec.row_bytes], each row encoded by `codec` (the run's codec at
    pipeline.halo_bits) as bytes (Codec.to_bytes); halo_bits=32 (the default) keeps the exact
    float32 features, read in place; 16 or 8 a half or about a quarter of their bytes (on the 4M
    graph's machines 0.5 GB of halo features against 0.14 GB at 8 bits), at the price of rounding
    the inputs of the bottom layer's halo leaves (stochastically: unbiased, like the histories)."""

    def __init__(self, ids: torch.Tensor, table: torch.Tensor, num_nodes: int, codec: Codec):
        if table.dtype == torch.float32 and codec.exact:  # float rows as they are (their bytes)
            table = table.contiguous().view(torch.uint8)
        self.ids, self.table, self.codec = ids.long(), table, codec
        if table.shape != (len(self.ids), codec.row_bytes) or table.dtype != torch.uint8:
            raise ValueError(f"halo table of shape {tuple(table.shape)} ({table.dtype}) for {len(self.ids)} rows "
                             f"of {codec}")
        self.x = table.view(torch.float32) if codec.exact else None  # float32: rows read as they are
        self.row = torch.full((num_nodes,), -1, dtype=torch.int64)
        self.row[self.ids] = torch.arange(len(self.ids))

    def write(self, part: slice, x: torch.Tensor, generator: Optional[torch.Generator] = None) -> None:
        """Rows `part` (positions among the halo nodes) from float rows `x`."""
        if self.x is not None:
            self.x[part] = x.float()
            return
        self.table[part] = self.codec.to_bytes(self.codec.encode(x, generator))

    def __getitem__(self, local_ids: torch.Tensor) -> torch.Tensor:
        if self.x is not None:
            return self.x[self.row[local_ids]]
        return self.codec.decode(self.codec.from_bytes(self.table[self.row[local_ids]]))


def halo_table(rows: int, codec: Codec, where: Optional[str]) -> Tuple[torch.Tensor, str]:
    """An uninitialised table for `rows` halo nodes' features encoded by `codec` (HaloFeatures'
    layout), and its path. where: a
    directory for a file the table maps (shared with the processes that map it too,
    `map_halo_table`): /dev/shm for the machine's graph servers with engine=server (the machine
    then holds one copy, not one per process: 0.5 GB on bench=scale's 4M graph), a disk directory
    for pipeline.halo_store=disk (pages the kernel may drop under memory pressure and re-read);
    None: in this process's memory, path ''. The caller unlinks the file once it is mapped
    everywhere (the mappings keep it)."""
    width = codec.row_bytes
    if where is None or rows * codec.dim == 0:
        return torch.empty(rows, width, dtype=torch.uint8), ""
    path = sparse_file(where, "degnn-lamp-halo-", rows * width)
    return map_halo_table(path, rows, codec), path


def map_halo_table(path: str, rows: int, codec: Codec) -> torch.Tensor:
    """The halo table a trainer shared at `path` (halo_table), mapped, not copied."""
    width = codec.row_bytes
    return torch.from_file(path, shared=True, size=rows * width, dtype=torch.uint8).view(rows, width)


def history_dir(meta: dict) -> Optional[str]:
    """Where the owner's history tables live: None (memory) or, with pipeline.history_store=disk,
    the machine's temporary directory ($TMPDIR or /tmp)."""
    return tempfile.gettempdir() if meta.get("history_store", "memory") == "disk" else None


def row_codec(meta: dict) -> Codec:
    """The codec of an owner's hidden-state rows (histories, answers, pushed gradients)."""
    return make_codec(meta["codec"], meta["hidden"], meta["bits"])


def owned_local_ids(pb, gids: torch.Tensor, what: str) -> torch.Tensor:
    """Local ids of `gids`, global ids that must all be nodes this machine owns (ValueError
    naming `what` otherwise). Owners check every id they are sent."""
    gids = gids.long()
    if len(gids) and not bool((pb.nid2partid(gids) == pb.partid).all()):
        raise ValueError(f"{what} must be nodes this machine owns")
    return pb.nid2localnid(gids, pb.partid).long()


def add_grads(acc: Dict[str, torch.Tensor], grads) -> None:
    """Sum (name, gradient) pairs into `acc` (grad=push: owner gradients waiting for an all-reduce)."""
    for name, g in grads:
        acc[name] = acc[name] + g if name in acc else g


def prepare(lg, model, feat, halo_x, history, roots_local, fanouts, version: int,
            write_back: Optional[torch.Tensor] = None, fusion: bool = True, groups=None):
    """LAMP at an owner: h^(len(fanouts)) of `roots_local` (unique) through the model's first
    len(fanouts) layers, on the locality-aware computation graph; halo leaves of block k >= 1
    read history layer k; fresh rows of the nodes flagged in `write_back` (a mask over local ids:
    the nodes other machines read, all when None) are written back to the histories. `groups`:
    positions in `roots_local` of each merged request's roots (for the counts). fusion=False
    computes the unfolded graph (graph.unfold: every path once), as if nothing were shared.
    Returns (h, ages of history rows used, graph.fusion_counts)."""
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


def history_rows(history: History, pull: HistoryPull, pb=None) -> Rows:
    """The answer to `pull` from `history`; `pb`, the partition book, is needed for global ids."""
    ids = owned_local_ids(pb, pull.ids, "HistoryPull global ids") if pull.global_ids else pull.ids.long()
    codec = history.codec
    parts, stamps, sels, start = [], [], [], 0
    shared = len(pull.counts) == 0  # the same ids for every layer (the halo sync)
    for layer, n in zip(pull.layers, [len(ids)] * len(pull.layers) if shared else pull.counts):
        chunk = ids if shared else ids[start:start + n]
        rows, stamp = history.pull_packed(layer, chunk)
        if pull.since >= 0:
            keep = torch.nonzero(stamp > pull.since).flatten()
            rows, stamp = codec.take(rows, keep), stamp[keep]
            sels.append(keep + start)
        parts.append(rows)
        stamps.append(stamp)
        start += n
    if not shared and start != len(ids):
        raise ValueError(f"HistoryPull: counts add up to {start}, got {len(ids)} ids")
    return Rows(codec.cat(parts), torch.cat(stamps) if stamps else None, torch.cat(sels) if sels else None)


class Owner:
    """One machine's owner state and what it does with each message. `history` may be shared with
    the process's trainer (engine=trainer: a History with a lock)."""

    def __init__(self, lg, feat, halo_x, boundary, model, meta: dict, history: History):
        self.lg, self.feat, self.halo_x, self.boundary, self.meta = lg, feat, halo_x, boundary, meta
        self.model = model.eval()
        self.history = history
        self.codec = history.codec
        self.version = -1
        self.gen = torch.Generator().manual_seed(int(meta.get("seed", 0)))
        self.grads: Dict[str, torch.Tensor] = {}  # grad=push: from pushed rows, not yet taken
        self.grad_rows = 0

    @classmethod
    def build(cls, lg, feat, setup: Setup) -> "Owner":
        """An owner from its trainer's set-up (a fresh model replica and empty histories)."""
        from degnn.models import GNN

        m = setup.meta
        # (on the CPU: with backend=auto DGL's layers, with torch the plain-torch ones)
        model = GNN(m["kind"], m["in_dim"], m["hidden"], m["out_dim"], m["layers"], m["dropout"], m["heads"],
                    m.get("backend", "auto"))
        # h^(1..L-2): the layers read as leaves (the top hidden layer, h^(L-1), is prepared fresh
        # by the owners, so its history is kept only with pipeline.roots=histories)
        history = History(lg.num_nodes, m["history_layers"], row_codec(m), history_dir(m))
        codec = make_codec(m["codec"], m["in_dim"], int(m.get("halo_bits", 32)))
        x = map_halo_table(setup.halo_path, len(setup.halo_ids), codec) if setup.halo_path else setup.halo_x
        halo_x = HaloFeatures(setup.halo_ids, x, lg.num_nodes, codec)
        boundary = torch.zeros(lg.num_nodes, dtype=torch.bool)
        boundary[setup.boundary.long()] = True
        return cls(lg, feat, halo_x, boundary, model, dict(m), history)

    def release(self) -> None:
        """Drop the histories and halo features (training is over; any later ask fails loudly)."""
        self.history = self.halo_x = None

    def check_weights(self) -> None:
        if self.version < 0:
            raise RuntimeError("LAMP request before any weights reached this owner (no SetWeights yet)")

    def load(self, w: Weights) -> None:
        unknown = self.model.load_state_dict(dict(zip(w.names, w.tensors)), strict=False).unexpected_keys
        if unknown:
            raise KeyError(f"unknown parameters {unknown}")
        self.version = max(self.version, int(w.version))

    def store(self, rows: HistoryRows) -> None:
        self.history.push_packed(rows.layer, rows.ids.long(), rows.rows, rows.stamp.long())

    def rows(self, pull: HistoryPull, pb=None) -> Rows:
        return history_rows(self.history, pull, pb)

    @torch.no_grad()
    def answer(self, groups: List[torch.Tensor]) -> List[Rows]:
        """The answers to LAMP asks merged into one computation graph (`groups`: each ask's roots,
        local ids; level-1 fusion): h^(L-1) of each ask's roots, encoded. The first answer
        carries the ages of the history rows used and the counts; the computation they share
        reports them once."""
        self.check_weights()
        if not self.meta.get("fusion", True) and len(groups) > 1:  # every ask on its own, unfolded
            return [a for g in groups for a in self.answer([g])]
        local, inverse = torch.unique(torch.cat(groups), return_inverse=True)
        split = torch.split(inverse, [len(g) for g in groups])
        h, ages, counts = prepare(self.lg, self.model, self.feat, self.halo_x, self.history, local,
                                  self.meta["fanouts"][:-1], self.version, self.boundary,
                                  fusion=self.meta.get("fusion", True), groups=split)
        out = []
        for i, idx in enumerate(split):
            out.append(Rows(self.codec.encode(h[idx], self.gen), version=self.version,
                            ages=ages_summary(ages) if i == 0 else (0, 0, 0),
                            counts=tuple(counts) + (len(groups),) if i == 0 else (0, 0, 0, 0)))
        return out

    def backprop(self, push: GradRows, pb) -> Dict[str, torch.Tensor]:
        """grad=push: the gradient rows of h^(L-1) of the pushed roots, backpropagated into the
        model's lower layers (the top one only trainers run) through a fresh computation graph below
        the roots (owners keep no per-request autograd state), by parameter name."""
        m = self.meta
        roots = owned_local_ids(pb, push.roots, "pushed gradient rows' roots")
        grad_rows = self.codec.decode(push.rows)
        top = f"layers.{m['layers'] - 1}."
        params = [(n, p) for n, p in self.model.named_parameters() if not n.startswith(top)]
        with torch.enable_grad():
            h, _, _ = prepare(self.lg, self.model, self.feat, self.halo_x, self.history, roots, m["fanouts"][:-1],
                              self.version, torch.zeros(self.lg.num_nodes, dtype=torch.bool))  # no write-back
            grads = torch.autograd.grad(h, [p for _, p in params], grad_rows, allow_unused=True)
        return {name: g for (name, _), g in zip(params, grads) if g is not None}

    def keep_grads(self, grads: Dict[str, torch.Tensor], rows: int) -> None:
        add_grads(self.grads, grads.items())
        self.grad_rows += rows

    def take_grads(self) -> Grads:
        """The parameter gradients kept since the last take (then cleared)."""
        names = sorted(self.grads)
        out = Grads(names, self.grad_rows, [self.grads[n] for n in names])
        self.grads, self.grad_rows = {}, 0
        return out
