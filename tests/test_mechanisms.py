"""What each mechanism must produce, asserted on its output (in-process, no cluster): LAMP's halo
sync stores the owners' rows in the machine's histories, LAMP's owners compute with the newest
weights shipped to them, and TMA's weighted mean counts live submissions only, each weighted by
its trainer's train nodes under pipeline.weighting=train_nodes."""
from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest
import torch

from degnn.models import GNN
from degnn.pipelines.lamp import compute
from degnn.pipelines.lamp.codec import make_codec
from degnn.pipelines.lamp.compute import Owner, Weights
from degnn.pipelines.lamp.graph import LocalGraph
from degnn.pipelines.lamp.halo import HaloSync
from degnn.pipelines.lamp.history import History
from degnn.pipelines.lamp.owners import TrainerOwners
from degnn.pipelines.lamp.pipeline import LAMPPipeline
from degnn.pipelines.tma.coordinator import Coordinator

from test_lamp import _PartitionBook, random_partition

META = {"codec": "minmax", "bits": 32, "fanouts": [-1, -1, -1], "fusion": True, "hidden": 8, "layers": 3,
        "seed": 0, "history_layers": 2}


class _OwnerBook(_PartitionBook):
    """The partition book as machine 1 (the owner of test_lamp's halo nodes, global ids >= 50)
    sees it: its local id of a global id is the global id (a table over every node)."""
    partid = 1


# --- LAMP: the halo sync ----------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [None, 1.0], ids=["since", "budget"])
@pytest.mark.parametrize("bits", [8, 32])
def test_a_halo_sync_stores_the_owners_rows_and_stamps_in_the_machines_histories(budget, bits):
    """A whole halo sync as a trainer runs it (HaloSync.plan -> the owners' answers ->
    LAMPPipeline._store_sync -> the engine's store_halo): afterwards the machine's history rows of
    every halo node are the owner's rows, the same packed codes and the same stamps, every table."""
    _, part = random_partition(n=80, n_inner=50, avg_deg=5, seed=0)
    lg = LocalGraph.from_partition(part)
    model = GNN("sage", 5, 8, 4, 3, dropout=0.0)
    meta = dict(META, bits=bits)
    codec = make_codec("minmax", 8, bits)
    eng = TrainerOwners(None, lg, torch.zeros(50, 5), torch.zeros(lg.num_nodes, 5),
                        torch.zeros(lg.num_nodes, dtype=torch.bool), model, meta, _PartitionBook(), [0, 1],
                        {0: 0, 1: 1}, rank=0, group=None)
    mine = eng.owner.history
    # machine 1's histories over global ids: rows of its own nodes, stamped 3 .. (written since)
    theirs = History(80, 2, codec)
    gen = torch.Generator().manual_seed(1)
    for layer in (1, 2):
        theirs.push_packed(layer, torch.arange(80), codec.encode(torch.randn(80, 8, generator=gen), gen),
                           torch.randint(3, 9, (80,), generator=gen))
    halo = HaloSync(lg, _PartitionBook(), 2, seed=0, budget=budget, since_margin=0, codec=codec)
    assert len(halo.gid) > 5 and bool((halo.gid >= 50).all())
    for layer in (1, 2):  # nothing there before the sync
        assert bool((mine.pull_packed(layer, halo.local)[1] == -1).all())
    step = 4
    asks = halo.plan(step, roots=10 * len(halo.gid), answerers=eng.answerers)
    assert [a for a, _ in asks] == [1]
    answers = {a: compute.history_rows(theirs, pull, _OwnerBook()) for a, pull in asks}
    LAMPPipeline._store_sync(SimpleNamespace(halo=halo, owners=eng, me=0, step_no=step), answers)
    assert halo.pending is None and halo.rows == 2 * len(halo.gid)
    for layer in (1, 2):
        got, got_stamp = mine.pull_packed(layer, halo.local)
        want, want_stamp = theirs.pull_packed(layer, halo.gid)
        assert torch.equal(got_stamp, want_stamp), f"layer {layer} stamps"
        for g, w in zip(got, want):
            assert torch.equal(g, w), f"layer {layer} rows"
        assert bool((halo.refreshed[layer - 1] == step).all())
    eng.release()


# --- LAMP: the owners' weights ----------------------------------------------------------------------
def _weights(model, version):
    named = [(n, p.detach().clone()) for n, p in model.named_parameters()]
    return Weights(version, [n for n, _ in named], [t for _, t in named])


@torch.no_grad()
def _exact(model, whole, x):
    out = [x]
    for i in range(3):
        out.append(model.layer_forward(i, whole, out[-1]))
    return out


@pytest.mark.parametrize("engine", ["owner", "trainer"])
@torch.no_grad()
def test_owners_answer_with_the_newest_weights_shipped(engine):
    """An owner shipped W1 then W2 answers roots with exactly what exact inference with W2 gives
    (32 bits, full fan-outs, histories holding W2's exact rows), not W1's; its version is W2's.
    engine=trainer: through TrainerOwners.ship_weights and the round that loads them."""
    whole, part = random_partition(n=80, n_inner=50, avg_deg=5, seed=0)
    lg = LocalGraph.from_partition(part)
    torch.manual_seed(0)
    x = torch.randn(whole.num_nodes(), 5)
    w1 = GNN("sage", 5, 8, 4, 3, dropout=0.0).eval()
    w2 = GNN("sage", 5, 8, 4, 3, dropout=0.0).eval()
    exact1, exact2 = _exact(w1, whole, x), _exact(w2, whole, x)
    halo_x = torch.zeros(lg.num_nodes, 5)
    halo_x[~lg.inner] = x[lg.nid[~lg.inner]]
    feat = x[lg.nid[lg.inner]]
    meta = dict(META, history_layers=1)
    replica = GNN("sage", 5, 8, 4, 3, dropout=0.0)  # weights of its own until some are shipped
    if engine == "owner":
        owner = Owner(lg, feat, halo_x, torch.zeros(lg.num_nodes, dtype=torch.bool), replica, meta,
                      History(lg.num_nodes, 1, make_codec("minmax", 8, 32)))
        owner.load(_weights(w1, 1))
        owner.load(_weights(w2, 2))
    else:
        eng = TrainerOwners(None, lg, feat, halo_x, torch.zeros(lg.num_nodes, dtype=torch.bool), replica, meta,
                            _PartitionBook(), [0, 1], {0: 0, 1: 1}, rank=0, group=None)
        eng._exchange = lambda out: [b""] * len(out)  # a round that nobody asks anything in
        owner = eng.owner
        for w in (_weights(w1, 1), _weights(w2, 2)):
            eng.ship_weights(w, wait=False)
            eng._round({})
    owner.history.push(1, torch.arange(lg.num_nodes), exact2[1][lg.nid], version=2)
    roots = torch.tensor([0, 3, 7, 20, 33])
    [ans] = owner.answer([roots])
    got = owner.codec.decode(ans.rows)
    assert ans.version == owner.version == 2
    assert not torch.allclose(exact1[2][roots], exact2[2][roots], atol=1e-3)  # W1 would show
    assert torch.allclose(got, exact2[2][lg.nid[roots]], atol=1e-5)
