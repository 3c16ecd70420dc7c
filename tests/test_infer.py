"""degnn.infer: a finished run's embeddings and predictions, written by every machine of its cluster.

Without a cluster: the one-line refusals (no run directory, no config, a config of another
version, no best model, a damaged one, partitions gone, a key inference does not take) and the
loader (rows by original id, every node exactly once). On a 2-machine netns cluster: a node run
trained, then inferred: the files read back cover every node once, and scoring their predictions
in original ids (OGB's Evaluator) gives the test accuracy the run reported; a link run's embeddings
(an untrained model, no training cluster) rank the test edges as the cluster's own scoring did.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from netns_support import needs_netns
from timing import budget

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


# --- refusals, before anything starts -------------------------------------------------------------
def _run_dir(tmp_path, **changes) -> Path:
    """A run directory as degnn.launch leaves it (config.yaml and best_model.pt), no partitions."""
    from omegaconf import OmegaConf

    from degnn.entry import compose_config

    cfg = OmegaConf.to_container(compose_config(
        ["cluster=netns", "cluster.machines=2", f"partition.root={tmp_path / 'parts'}",
         f"dataset.root={tmp_path / 'data'}"]))
    for dotted, value in changes.items():
        *path, key = dotted.split("__")
        node = cfg
        for p in path:
            node = node[p]
        node[key] = value
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    torch.save({"model": {}, "epoch": 1}, run / "best_model.pt")
    return run


def _refused(capsys, *argv) -> str:
    from degnn.infer.__main__ import main

    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("degnn.infer: error: "), err
    return err


def test_refusals_are_one_line(tmp_path, capsys):
    assert "no such directory" in _refused(capsys, tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no config.yaml" in _refused(capsys, empty)
    run = _run_dir(tmp_path)
    # a run directory whose partitions are gone (or were never built here)
    assert "partitions" in _refused(capsys, run) and "are missing" in _refused(capsys, run)
    assert "inference takes KEY=VALUE for cluster.*" in _refused(capsys, run, "model.hidden=3")
    (run / "best_model.pt").write_bytes(b"not a pickle")
    assert "best_model.pt is damaged" in _refused(capsys, run)
    (run / "best_model.pt").unlink()
    assert "holds no best_model.pt" in _refused(capsys, run)


def test_a_partition_made_elsewhere_needs_its_original_ids(tmp_path, capsys):
    """partition.path (DGL's partition_graph): the ids it renumbered map back only through the
    mapping partition_graph(return_mapping=True) returned, saved beside its JSON."""
    parts = tmp_path / "dgl"
    meta = {"graph_name": "g", "num_parts": 2, "part_method": "metis", "ntypes": {"_N": 0},
            "etypes": {"_N:_E:_N": 0}}
    for i in range(2):
        (parts / f"part{i}").mkdir(parents=True)
        for name in ("node_feat.dgl", "graph.dgl"):
            (parts / f"part{i}" / name).write_bytes(b"")
        meta[f"part-{i}"] = {"node_feats": f"part{i}/node_feat.dgl", "part_graph": f"part{i}/graph.dgl"}
    (parts / "g.json").write_text(json.dumps(meta))
    run = _run_dir(tmp_path, partition__path=str(parts / "g.json"))
    err = _refused(capsys, run)
    assert "orig_nids.pt is missing: a partition made elsewhere renumbers the nodes" in err
    assert "return_mapping=True" in err
    (parts / "g.json").unlink()
    assert "partition.path=" in _refused(capsys, run) and "does not exist" in _refused(capsys, run)


@pytest.mark.parametrize("change", [{"train__epochz": 3}, {"pipeline__name": "oldpipe"},
                                    {"model__hidden": "wide"}])
def test_a_config_of_another_version_is_refused(tmp_path, capsys, change):
    run = _run_dir(tmp_path, **change)
    assert "written by another degnn version" in _refused(capsys, run)


def test_a_run_directory_naming_code_of_its_own_is_refused(tmp_path, capsys, monkeypatch):
    """config.yaml is data: a class or service module it names that is neither degnn's nor declared
    by a pipeline config on the run's search path is not imported (it was: subprocess.Popen)."""
    from omegaconf import OmegaConf

    marker = tmp_path / "imported"
    (tmp_path / "evil_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Thing: pass\n"
                                          f"SERVICES = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = _run_dir(tmp_path, pipeline___target_="evil_mod.Thing")
    err = _refused(capsys, run)
    assert err == (f"degnn.infer: error: {run}/config.yaml names pipeline._target_=evil_mod.Thing, which is "
                   f"neither degnn's nor a pipeline its Hydra search path declares: degnn.infer imports no "
                   f"other code from a run directory; fix pipeline._target_ there")
    (run / "config.yaml").unlink()
    run.rename(tmp_path / "run1")
    run = _run_dir(tmp_path, pipeline__services=["degnn.pipelines.lamp.service", "evil_mod"])
    assert "names the service module evil_mod (pipeline.services), which is neither" in _refused(capsys, run)
    assert not marker.exists()
    # the interpreter an ssh or Slurm run starts on every host: the operator's to name, not the directory's
    (run / "config.yaml").unlink()
    run.rename(tmp_path / "run2")
    run = _run_dir(tmp_path, cluster__python=str(tmp_path / "evil.sh"))
    assert f"sets cluster.python={tmp_path / 'evil.sh'}, the program every host would run" in _refused(capsys, run)
    from degnn.infer.run import InferError, check_code
    # a pipeline of one's own, declared by a config folder on the run's search path, is built
    plugins = Path(__file__).resolve().parent / "plugins" / "conf"
    cfg = OmegaConf.create({"pipeline": {"_target_": "localsgd.LocalSGDPipeline", "services": []}})
    check_code(cfg, run, [f"hydra.searchpath=[file://{plugins}]"])
    with pytest.raises(InferError, match="pipeline._target_=localsgd.LocalSGDPipeline, which is neither"):
        check_code(cfg, run, [])
    with pytest.raises(InferError, match="inside the run directory, on Hydra's search path"):
        check_code(cfg, run, [f"hydra.searchpath=[file://{run}/conf]"])


# --- the loader -----------------------------------------------------------------------------------
def _write_parts(folder: Path, parts, num_nodes: int) -> None:
    from degnn.infer import PART_FILE, SUMMARY

    folder.mkdir(exist_ok=True)
    for i, ids in enumerate(parts):
        ids = torch.tensor(ids)
        torch.save({"orig_ids": ids, "embedding": ids.float().unsqueeze(1).repeat(1, 3), "pred": ids * 10},
                   folder / PART_FILE.format(i))
    (folder / SUMMARY).write_text(json.dumps({"num_nodes": num_nodes, "num_parts": len(parts), "status": "ok"}))


def test_loader_orders_rows_by_original_id(tmp_path):
    from degnn.infer import EmbeddingsError, load_embeddings

    _write_parts(tmp_path / "ok", [[3, 1], [0, 4, 2]], 5)
    assert torch.equal(load_embeddings(tmp_path / "ok", "pred"), torch.tensor([0, 10, 20, 30, 40]))
    assert torch.equal(load_embeddings(tmp_path / "ok")[:, 0], torch.arange(5).float())
    _write_parts(tmp_path / "twice", [[3, 1], [0, 1, 2]], 5)  # node 1 twice, node 4 never
    with pytest.raises(EmbeddingsError, match="1 nodes have no row and 1 more than one"):
        load_embeddings(tmp_path / "twice")
    _write_parts(tmp_path / "gone", [[3, 1], [0, 4, 2]], 5)
    (tmp_path / "gone" / "part1.pt").unlink()
    with pytest.raises(EmbeddingsError, match="part1.pt is missing"):
        load_embeddings(tmp_path / "gone")
    with pytest.raises(EmbeddingsError, match="has no 'logits'"):
        load_embeddings(tmp_path / "ok", "logits")
    # a failed inference: the launcher's summary.json says so, the files are not read
    (tmp_path / "ok" / "summary.json").write_text(json.dumps({"status": "failed", "error": "rank 1 exited 1"}))
    with pytest.raises(EmbeddingsError, match=r"the inference failed \(rank 1 exited 1\)"):
        load_embeddings(tmp_path / "ok")


# --- on a 2-machine netns cluster -----------------------------------------------------------------
TRAIN = [PY, "-m", "degnn.launch", "cluster=netns", "cluster.machines=2", "pipeline=distdgl",
         "train.batch_size=128"]


def _train_and_infer(run_dir: Path, *overrides) -> tuple:
    t0 = time.monotonic()
    r = subprocess.run([*TRAIN, *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO, capture_output=True,
                       text=True, timeout=budget(120))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    t1 = time.monotonic()
    r = subprocess.run([PY, "-m", "degnn.infer", str(run_dir)], cwd=REPO, capture_output=True, text=True,
                       timeout=budget(90))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    print(f"train {t1 - t0:.1f}s, infer {time.monotonic() - t1:.1f}s")
    return json.loads((run_dir / "summary.json").read_text()), r.stdout


def _every_node_once(folder: Path, n: int) -> None:
    ids = torch.cat([torch.load(folder / f"part{i}.pt", weights_only=True)["orig_ids"] for i in range(2)])
    assert len(ids) == n and torch.equal(torch.sort(ids).values, torch.arange(n))
    assert min(len(torch.load(folder / f"part{i}.pt", weights_only=True)["orig_ids"]) for i in range(2)) > 0


@needs_netns
def test_node_predictions_reproduce_the_reported_test_accuracy(tmp_path):
    from degnn.data import load_dataset
    from degnn.data.evaluate import accuracy_evaluator
    from degnn.infer import load_all
    from degnn.infer.run import run_config

    run = tmp_path / "run"
    # the run's own evaluation: the validation and test nodes only, by computation graphs of every
    # in-neighbour (train.eval_fanouts=-1 each): what the layer-wise pass over every node gives them
    s, out = _train_and_infer(run, "dataset=synthetic-tiny", "train.epochs=3", "train.eval_fanouts=[-1,-1]")
    assert s["status"] == "ok" and s["test"] > 0.125 + 0.2 and s["eval_fanouts"] == [-1, -1], s  # it learned
    folder = run / "embeddings"
    data = load_all(folder)
    graph = load_dataset(run_config(run).dataset).graph
    n = graph.num_nodes()
    _every_node_once(folder, n)
    assert data["embedding"].shape == (n, 128) and data["logits"].shape == (n, 8)
    assert torch.equal(data["pred"], data["logits"].argmax(1))
    # summary.json's test is the best validation point's, whose model best_model.pt is: the
    # layer-wise pass over it predicts the same classes, scored in the dataset's own node ids
    test = graph.ndata["test_mask"].bool()
    acc = accuracy_evaluator()(graph.ndata["label"][test], data["pred"][test])
    assert acc == s["test"], (acc, s)
    # in the partition's renumbered ids the same predictions score at chance: the mapping matters
    from degnn.infer.run import run_partitions

    orig = torch.load(run_partitions(run_config(run), run).parent / "orig_nids.pt", weights_only=True)
    assert abs(accuracy_evaluator()(graph.ndata["label"][test], data["pred"][orig][test]) - acc) > 0.1
    info = json.loads((folder / "summary.json").read_text())
    assert info["test"] == s["test"] and info["best_val"] == s["best_val"], info
    assert f"test acc {s['test']:.4f} (the run reported {s['test']:.4f})" in out


@needs_netns
def test_link_embeddings_score_as_the_cluster_scored_them(tmp_path, monkeypatch):
    """A link run's directory made here (its config, an untrained model, its partitions), to keep
    the cluster part to the inference: the written embeddings, in original ids, with the model's
    decoder rank the test edges as the cluster's own scoring of the same pass did."""
    from omegaconf import OmegaConf

    from degnn.data import load_dataset
    from degnn.data.evaluate import mrr_evaluator
    from degnn.entry import compose_config
    from degnn.infer import load_all
    from degnn.models import build_link_model
    from degnn.partition_cache import ensure_partitions
    from degnn.tasks.link import link_scores

    monkeypatch.chdir(REPO)
    cfg = compose_config(["dataset=synthetic-tiny-link", "cluster=netns", "cluster.machines=2",
                          f"partition.root={REPO / 'partitions'}", f"dataset.root={REPO / 'data'}"])
    ensure_partitions(cfg.dataset, cfg.partition)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    ds = load_dataset(cfg.dataset)
    torch.manual_seed(0)
    model = build_link_model(cfg.model, ds.graph.ndata["feat"].shape[1])
    torch.save({"model": model.state_dict(), "epoch": 0}, run / "best_model.pt")
    t0 = time.monotonic()
    r = subprocess.run([PY, "-m", "degnn.infer", str(run), "cluster.bandwidth=1gbit"], cwd=REPO,
                       capture_output=True, text=True, timeout=budget(90))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    print(f"infer {time.monotonic() - t0:.1f}s")
    assert "1gbit per link" in r.stderr
    folder = run / "embeddings"
    data = load_all(folder)
    assert set(data) == {"embedding"}  # no prediction for a link task
    _every_node_once(folder, ds.graph.num_nodes())
    t = ds.link_split["test"]
    src, dst = (torch.as_tensor(t[k]).long() for k in ("source_node", "target_node"))
    mrr = mrr_evaluator()(*link_scores(model.decoder, data["embedding"], src, dst,
                                       torch.as_tensor(t["target_node_neg"]).long()))
    info = json.loads((folder / "summary.json").read_text())
    assert info["embedding"] == "the encoder's output" and info["dims"] == {"embedding": 128}
    assert abs(mrr - info["test"]) < 1e-6, (mrr, info["test"])


def test_a_best_model_of_another_shape_is_named():
    from degnn.infer.worker import state_mismatch

    own = {"w": torch.zeros(4, 3), "b": torch.zeros(4)}
    assert state_mismatch(own, {"w": torch.ones(4, 3), "b": torch.ones(4)}) == ""
    assert state_mismatch(own, {"w": torch.zeros(4, 3)}) == "no b in the file"
    assert state_mismatch(own, {**own, "c": torch.zeros(1)}) == "the file has c, the model none"
    assert state_mismatch(own, {"w": torch.zeros(8, 3), "b": torch.zeros(4)}) == "w is [8, 3] in the file, [4, 3] in the model"
