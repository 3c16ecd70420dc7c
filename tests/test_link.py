"""Link prediction (dataset.task=link): the evaluator chosen by task, the split carried with the
partitions (no evaluation edge in any partition's graph, the same candidates whatever the
partition), one negative per positive in training and 1000 in evaluation, the decoder and MRR
scoring, the launcher's refusal of a pipeline without link support, and one 2-machine netns
cluster running distdgl and then RandomTMA on a tiny link graph."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dgl
import pytest
import torch
from omegaconf import OmegaConf

from netns_support import needs_netns

from degnn.data import load_dataset
from degnn.data.evaluate import reciprocal_ranks
from degnn.models import LinkModel, build_link_model
from degnn.tasks import task_of
from degnn.tasks.link import LinkSplitError, LinkTask, link_scores, load_link_split, local_edge_loader

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _ds(root, **kw):
    base = dict(name="synthetic-tiny-link", kind="synthetic", task="link", root=str(root), num_nodes=2000,
                num_classes=8, feat_dim=128, avg_degree=7.0, homophily=0.5, feat_noise=1.0, to_bidirected=True,
                seed=0)
    return {**base, **kw}


@pytest.fixture(scope="module")
def tiny_link(tmp_path_factory):
    return load_dataset(_ds(tmp_path_factory.mktemp("data")))


def _model_cfg(**kw):
    return OmegaConf.create({"name": "sage", "layers": 2, "hidden": 16, "fanouts": [5, 5], "dropout": 0.0,
                             "heads": 4, **kw})


def dataset_evaluator(dataset: dict):
    """The metric the task of a dataset config evaluates with."""
    return task_of(OmegaConf.create({"dataset": dataset, "model": _model_cfg()})).evaluate_fn()


def test_dataset_evaluator_chooses_by_task_and_refuses_the_rest():
    acc = dataset_evaluator({"name": "wordnet", "kind": "wordnet", "task": "node"})
    assert acc(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 0, 4])) == 0.75
    assert dataset_evaluator({"name": "ogbn-products", "kind": "ogb", "task": "node"}) is not None
    for link in ({"name": "wordnet-link", "kind": "wordnet", "task": "link"},
                 {"name": "ogbl-citation2", "kind": "ogb", "task": "link"},
                 {"name": "mine", "kind": "custom", "task": "link"}):
        mrr = dataset_evaluator(link)
        assert mrr(torch.ones(3), torch.zeros(3, 1000)) == 1.0  # every positive ranked first
    with pytest.raises(ValueError, match="ogbl-collab"):
        dataset_evaluator({"name": "ogbl-collab", "kind": "ogb", "task": "link"})
    with pytest.raises(ValueError, match="dataset.task='graph'"):
        dataset_evaluator({"name": "x", "kind": "custom", "task": "graph"})


def test_partitions_carry_the_split_and_hold_no_evaluation_edge(tiny_link, tmp_path):
    """Whatever the partition method, link_split.pt holds the dataset's held-out edges and
    negatives (renumbered like the partition), and no partition's graph (what the servers sample
    from and TMA trainers train on) holds a held-out edge in either direction."""
    from partitioners import is_complete, partition_graph

    split = tiny_link.link_split
    held = set()
    for p in ("valid", "test"):
        for u, v in zip(split[p]["source_node"].tolist(), split[p]["target_node"].tolist()):
            held.update({(u, v), (v, u)})
    for method in ("random", "metis"):
        jpath = partition_graph(tiny_link.graph, method, 2, tmp_path / method, "tl", link_split=split)
        orig = torch.load(jpath.parent / "orig_nids.pt")
        carried = load_link_split(jpath)
        for p in ("valid", "test"):
            for key in ("source_node", "target_node", "target_node_neg"):
                assert torch.equal(orig[carried[p][key]], split[p][key].long()), (method, p, key)
            assert carried[p]["target_node_neg"].shape[1] == 1000
        stats = json.loads((jpath.parent / "stats.json").read_text())
        assert stats["link_num_neg"] == 1000 and stats["link_eval_edges"]["valid"] == len(split["valid"]["source_node"])
        for i in range(2):
            part = dgl.distributed.load_partition(str(jpath), i)[0]
            src, dst = part.edges()
            gid = part.ndata[dgl.NID]
            pairs = zip(orig[gid[src]].tolist(), orig[gid[dst]].tolist())
            assert not any(pair in held for pair in pairs)
        assert is_complete(jpath.parent)
    (jpath.parent / "link_split.pt").unlink()
    assert not is_complete(jpath.parent)  # a link partition without its split is not one
    with pytest.raises(LinkSplitError, match="link_split.pt missing"):
        load_link_split(jpath)


def test_training_batches_have_one_negative_per_positive_and_the_model_learns_from_them(tiny_link):
    g = tiny_link.graph
    torch.manual_seed(0)
    model = build_link_model(_model_cfg(), g.ndata["feat"].shape[1])
    loader = local_edge_loader(g, torch.arange(g.num_edges()), [5, 5], 256)
    batch = next(iter(loader))
    input_nodes, pos, neg, blocks = batch
    task = LinkTask(OmegaConf.create({"dataset": {"name": "tl", "kind": "synthetic"}, "model": _model_cfg()}))
    task.observe(batch)
    assert pos.num_edges() == 256 and neg.num_edges() == 256 and task.info["train_neg_per_pos"] == 1.0
    # negatives keep the positive's source (Uniform corrupts the destination)
    assert torch.equal(pos.ndata[dgl.NID][pos.edges()[0]], neg.ndata[dgl.NID][neg.edges()[0]])
    loss = task.batch_loss(model, batch, g.ndata["feat"])
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())


def test_link_scores_rank_each_edge_among_its_negatives():
    torch.manual_seed(0)
    model = build_link_model(_model_cfg(), 8)
    assert isinstance(model, LinkModel) and model.num_layers == 2
    h = torch.randn(50, 16)
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])
    negs = torch.randint(0, 50, (3, 1000))
    pos_s, neg_s = link_scores(model.decoder, h, src, dst, negs)
    with torch.no_grad():
        assert torch.allclose(pos_s, model.decoder(h[src], h[dst]))
        brute = torch.stack([model.decoder(h[src[i]].expand(1000, 16), h[negs[i]]) for i in range(3)])
    assert neg_s.shape == (3, 1000) and torch.allclose(neg_s, brute, atol=1e-6)
    rr = reciprocal_ranks(pos_s, neg_s)
    expect = 1 / (1 + (neg_s > pos_s[:, None]).sum(1) + 0.5 * (neg_s == pos_s[:, None]).sum(1))
    assert torch.allclose(rr.float(), expect.float(), atol=1e-6)


def test_a_pipeline_without_the_link_task_is_refused_naming_the_ones_with_it():
    """Every pipeline here trains link prediction; one that declares node classification only is
    refused in one line that names them all."""
    from degnn.config import CONF_DIR
    from degnn.entry import compose_config
    from degnn.pipelines import check_task
    from degnn.pipelines.base import Pipeline

    class NodeOnly(Pipeline):
        name, tasks = "node-only", ("node",)

    with pytest.raises(ValueError) as e:
        check_task(NodeOnly, compose_config(["dataset=wordnet-link"]), [CONF_DIR])
    msg = str(e.value)
    assert "\n" not in msg and "pipeline=node-only trains node classification only" in msg, msg
    assert all(f"pipeline={name}" in msg for name in ("distdgl", "lamp", "tma")), msg


def test_batches_per_epoch_is_checked_before_anything_starts():
    from degnn.launch.plan import LaunchError
    from degnn.launch.preflight import check_config
    from degnn.entry import compose_config

    from degnn.pipelines import check_trainers, pipeline_class

    for name, shortens in (("distdgl", True), ("lamp", True), ("tma", False)):
        cfg = compose_config([f"pipeline={name}", "train.batches_per_epoch=15"])
        check_config(cfg)
        if shortens:
            check_trainers(pipeline_class(cfg), cfg)
        else:  # what the pipeline declares (Pipeline.shortens_epochs), checked by the launcher
            with pytest.raises(ValueError, match="does not shorten its epochs"):
                check_trainers(pipeline_class(cfg), cfg)
    with pytest.raises(LaunchError, match="train.batches_per_epoch=-1"):
        check_config(compose_config(["pipeline=distdgl", "train.batches_per_epoch=-1"]))


# ---- a real 2-machine cluster ----------------------------------------------------------------------------
@needs_netns
def test_two_machines_train_links_with_distdgl_then_random_tma(tmp_path):
    """distdgl (DistEdgeDataLoader through the servers, DDP) and RandomTMA (each trainer on its own
    subgraph's edges) on synthetic-tiny-link, 2 netns machines: both train, rank the held-out edges
    against the same 1000 negatives each, and beat chance (MRR about 0.0075 with 1000 negatives)."""
    common = ["dataset=synthetic-tiny-link", f"dataset.root={tmp_path / 'data'}", f"partition.root={tmp_path / 'parts'}",
              "cluster=netns", "cluster.machines=2", "model.hidden=32", "model.dropout=0", "train.lr=0.01",
              "train.batch_size=256"]
    # distdgl with the loader that pulls too (the node-task test runs the default, sampling only)
    runs = {"distdgl": ["pipeline=distdgl", "train.epochs=3", "train.batches_per_epoch=25", "pipeline.prefetch_pull=true"],
            "tma": ["pipeline=tma", "pipeline.variant=random", "pipeline.time_limit_s=6", "pipeline.sync_every_s=3"]}
    summaries = {}
    for name, extra in runs.items():
        run_dir = tmp_path / name
        r = subprocess.run([PY, "-m", "degnn.launch", *common, *extra, f"hydra.run.dir={run_dir}"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (name, r.stdout[-2000:], r.stderr[-3000:])
        s = summaries[name] = json.loads((run_dir / "summary.json").read_text())
        assert s["status"] == "ok" and s["task"] == "link" and s["metric"] == "mrr", s
        assert s["train_neg_per_pos"] == 1.0 and s["eval_num_neg"] == 1000, s
        # chance is 0.0075 +- 0.0015 on these 675 edges: 0.012 is three standard deviations above
        assert s["best_val"] > 0.012 and s["test"] is not None, s
        assert "metric=mrr" in r.stdout
    d, t = summaries["distdgl"], summaries["tma"]
    assert d["epochs"] == 3 and d["batches"] == 3 * 25 * 2  # epochs of 25 batches per trainer
    assert d["prefetch_pull"] is True and d["prefetch_pull_s_per_batch"] > 0 and d["time_per_batch_s"]["owner_wait"] == 0, d
    # the same held-out edges (and negatives, from the same dataset) for both
    assert d["eval_edges"] == t["eval_edges"] and d["eval_edges"]["valid"] > 0
    # TMA's trainers ranked every held-out edge between them
    assert t["eval_counts"] == {"val": d["eval_edges"]["valid"], "test": d["eval_edges"]["test"]}, t
    # the baseline's byte count includes the edge lookups (within 3% of the wire)
    assert abs(d["app_bytes_per_batch"] - d["net_bytes_per_batch"]) < 0.03 * d["net_bytes_per_batch"], d
    # RandomTMA on 2 parts keeps about half of the edges for training
    assert 0.35 < t["edges_kept_fraction"] < 0.65 and t["rounds"] == 2


# ---- bench=link and its report ---------------------------------------------------------------------------
def test_bench_link_composes_into_valid_runs_under_one_budget():
    import itertools

    from hydra import compose, initialize_config_dir

    from degnn.config import CONF_DIR, register_configs
    from degnn.launch.preflight import check_config
    from degnn.pipelines.tma import TMAPipeline

    from benchmarks.config import compose_bench

    register_configs()
    seen = set()
    bench = compose_bench(["bench=link"])
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        for suite in bench.bench.suites:
            sweeps = [[o] if "[" in o else [f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")]
                      for o in suite.overrides]
            for job in itertools.product(*sweeps):
                cfg = compose("config", overrides=list(job))
                check_config(cfg)
                if cfg.pipeline.name == "tma":
                    OmegaConf.set_struct(cfg, True)
                    TMAPipeline.prepare_launch(cfg, list(job))
                    budget = cfg.pipeline.time_limit_s
                else:
                    budget = cfg.train.time_limit_s
                assert cfg.dataset.task == "link" and cfg.cluster.machines == 4, suite.name
                if cfg.dataset.name == "wordnet-link":
                    assert budget == 45
                    if cfg.pipeline.name == "tma":  # at least 30 averaging rounds in the budget
                        assert budget / cfg.pipeline.sync_every_s >= 30, suite.name
                    seen.add((cfg.pipeline.name, cfg.pipeline.get("variant"), cfg.model.name, cfg.cluster.bandwidth))
                    if cfg.pipeline.name == "lamp":
                        seen.add(("lamp", cfg.model.layers, cfg.cluster.bandwidth))
    for model in ("sage", "gcn"):
        assert ("distdgl", "default", model, "100mbit") in seen
        for variant in ("random", "supernode", "psgd-pa", "llcg"):
            assert ("tma", variant, model, "100mbit") in seen
    assert {("distdgl", "default", "sage", "1gbit"), ("tma", "random", "sage", "1gbit"),
            ("tma", "supernode", "sage", "1gbit")} <= seen
    # LAMP beside them at 2 and 3 layers, both bandwidths
    assert {("lamp", layers, bw) for layers in (2, 3) for bw in ("100mbit", "1gbit")} <= seen


def _fake_run(root, name, curve, **summary):
    d = root / name
    d.mkdir(parents=True)
    base = {"status": "ok", "dataset": "wordnet-link", "task": "link", "metric": "mrr", "machines": 4, "layers": 2,
            "bandwidth": "100mbit", "trainers": 4, "train_time_s": 45.0}
    (d / "summary.json").write_text(json.dumps({**base, **summary}))
    (d / "curve.jsonl").write_text("".join(json.dumps({"train_time_s": t, "val": v}) + "\n" for t, v in curve))


def test_report_has_the_papers_table_1_for_links(tmp_path):
    from benchmarks.report import write_report

    tests = {("distdgl", "sage"): 0.30, ("supernode", "sage"): 0.32, ("random", "sage"): 0.31,
             ("psgd-pa", "sage"): 0.25, ("llcg", "sage"): 0.24, ("distdgl", "gcn"): 0.20, ("random", "gcn"): 0.21}
    kept = {"supernode": 0.68, "random": 0.25, "psgd-pa": 0.93, "llcg": 0.93}
    for i, ((variant, model), test) in enumerate(tests.items()):
        pipe = {"pipeline": "distdgl", "variant": "default"} if variant == "distdgl" else \
            {"pipeline": "tma", "variant": variant, "edges_kept_fraction": kept[variant], "rounds": 5}
        _fake_run(tmp_path, f"r/{i}", [(9, test - 0.05), (45, test)], model=model, best_val=test, test=test,
                  test_final=test, **pipe)
    for i, test in enumerate((0.28, 0.33)):  # two more repeats of distdgl: a cell is their median (min–max)
        _fake_run(tmp_path, f"r/again{i}", [(45, test)], model="sage", best_val=test, test=test, test_final=test,
                  pipeline="distdgl", variant="default")
    for layers, test, net in ((2, 0.29, 3.0e6), (3, 0.295, 3.6e6)):  # LAMP's rows, by layers
        _fake_run(tmp_path, f"r/lamp{layers}", [(45, test)], pipeline="lamp", variant="default", model="sage",
                  layers=layers, best_val=test, test=test, edges_kept_fraction=0.8, net_bytes_per_batch=net,
                  allreduce_bytes_per_batch=1.0e6)
    text = write_report(tmp_path).read_text()
    assert "| LAMP (DEGNN), 2 layers | 0.2900 | – | 0.800 | – |" in text
    assert "| LAMP (DEGNN), 3 layers | 0.2950 | – | 0.800 | – |" in text
    assert "GraphSAGE: LAMP at 3 layers against distdgl (2 layers): -0.50 points of test MRR." in text
    assert "3 layers against 2: 1.30x (bar, at most 1.5x: met)" in text
    assert "## Link prediction: the TMA paper's Table 1" in text
    assert "| method | GraphSAGE | GCN | edges kept | paper |" in text
    assert "| SuperTMA | 0.3200 | – | 0.680 | 0.8375 |" in text
    assert "| RandomTMA | 0.3100 | 0.2100 | 0.250 | 0.8328 |" in text
    assert "| distdgl (synchronous; the paper's GGS) | 0.3000 (0.2800–0.3300) | 0.2000 | 1.000 | 0.8195 |" in text
    assert ("GraphSAGE: SuperTMA ≥ RandomTMA > PSGD-PA holds (test 0.3200 / 0.3100 / 0.2500; "
            "edges kept 0.680 / 0.250 / 0.930)") in text
    assert ("GraphSAGE: best of RandomTMA/SuperTMA (tma/supernode) against distdgl: +2.00 points of test MRR "
            "(bar, at most 1 point below: met)") in text
    # validation MRR against training time, one plot per bandwidth and model
    assert (tmp_path / "tma-curves-wordnet-link-100mbit-sage.png").stat().st_size > 1000


def test_lamp_table_compares_epoch_times_only_with_distdgl_epochs_of_a_whole_pass():
    """bench=link cuts distdgl's epochs to 10 batches (train.batches_per_epoch): such an epoch is
    not a lamp epoch's pass over the training edges, so no epoch-time ratio is given for it."""
    from benchmarks.report import lamp_ablations

    base = {"status": "ok", "dataset": "wordnet-link", "layers": 2, "bandwidth": "1gbit", "trainers": 4}
    lamp = {**base, "pipeline": "lamp", "prefetch": 1, "_rel": "lamp-L2/0", "batches": 400, "epochs": 1,
            "epoch_times_s": [10.0]}
    cut = {**base, "pipeline": "distdgl", "_rel": "distdgl-1gbit/0", "batches": 160, "epochs": 4,
           "epoch_times_s": [1.5, 1.5, 1.5, 1.5]}
    whole = {**cut, "batches": 1600, "epoch_times_s": [15.0] * 4}
    row = lambda runs: next(line for line in lamp_ablations(runs) if line.startswith("| lamp-L2"))  # noqa: E731
    assert "| – / 10.00 | – |" in row([lamp, cut])
    assert "| 15.00 / 10.00 | **1.50x** |" in row([lamp, whole])
