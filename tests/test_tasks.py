"""The task objects (degnn/tasks) carry every difference between node classification and link
prediction: no pipeline module asks which task it trains (an AST check over degnn/pipelines), and
the methods a pipeline asks instead give what it needs (LAMP's own ids, batches, labels, encoder
and loss; TMA's local labels). No cluster: partitions and partition books are small fakes."""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import dgl
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from degnn.models import GNN, LinkModel, build_link_model
from degnn.pipelines.lamp.graph import LocalGraph
from degnn.pipelines.lamp.pipeline import LampNet
from degnn.tasks.link import NEG_PER_POS, LinkTask, link_loss
from degnn.tasks.node import NodeTask

REPO = Path(__file__).resolve().parents[1]
PIPELINES = REPO / "degnn" / "pipelines"
TASK_CLASSES = {"NodeTask", "LinkTask"}
TASK_NAMES = {"node", "link", "nodes", "edges"}  # the tasks' names and units


# --- no pipeline asks which task it trains -------------------------------------------------------
def _last_name(node) -> str:
    """`task` for `task`, `self.task`, `pipeline.task`; '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_task_name(node) -> bool:
    """`<...>task.name` or `<...>task.unit` (a task's identity), or `<...>dataset.task` (the config's)."""
    if not isinstance(node, ast.Attribute):
        return False
    return ((node.attr in ("name", "unit") and _last_name(node.value) == "task")
            or (node.attr == "task" and _last_name(node.value) == "dataset"))


def _asks(node) -> bool:
    """An expression that tells the tasks apart: a task's name or unit, dataset.task, or a
    task's name as a string."""
    return _is_task_name(node) or (isinstance(node, ast.Constant) and node.value in TASK_NAMES)


def task_questions(source: str, name: str = "<source>"):
    """Where `source` asks which task it trains: a comparison (==, !=, in, is, match) involving a
    task's name or unit or dataset.task, a lookup keyed by one (`{...}[task.name]`), `task.name`
    read at all, or the task classes named (isinstance, imports)."""
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare):
            if any(_asks(o) for o in [node.left, *node.comparators]):
                yield f"{name}:{line}: compares the task ({ast.unparse(node)})"
        elif isinstance(node, ast.Match) and _asks(node.subject):
            yield f"{name}:{line}: matches on the task ({ast.unparse(node.subject)})"
        elif isinstance(node, ast.Subscript) and _is_task_name(node.slice):
            yield f"{name}:{line}: looks up by the task ({ast.unparse(node)})"
        elif isinstance(node, ast.Attribute) and node.attr == "name" and _last_name(node.value) == "task":
            yield f"{name}:{line}: reads the task's name ({ast.unparse(node)})"
        elif isinstance(node, ast.Name) and node.id in TASK_CLASSES:
            yield f"{name}:{line}: names a task class ({node.id})"
        elif isinstance(node, ast.ImportFrom) and any(a.name in TASK_CLASSES for a in node.names):
            yield f"{name}:{line}: imports a task class"


def test_no_pipeline_asks_which_task_it_trains():
    files = sorted(PIPELINES.rglob("*.py"))
    assert len(files) > 10 and PIPELINES / "lamp" / "pipeline.py" in files
    bad = [q for f in files for q in task_questions(f.read_text(), str(f.relative_to(REPO)))]
    assert not bad, "ask the task (a method of degnn/tasks) instead:\n" + "\n".join(bad)


def test_the_check_catches_each_way_of_asking():
    for src in ('self.link = self.task.name == "link"',
                'if task.name != "node":\n    pass',
                'x = pipeline.task.unit == "edges"',
                'if cfg.dataset.task == "node":\n    pass',
                'if "link" in (a, b):\n    pass',
                'f = {"node": a, "link": b}[cfg.dataset.task]',
                'f = table[self.task.name]',
                'name = self.task.name',
                'match self.cfg.dataset.task:\n    case "link":\n        pass',
                'ok = isinstance(task, LinkTask)',
                'from degnn.tasks.node import NodeTask'):
        assert list(task_questions(src)), src
    for src in ('tasks = ("node", "link")',  # what a pipeline declares it trains
                'record = dict(task=cfg.dataset.task, metric=self.task.metric)',
                'log.info("%d train %s", n, task.unit)',
                'loss = self.task.seed_loss(model, h, target)',
                'pipeline = self.pipeline.name == "lamp"'):
        assert not list(task_questions(src)), src


# --- the task methods ------------------------------------------------------------------------------
def _cfg(task="node"):
    return OmegaConf.create({"dataset": {"name": "t", "kind": "synthetic", "task": task},
                             "model": {"name": "sage", "layers": 2, "hidden": 8, "fanouts": [3, 3],
                                       "dropout": 0.0, "heads": 2}})


def _partition():
    """A partition graph as a trainer's DistGraph.local_partition holds it: 6 own nodes (local
    ids 0..5) and 3 halo nodes (6..8), global ids (dgl.NID) 10.., edges into own nodes only."""
    src = torch.tensor([1, 2, 0, 3, 4, 6, 7, 5, 8, 2, 1])
    dst = torch.tensor([0, 0, 1, 2, 3, 3, 4, 4, 5, 5, 5])
    part = dgl.graph((src, dst), num_nodes=9)
    part.ndata["inner_node"] = (torch.arange(9) < 6).int()
    part.ndata[dgl.NID] = torch.arange(9) + 10
    return part


def test_link_own_ids_are_the_own_edges_split_among_the_machines_trainers():
    part = _partition()
    g = SimpleNamespace(local_partition=part)
    task = LinkTask(_cfg("link"))
    shares = [task.own_ids(g, None, i, 2) for i in range(2)]
    src, dst = part.edges()
    own = [(int(s), int(d)) for s, d in zip(src, dst) if s < 6 and d < 6]
    assert len(own) == 8  # the three edges from halo nodes 6, 7, 8 supervise nothing
    got = [tuple(p) for s in shares for p in s.ids.t().tolist()]
    assert sorted(got) == sorted(own) and len(set(got)) == len(got)  # every own edge, once
    for s in shares:  # [2, n] (src, dst), half each; taken from half the partition's 11 edges
        assert s.ids.shape == (2, 4) and s.ids.dtype == torch.int64 and s.pool == 11 / 2
    one = task.own_ids(g, None, 0, 1)
    assert one.ids.shape == (2, 8) and one.pool == 11


def test_link_own_batch_seeds_the_pairs_and_their_negatives_among_own_nodes():
    task = LinkTask(_cfg("link"))
    ids = torch.tensor([[0, 2, 4, 4], [1, 3, 5, 3]])  # four own edges, [2, b]
    owned = torch.tensor([0, 1, 2, 3, 4, 5, 9])
    torch.manual_seed(0)
    seeds, ((ps, pd), (ns, nd)) = task.own_batch(ids, owned, None)
    assert torch.equal(seeds, torch.unique(seeds))  # unique and sorted: each node computed once
    assert torch.equal(seeds[ps], ids[0]) and torch.equal(seeds[pd], ids[1])
    assert len(ns) == len(nd) == NEG_PER_POS * 4
    assert torch.equal(seeds[ns], ids[0].repeat_interleave(NEG_PER_POS))  # the positive's source
    assert bool(torch.isin(seeds[nd], owned).all())  # a destination the machine owns
    assert task.info["train_neg_per_pos"] == NEG_PER_POS


def test_link_loss_of_the_seeds_is_the_decoders_bce_of_the_pairs_and_the_encoder_is_the_gnn():
    torch.manual_seed(0)
    task = LinkTask(_cfg("link"))
    model = build_link_model(_cfg("link").model, 5)
    assert isinstance(model, LinkModel) and task.encoder(model) is model.encoder
    h = torch.randn(6, 8)
    target = ((torch.tensor([0, 1]), torch.tensor([2, 3])), (torch.tensor([0, 1]), torch.tensor([5, 4])))
    want = link_loss(model.decoder(h[[0, 1]], h[[2, 3]]), model.decoder(h[[0, 1]], h[[5, 4]]))
    assert torch.allclose(task.seed_loss(model, h, target), want)
    loss = task.seed_loss(model, h, target)
    loss.backward()
    assert all(p.grad is not None for p in model.decoder.parameters())  # the decoder is trained
    assert task.local_labels(dgl.graph(([0], [1]))) is None  # link batches hold their targets


class _PartitionBook:
    """Machine 0 owns global ids 10..15 (local ids 0..5); machine 1 the rest."""
    partid = 0

    def nid2partid(self, nids):
        return (~((nids >= 10) & (nids < 16))).long()

    def nid2localnid(self, nids, part):
        return nids - 10


def test_node_own_ids_are_local_ids_of_the_machines_training_nodes(monkeypatch):
    task, pb = NodeTask(_cfg()), _PartitionBook()
    g = SimpleNamespace(ndata={"train_mask": None})
    split = {"nids": torch.tensor([11, 14, 15])}
    monkeypatch.setattr(dgl.distributed, "node_split", lambda mask, book, force_even: split["nids"])
    own = task.own_ids(g, pb, 0, 1)
    assert torch.equal(own.ids, torch.tensor([1, 4, 5])) and own.ids.dtype == torch.int64
    assert own.pool is None  # no training node is dropped
    split["nids"] = torch.tensor([11, 20])  # DGL's split handed out another machine's node
    with pytest.raises(RuntimeError, match="another machine"):
        task.own_ids(g, pb, 0, 1)


def test_node_own_batch_is_the_nodes_and_their_labels_and_the_loss_cross_entropy():
    task = NodeTask(_cfg())
    labels = torch.tensor([3, 1, 0, 2, 1, 3], dtype=torch.int32)  # own labels by local id
    ids = torch.tensor([4, 0, 2])
    seeds, y = task.own_batch(ids, torch.arange(6), labels)
    assert torch.equal(seeds, ids)  # the training nodes themselves, in the batch's order
    assert torch.equal(y, torch.tensor([1, 3, 0])) and y.dtype == torch.int64
    h = torch.randn(3, 4)
    assert torch.allclose(task.seed_loss(None, h, y), F.cross_entropy(h, y))
    model = GNN("sage", 5, 8, 4, 2)
    assert task.encoder(model) is model  # no head: the owners replicate the model itself
    local = dgl.graph(([0], [1]))
    local.ndata["label"] = torch.tensor([2, 0])
    assert task.local_labels(local) is local.ndata["label"]


def test_own_labels_are_the_stores_own_rows_or_none():
    own_label = torch.tensor([3, 1, 0, 2, 1, 3])
    label = SimpleNamespace(local_partition=own_label)  # a DistTensor's shared own rows
    g, pb = SimpleNamespace(ndata={"label": label}), _PartitionBook()
    own = torch.arange(10, 16)
    assert NodeTask(_cfg()).own_labels(g, pb, own) is own_label
    assert LinkTask(_cfg("link")).own_labels(g, pb, own) is None


@pytest.mark.parametrize("kind", ["node", "link"])
def test_lampnet_returns_the_tasks_loss_of_its_top_rows(kind):
    """The LAMP trainer's forward with the task's loss: the same number as the task's seed_loss
    of the rows LampNet computes without it (the loss runs inside the DDP forward)."""
    torch.manual_seed(0)
    part = _partition()
    lg = LocalGraph.from_partition(part)
    task = NodeTask(_cfg()) if kind == "node" else LinkTask(_cfg("link"))
    model = GNN("sage", 5, 8, 4, 2, dropout=0.0) if kind == "node" else build_link_model(_cfg("link").model, 5)
    ids = torch.tensor([0, 3, 5]) if kind == "node" else torch.tensor([[0, 2], [1, 3]])
    seeds, target = task.own_batch(ids, torch.arange(6), torch.tensor([0, 1, 2, 3, 0, 1]))
    cg = lg.build(seeds, [-1, -1])
    x = torch.randn(9, 5)
    leaves = [x[cg.leaves[0]], torch.randn(len(cg.leaves[1]), 8)]
    h, _ = LampNet(model)(cg.blocks, x[cg.inner_src[0]], leaves)
    loss, hidden = LampNet(model, task.seed_loss)(cg.blocks, x[cg.inner_src[0]], leaves, target)
    assert loss.dim() == 0 and torch.allclose(loss, task.seed_loss(model, h, target)) and len(hidden) == 1


def test_a_sampled_evaluation_scores_at_most_its_share_of_eval_max_nodes_the_same_each_time():
    """train.eval_max_nodes: each trainer keeps at most its share (the cap over the trainers) of each
    split, drawn from its own nodes once; a split under the share is kept whole; 0 keeps all."""
    from degnn.tasks.node import NodeScorer

    def scorer(limit, rank):
        s = NodeScorer.__new__(NodeScorer)
        s.ctx = SimpleNamespace(cfg=OmegaConf.create({"train": {"eval_max_nodes": limit, "seed": 0}}),
                                world_size=4, rank=rank)
        s.val_nids, s.test_nids, s._sampled = torch.arange(1000, 1100), torch.arange(7), None
        return s

    val, test = scorer(40, 0).sample_splits()
    assert len(val) == 10 and len(torch.unique(val)) == 10 and bool(torch.isin(val, torch.arange(1000, 1100)).all())
    assert torch.equal(val, val.sort().values) and torch.equal(test, torch.arange(7))
    s = scorer(40, 1)
    assert s.sample_splits() is s.sample_splits() and not torch.equal(s.sample_splits()[0], val)  # own draw
    assert torch.equal(scorer(0, 0).sample_splits()[0], torch.arange(1000, 1100))
