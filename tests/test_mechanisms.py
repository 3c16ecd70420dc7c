"""What each mechanism must produce, asserted on its output (in-process, no cluster): LAMP's halo
sync stores the owners' rows in the machine's histories, LAMP's owners compute with the newest
weights shipped to them, and TMA's weighted mean counts live submissions only, each weighted by
its trainer's train nodes under pipeline.weighting=train_nodes."""
from __future__ import annotations

import dataclasses
import logging
import pickle
import threading
from types import SimpleNamespace

import dgl
import pytest
import torch

from degnn.entry import compose_config
from degnn.models import GNN
from degnn.pipelines import tma
from degnn.pipelines.lamp import compute, service
from degnn.pipelines.lamp import owners as owners_mod
from degnn.pipelines.lamp.codec import make_codec
from degnn.pipelines.lamp.compute import Owner, Weights
from degnn.pipelines.lamp.graph import LocalGraph
from degnn.pipelines.lamp.halo import HaloSync
from degnn.pipelines.lamp.history import History
from degnn.pipelines.lamp.owners import TrainerOwners
from degnn.pipelines.lamp.pipeline import LAMPPipeline
from degnn.pipelines.tma import TMAPipeline
from degnn.pipelines.tma import service as tma_service
from degnn.pipelines.tma.coordinator import Coordinator
from degnn.pipelines.tma.rounds import RoundLoop
from degnn.runtime.context import RunContext

from test_lamp import _PartitionBook, random_partition
from test_tma_rounds import FakeRounds, InProcessClient

META = {"codec": "minmax", "bits": 32, "fanouts": [-1, -1, -1], "fusion": True, "hidden": 8, "layers": 3,
        "seed": 0, "history_layers": 2}


class _OwnerBook(_PartitionBook):
    """The partition book as machine 1 (the owner of test_lamp's halo nodes, global ids >= 50)
    sees it: its local id of a global id is the global id (a table over every node)."""
    partid = 1


# --- LAMP: the halo sync ----------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [None, 1.0], ids=["since", "budget"])
@pytest.mark.parametrize("bits", [8, 32])
@pytest.mark.parametrize("answerers", [1, 2])
def test_a_halo_sync_stores_the_owners_rows_and_stamps_in_the_machines_histories(budget, bits, answerers):
    """A whole halo sync as a trainer runs it (HaloSync.plan -> the owners' answers ->
    LAMPPipeline._store_sync -> the engine's store_halo): afterwards the machine's history rows of
    every halo node are the owner's rows, the same packed codes and the same stamps, every table.
    Two answerers for the owner machine (engine=server: several graph servers): each row is the
    newest of the two answers."""
    _, part = random_partition(n=80, n_inner=50, avg_deg=5, seed=0)
    lg = LocalGraph.from_partition(part)
    model = GNN("sage", 5, 8, 4, 3, dropout=0.0)
    meta = dict(META, bits=bits)
    codec = make_codec("minmax", 8, bits)
    eng = TrainerOwners(None, lg, torch.zeros(50, 5), torch.zeros(lg.num_nodes, 5),
                        torch.zeros(lg.num_nodes, dtype=torch.bool), model, meta, _PartitionBook(), [0, 1],
                        {0: 0, 1: 1}, rank=0, group=None)
    owners = eng if answerers == 1 else SimpleNamespace(answerers=lambda m: [m, m + 10], store_halo=eng.store_halo)
    mine = eng.owner.history
    # machine 1's histories (one a answerer) over global ids: rows of its own nodes, stamped 3 ..
    # (written since the last sync), the two answerers' stamps apart (even and odd)
    theirs = {}
    gen = torch.Generator().manual_seed(1)
    for k, a in enumerate(owners.answerers(1)):
        theirs[a] = History(80, 2, codec)
        for layer in (1, 2):
            stamp = 3 + 2 * torch.randint(0, 4, (80,), generator=gen) + k
            theirs[a].push_packed(layer, torch.arange(80), codec.encode(torch.randn(80, 8, generator=gen), gen), stamp)
    halo = HaloSync(lg, _PartitionBook(), 2, seed=0, budget=budget, since_margin=0, codec=codec)
    assert len(halo.gid) > 5 and bool((halo.gid >= 50).all())
    for layer in (1, 2):  # nothing there before the sync
        assert bool((mine.pull_packed(layer, halo.local)[1] == -1).all())
    step = 4
    asks = halo.plan(step, roots=10 * len(halo.gid), answerers=owners.answerers)
    assert sorted(a for a, _ in asks) == sorted(theirs)
    answers = {a: compute.history_rows(theirs[a], pull, _OwnerBook()) for a, pull in asks}
    LAMPPipeline._store_sync(SimpleNamespace(halo=halo, owners=owners, me=0, step_no=step), answers)
    assert halo.pending is None and halo.rows == 2 * len(halo.gid)
    for layer in (1, 2):
        got, got_stamp = mine.pull_packed(layer, halo.local)
        pulled = [theirs[a].pull_packed(layer, halo.gid) for a in sorted(theirs)]
        want, want_stamp = pulled[0]
        if len(pulled) == 2:  # the newer of the two rows
            newer = pulled[1][1] > want_stamp
            assert bool(newer.any()) and not bool(newer.all())
            want = tuple(torch.where(newer.view(-1, *[1] * (w.dim() - 1)), v, w) if w.numel() else w
                         for w, v in zip(want, pulled[1][0]))
            want_stamp = torch.maximum(want_stamp, pulled[1][1])
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


@pytest.mark.parametrize("engine", ["owner", "trainer", "server"])
@torch.no_grad()
def test_owners_answer_with_the_newest_weights_shipped(engine, monkeypatch):
    """An owner shipped W1 then W2 answers roots with exactly what exact inference with W2 gives
    (32 bits, full fan-outs, histories holding W2's exact rows), not W1's; its version is W2's.
    engine=trainer: through TrainerOwners.ship_weights and the round that loads them; engine=server:
    through the graph server's SetWeights request."""
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
    elif engine == "server":
        owner = Owner(lg, feat, halo_x, torch.zeros(lg.num_nodes, dtype=torch.bool), replica, meta,
                      History(lg.num_nodes, 1, make_codec("minmax", 8, 32)))
        monkeypatch.setattr(service, "STATE", service._ServerState())
        service.STATE.owner = owner
        for w in (_weights(w1, 1), _weights(w2, 2)):
            assert service.SetWeightsRequest(w).process_request(None).error == ""
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
    assert torch.allclose(got, exact2[2][lg.nid[roots]], atol=1e-5), "the answers are not W2's exact h^(2)"


@pytest.mark.parametrize("bits,codec_name", [(32, "minmax"), (8, "minmax"), (4, "minmax"), (8, "absmax")])
@torch.no_grad()
def test_owners_answer_a_batchs_remote_neighbours_with_the_layers_computed_from_their_own_graph(bits, codec_name):
    """A 4-layer model; a batch of machine 1's seeds whose in-neighbours machine 0 owns: machine
    0's owner answers h^(3) of those roots, and that is the whole graph's layers 1..3 at those
    nodes, computed from machine 0's features, its halo nodes' features and, for the halo nodes
    at layers 1 and 2, the rows its histories hold (decoded), within one codec step a value of
    the answer's row (exact at 32 bits). The rows it writes back for its boundary nodes are their
    h^(1), h^(2) (within a step), stamped with its weights' version."""
    whole, part = random_partition(n=80, n_inner=50, avg_deg=5, seed=3)
    lg = LocalGraph.from_partition(part)
    torch.manual_seed(0)
    x = torch.randn(whole.num_nodes(), 5)
    model = GNN("sage", 5, 8, 4, 4, dropout=0.0).eval()
    exact = [x]
    for i in range(3):
        exact.append(model.layer_forward(i, whole, exact[-1]))
    codec = make_codec(codec_name, 8, bits)
    hist = History(lg.num_nodes, 2, codec)
    halo = ~lg.inner
    for layer in (1, 2):  # the halo rows machine 0 holds (as a sync or the set-up left them)
        hist.push(layer, torch.nonzero(halo).flatten(), exact[layer][lg.nid[halo]], version=0)
    halo_x = torch.zeros(lg.num_nodes, 5)
    halo_x[halo] = x[lg.nid[halo]]
    boundary = lg.inner.clone()
    owner = Owner(lg, x[lg.nid[lg.inner]], halo_x, boundary, model,
                  dict(META, layers=4, fanouts=[-1] * 4, history_layers=2, codec=codec_name, bits=bits), hist)
    owner.load(_weights(model, 7))
    # a batch of machine 1's seeds (global ids >= 50): the roots are their in-neighbours machine 0 owns
    seeds = torch.arange(50, 80)[:12]
    src, _ = whole.in_edges(seeds)
    roots = torch.unique(src[src < 50])
    assert len(roots) > 5
    # the reference: the whole graph's layers, the halo nodes' rows at layers 1 and 2 as machine 0 holds them
    halo_gid = lg.nid[halo]
    h = x
    for i in range(3):
        if i > 0:
            h = h.clone()
            h[halo_gid] = hist.pull(i, torch.nonzero(halo).flatten(), 0)[0]
        h = model.layer_forward(i, whole, h)
        if i < 2:
            fresh = h
    want = h[roots]
    [ans] = owner.answer([roots])  # machine 0: local id = global id of its own nodes
    got = codec.decode(ans.rows)
    if bits == 32:
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    else:
        step = ans.rows[1].float()[:, None]  # the codec's step of each answer row (its scale)
        assert bool(((got - want).abs() <= step * (1 + 1e-3) + 1e-5).all()), ((got - want).abs() / step).max()
        assert not torch.allclose(got, want, atol=1e-6)  # (the rows went through the codec)
    assert ans.version == 7
    # the write-back: the boundary nodes' h^(1), h^(2), stamped with the weights' version
    for layer, ref in ((1, exact[1]), (2, fresh)):
        ids = torch.nonzero(boundary & (hist.stamp[layer - 1] == 7)).flatten()
        assert len(ids) > 5, f"layer {layer}: nothing written back"
        rows, age = hist.pull(layer, ids, 10)
        assert bool((age == 3).all()), f"layer {layer}: ages {age.unique()}"
        tol = 1e-5 if bits == 32 else hist.rows[layer - 1][1][ids].float()[:, None] * (1 + 1e-3) + 1e-5
        assert bool(((rows - ref[ids]).abs() <= tol).all()), f"layer {layer}: written-back rows"


# --- TMA: the weighted mean -------------------------------------------------------------------------
def _submit(c, r, rank, theta, weight, now):
    return c.submit(r, rank, torch.tensor(theta), {"weight": weight, "stats": {"loss": 0.5, "round_steps": 1}}, now)


def test_a_dead_trainers_submission_and_weight_leave_the_mean():
    """Ranks 0, 1, 2 weighted 1, 3, 4. Rank 2 submits round 1 and then nothing: round 2 closes at
    its deadline without it and every live trainer gets the weighted mean of ranks 0 and 1 only
    (exact numbers); round 3, with rank 2 already counted dead, the same."""
    c = Coordinator([0, 1, 2], round_timeout_s=5, start_timeout_s=60, evaluator_timeout_s=10)
    _submit(c, 1, 0, [2.0, -1.0], 1.0, 0.0)
    _submit(c, 1, 1, [6.0, 5.0], 3.0, 0.0)
    _submit(c, 1, 2, [100.0, 100.0], 4.0, 0.0)
    assert torch.equal(c.poll_mean(1, 0, 0.0)[1], torch.tensor([(2 + 18 + 400) / 8, (-1 + 15 + 400) / 8]))
    # round 2: rank 2 is silent
    _submit(c, 2, 0, [2.0, -1.0], 1.0, 10.0)
    _submit(c, 2, 1, [6.0, 5.0], 3.0, 10.0)
    assert c.poll_mean(2, 0, 14.9)[0] == "wait"
    for rank in (0, 1):
        status, mean, meta = c.poll_mean(2, rank, 15.1)
        assert status == "mean" and meta["dead"] == [2] and meta["contributors"] == [0, 1]
        assert torch.equal(mean, torch.tensor([(2 + 18) / 4, (-1 + 15) / 4])), f"round 2, rank {rank}: {mean}"
    # round 3: closes without waiting for the dead one, its last submission nowhere in the mean
    _submit(c, 3, 0, [0.0, 4.0], 1.0, 20.0)
    _submit(c, 3, 1, [8.0, 0.0], 3.0, 20.0)
    for rank in (0, 1):
        status, mean, meta = c.poll_mean(3, rank, 20.0)
        assert status == "mean" and torch.equal(mean, torch.tensor([24 / 4, 4 / 4])), f"round 3, rank {rank}: {mean}"


def _tma_trainer(monkeypatch, tmp_path, rank, n_train, weighting, world=3):
    """A TMAPipeline set up on rank `rank` of `world` without a cluster: its local data (n_train
    train nodes), task and evaluation are stand-ins; the rest of `setup` is TMA's own."""
    cfg = compose_config(["pipeline=tma", "dataset=synthetic-tiny", "train.tensorboard=false",
                          f"pipeline.weighting={weighting}"])
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    graph = dgl.graph(([], []), num_nodes=max(n_train, 1))
    graph.ndata["feat"] = torch.zeros(graph.num_nodes(), 3)
    monkeypatch.setattr(tma, "build_local_data", lambda g, part_config, log, task: SimpleNamespace(
        graph=graph, train_ids=torch.arange(n_train), edges_total=0))
    monkeypatch.setattr(tma, "SharedEvaluation", lambda *a, **kw: SimpleNamespace(
        plan=lambda: {"homes": list(range(world)), "phases": 2}))
    task = SimpleNamespace(prepare=lambda ctx, collective: None, local_loader=lambda g, ids, bs: None,
                           local_labels=lambda g: None, evaluate_fn=lambda: None, describe=lambda: "fake",
                           unit="nodes", build_model=lambda in_dim: torch.nn.Linear(in_dim, 1, bias=False))
    graph_store = SimpleNamespace(get_partition_book=lambda: SimpleNamespace(partid=rank))
    ctx = RunContext(cfg=cfg, run_dir=tmp_path, rank=rank, world_size=world, local_rank=0, machines=world,
                     part_config=tmp_path, graph=graph_store, log=logging.getLogger(f"tma{rank}"))
    p = TMAPipeline(ctx, task)
    p.setup()
    return p


@pytest.mark.parametrize("weighting", ["train_nodes", "uniform"])
def test_each_trainer_submits_its_train_nodes_as_its_weight_and_the_mean_is_weighted_by_them(
        monkeypatch, tmp_path, weighting):
    """pipeline.weighting=train_nodes: a TMA trainer's weight (its RoundPlan's, what RoundLoop
    sends in Submit) is its number of train nodes, 1 under uniform; one round of RoundLoop over
    fake pipelines with those plans releases sum(n_i theta_i) / sum(n_i) (theta_i = i + 1)."""
    n = [5, 12, 3]
    plans = [_tma_trainer(monkeypatch, tmp_path, rank, k, weighting).plan for rank, k in enumerate(n)]
    want = [float(k) if weighting == "train_nodes" else 1.0 for k in n]
    assert [pl.weight for pl in plans] == want
    # one round of the driver with those plans (fake pipelines: round r adds rank + 1)
    tma_service.STATE.clear()
    cfg = compose_config(["pipeline=tma", "dataset=synthetic-tiny", "train.tensorboard=false"])
    lock, results, pipes, drivers = threading.Lock(), {}, [], []
    for rank in range(3):
        ctx = RunContext(cfg=cfg, run_dir=tmp_path, rank=rank, world_size=3, local_rank=0, machines=3,
                         part_config=tmp_path, graph=None, log=logging.getLogger(f"fake{rank}"))
        ctx.counter.declare(TMAPipeline.byte_categories)
        plan = dataclasses.replace(plans[rank], sync_s=0.01, limit_s=0.01, active=[0, 1, 2], trains=True,
                                   homes=[0, 1, 2], phases=2, corrects=False, eval_every=1, round_timeout_s=5.0,
                                   evaluator_timeout_s=5.0, round_bytes=24)
        pipes.append(FakeRounds(ctx, lambda p, plan=plan: plan))
        drivers.append(RoundLoop(pipes[-1], InProcessClient(rank, ctx.counter, lock)))
    threads = [threading.Thread(target=lambda k=k: results.update({k: drivers[k].run()})) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and results[0]["status"] == "ok"
    mean = sum(w * (i + 1) for i, w in enumerate(want)) / sum(want)
    for p in pipes:
        assert torch.allclose(p.export_weights(), torch.full((3,), mean)), (weighting, p.export_weights(), mean)


# --- LAMP: the halo sync as the training steps schedule it ------------------------------------------
class _MachineOne:
    """Machine 1's owner (rank 1) on the other end of TrainerOwners' rounds: `exchange` stands for
    the round's two all_to_alls as rank 0 sees them; rank 1 asks nothing and answers each halo-sync
    ask from its histories (global ids, stamped when written) through compute.history_rows."""

    def __init__(self, codec):
        self.history = History(80, 2, codec)
        self.asked = None

    def exchange(self, out):
        if self.asked is None:  # the asks: what rank 0 sends to 1 is kept, rank 1 sends nothing
            self.asked, incoming = out[1], [out[0], b""]
            return incoming
        sections, self.asked = (pickle.loads(self.asked) if self.asked else {}), None
        answer = {}
        if "sync" in sections:
            pull = owners_mod.unpack_section("sync", sections["sync"], owners_mod.ASKED)
            answer["sync"] = owners_mod.pack_section("sync", compute.history_rows(self.history, pull, _OwnerBook()))
        return [out[0], pickle.dumps(answer) if answer else b""]


@pytest.mark.parametrize("budget", [None, 0.5], ids=["since", "budget"])
def test_training_steps_schedule_the_halo_sync_and_each_halo_row_carries_the_step_it_was_computed_at(budget):
    """Steps of LAMPPipeline (`_complete` of each batch, `_after_step`) over TrainerOwners' rounds,
    machine 1's owner rewriting its rows at every step, each stamped with the version of its
    weights (the step, up to 2 behind): every halo_sync_steps steps a sync goes out with the next
    round, and then the machine's halo rows are the owner's rows of that round, as sent, their
    stamps the owner's (their age `now - stamp`). Under a sync budget each sync refreshes budget x
    roots rows, those synced longest ago first, until every row has been refreshed; with none,
    every row at every sync."""
    every, roots_per_step, steps = 3, 10, 16
    _, part = random_partition(n=80, n_inner=50, avg_deg=5, seed=0)
    lg = LocalGraph.from_partition(part)
    codec = make_codec("minmax", 8, 8)
    model = GNN("sage", 5, 8, 4, 4, dropout=0.0)
    eng = TrainerOwners(None, lg, torch.zeros(50, 5), torch.zeros(lg.num_nodes, 5),
                        torch.zeros(lg.num_nodes, dtype=torch.bool), model, dict(META, layers=4, bits=8),
                        _PartitionBook(), [0, 1], {0: 0, 1: 1}, rank=0, group=None)
    eng.counter = SimpleNamespace(add=lambda cat, n: None)
    one = _MachineOne(codec)
    eng._exchange = one.exchange
    halo = HaloSync(lg, _PartitionBook(), 2, seed=0, budget=budget, since_margin=0, codec=codec)
    n = len(halo.gid)
    p = LAMPPipeline.__new__(LAMPPipeline)
    p.cfg = SimpleNamespace(pipeline=SimpleNamespace(halo_sync_steps=every, weight_sync_steps=10 ** 6),
                            model=SimpleNamespace(hidden=8))
    p.owners, p.halo, p.codec, p.me, p.tables, p.leader, p.push, p.prefetch = eng, halo, codec, 0, 2, True, False, 0
    p.step_no, p.weights_version, p.boundary = 0, 0, torch.zeros(lg.num_nodes, dtype=torch.bool)
    p.stats, p.owner_grads = {"roots": 0, "owner_grad_rows": 0}, {}
    mine = eng.owner.history
    gen = torch.Generator().manual_seed(2)
    syncs, last = 0, torch.full((2, n), -1, dtype=torch.int64)
    synced_at = torch.full((2, n), -1, dtype=torch.int64)  # the round that last brought each row
    for step in range(steps):
        # machine 1's owner computes fresh rows of its nodes (its answers' write-back), stamped
        # with its weights' version
        sent = {}
        for layer in (1, 2):
            version = (step - torch.randint(0, 3, (80,), generator=gen)).clamp(min=0)
            one.history.push_packed(layer, torch.arange(80), codec.encode(torch.randn(80, 8, generator=gen), gen),
                                    version)
            sent[layer] = one.history.pull_packed(layer, halo.gid)
        synced = halo.pending is not None  # asked at the end of the last step: goes with this round
        batch = SimpleNamespace(ticket=eng.ask([]), top_gid=torch.empty(0, dtype=torch.int64), masks=[], cg=None,
                                x=None, x_leaves=None, top_rows=None)
        LAMPPipeline._complete(p, batch)
        stamps = torch.stack([mine.pull_packed(layer, halo.local)[1] for layer in (1, 2)])
        if not synced:
            assert torch.equal(stamps, last), f"step {step}: halo rows changed without a sync"
            last = stamps
        else:
            syncs += 1
            new = stamps != last  # (the owner's stamps grow by at least 1 between two syncs)
            if budget is None:
                assert bool(new.all()), f"step {step}: not every halo row came"
            else:
                assert int(new.sum()) == min(2 * n, int(budget * roots_per_step * every)), f"step {step}"
                assert synced_at[new].max() <= synced_at[~new].min(), f"step {step}: a row synced longer ago was left"
            synced_at[new] = step
            last = stamps
            for t, layer in enumerate((1, 2)):  # the owner's rows and stamps of this round, as sent
                got, got_stamp = mine.pull_packed(layer, halo.local[new[t]])
                idx = torch.nonzero(new[t]).flatten()
                want, want_stamp = codec.take(sent[layer][0], idx), sent[layer][1][idx]
                assert torch.equal(got_stamp, want_stamp), f"step {step}, layer {layer}: stamps"
                assert all(torch.equal(g, w) for g, w in zip(got, want)), f"step {step}, layer {layer}: rows"
                age = mine.pull(layer, halo.local[new[t]], step + 5)[1]
                assert torch.equal(age, step + 5 - want_stamp), f"step {step}, layer {layer}: ages"
        p.stats["roots"] += roots_per_step
        LAMPPipeline._after_step(p, None, [])
    assert syncs == steps // every, f"{syncs} halo syncs in {steps} steps of halo_sync_steps={every}"
    assert bool((last >= 0).all()), "halo rows never refreshed"


# --- distdgl: the sampled blocks and the pulled features --------------------------------------------
class _Recorder(torch.nn.Module):
    """Stands for the DDP model in DistDGLPipeline._step: keeps the blocks and inputs it is given."""

    def __init__(self, classes):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.classes, self.seen = classes, []

    def forward(self, blocks, x):
        self.seen.append((blocks, x))
        return torch.zeros(blocks[-1].num_dst_nodes(), self.classes) + self.w


@pytest.mark.parametrize("prefetch,pull", [(0, False), (2, False), (2, True)], ids=["sync", "prefetch", "prefetch-pull"])
def test_distdgl_steps_get_blocks_within_the_fanouts_and_the_rows_a_direct_pull_gives(prefetch, pull, tmp_path,
                                                                                     monkeypatch):
    """DistDGLPipeline's batches (`batches_of`: synchronous, or the prefetch thread's, pulling the
    rows too with prefetch_pull) through `_step`, over a graph whose in-degrees exceed the fan-outs
    and the task's dist_loader (its NeighborSampler of model.fanouts; DGL's DataLoader over a local
    graph stands for DistNodeDataLoader, which needs graph servers): every block
    has at most its layer's fan-out of in-edges a destination (exactly that many where the
    graph has more), its edges are the graph's, and the model gets, for the batch it trains on,
    the input nodes' feature rows, as a direct pull of those rows gives them."""
    from degnn.pipelines.distdgl import DistDGLPipeline
    from degnn.tasks import node, task_of

    fanouts = [3, 5]
    cfg = compose_config(["dataset=synthetic-tiny", "train.tensorboard=false", f"model.fanouts=[{fanouts[0]},{fanouts[1]}]",
                          f"pipeline.prefetch={prefetch}", f"pipeline.prefetch_pull={str(pull).lower()}"])
    gen = torch.Generator().manual_seed(0)
    g = dgl.to_simple(dgl.graph((torch.randint(300, (9000,), generator=gen), torch.randint(300, (9000,), generator=gen))))
    torch.manual_seed(0)
    feat, label = torch.randn(300, 4), torch.randint(0, 3, (300,))
    task = task_of(cfg)
    task.label = label
    ctx = RunContext(cfg=cfg, run_dir=tmp_path, rank=0, world_size=1, local_rank=1, machines=1,
                     part_config=tmp_path, graph=None, log=logging.getLogger("distdgl"))
    p = DistDGLPipeline(ctx, task)
    p.prefetch, p.prefetch_pull, p.keep_prefetch, p.feat, p.cache = prefetch, pull, prefetch > 0, feat, None
    p._rpc, p._prefetcher, p._batch_iter, p.rows = threading.Lock(), None, None, {"cached": 0, "pulled": 0}
    p.background = {"sampling": 0.0, "pull": 0.0, "batches": 0}
    p.pb = SimpleNamespace(partid=0, nid2partid=lambda ids: torch.zeros_like(ids))
    p.feat_row_bytes, p.allreduce_bytes = 16, 0
    p.ddp = _Recorder(3)
    p.optimize = lambda loss: float(loss.detach())
    monkeypatch.setattr(node, "DistNodeDataLoader", dgl.dataloading.DataLoader)
    p.loader = task.dist_loader(g, torch.arange(112), 16)
    batches = []
    for item in p.batches_of(0):
        batches.append(item[0] if pull else item)
        p.step(item)
    assert len(batches) == len(p.ddp.seen) == 112 // 16
    src_all, dst_all = g.edges()
    edges = set(zip(src_all.tolist(), dst_all.tolist()))
    indeg = g.in_degrees()
    for (input_nodes, seeds, blocks), (seen_blocks, x) in zip(batches, p.ddp.seen):
        # the batch's own blocks (the device mover rebuilds the list; on the CPU it copies nothing)
        assert len(seen_blocks) == len(blocks) and all(a is b for a, b in zip(seen_blocks, blocks))
        assert torch.equal(x, feat[input_nodes]), "the model's inputs are not the batch's input rows"
        for k, block in enumerate(blocks):
            deg = block.in_degrees()
            dst = block.dstdata[dgl.NID]
            assert int(deg.max()) <= fanouts[k], f"block {k}: {int(deg.max())} in-edges > fan-out {fanouts[k]}"
            assert torch.equal(deg, indeg[dst].clamp(max=fanouts[k])), f"block {k}: not min(fan-out, in-degree)"
            s, d = block.edges()
            assert set(zip(block.srcdata[dgl.NID][s].tolist(), dst[d].tolist())) <= edges
