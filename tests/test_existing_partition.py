"""partition.path: a partition made by DGL's own `dgl.distributed.partition_graph` is checked
against the cluster and the pipeline before anything starts, and trains as it is."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dgl
import pytest

REPO = Path(__file__).resolve().parents[1]
NETNS = os.geteuid() == 0 and shutil.which("ip") is not None
needs_netns = pytest.mark.skipif(not NETNS, reason="cluster=netns needs root and iproute2")


@pytest.fixture(scope="module")
def dgl_parts(tmp_path_factory):
    """synthetic-tiny cut into 2 parts by DGL itself, with METIS and at random."""
    from degnn.data import load_dataset
    from degnn.entry import compose_config

    base = tmp_path_factory.mktemp("dglparts")
    cfg = compose_config([f"dataset.root={base / 'data'}"])
    g = load_dataset(cfg.dataset).graph
    keep = {k: g.ndata[k] for k in ("feat", "label", "train_mask", "val_mask", "test_mask")}
    out = {}
    for method in ("metis", "random"):
        h = dgl.graph(g.edges(), num_nodes=g.num_nodes())
        h.ndata.update(keep)
        dgl.distributed.partition_graph(h, "tiny", 2, str(base / method), part_method=method)
        out[method] = base / method / "tiny.json"
    h = dgl.graph(g.edges(), num_nodes=g.num_nodes())
    h.ndata["feat"] = keep["feat"]  # no labels or masks
    dgl.distributed.partition_graph(h, "tiny", 2, str(base / "nolabel"), part_method="metis")
    out["nolabel"] = base / "nolabel" / "tiny.json"
    return out


def launch(run_dir, *overrides, timeout=600):
    return subprocess.run([sys.executable, "-m", "degnn.launch", "cluster=netns", "cluster.subnet=10.77.73",
                           "cluster.port=31970", *overrides, f"hydra.run.dir={run_dir}"],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("overrides, message", [
    (["cluster.machines=3"], "has 2 parts but the cluster has 3 machines"),
    (["cluster.machines=2", "pipeline=tma", "pipeline.variant=random"],
     "was made with part_method=metis, but this pipeline trains on random partitions"),
])
def test_a_mismatched_partition_is_refused_before_anything_starts(dgl_parts, tmp_path, overrides, message):
    p = launch(tmp_path / "run", *overrides, f"partition.path={dgl_parts['metis']}", timeout=120)
    assert p.returncode != 0 and message in p.stderr, p.stderr[-2000:]
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "run" / "rank0.log").exists()


def test_a_path_that_is_not_a_partition_config_is_named(dgl_parts, tmp_path):
    from partitioners import PartitionError, existing_partition

    with pytest.raises(PartitionError, match="is a folder; give the JSON"):
        existing_partition(str(dgl_parts["metis"].parent), 2)
    with pytest.raises(PartitionError, match="does not exist"):
        existing_partition(str(tmp_path / "no.json"), 2)
    (tmp_path / "other.json").write_text('{"name": "x"}')
    with pytest.raises(PartitionError, match="has no graph_name, num_parts: not a DGL partition config"):
        existing_partition(str(tmp_path / "other.json"), 2)
    assert existing_partition(str(dgl_parts["random"]), 2, "random") == dgl_parts["random"].resolve()


@needs_netns
@pytest.mark.parametrize("parts, pipeline", [
    ("metis", ["pipeline=distdgl", "train.epochs=4"]),
    ("metis", ["pipeline=lamp", "train.epochs=4"]),
    ("random", ["pipeline=tma", "pipeline.variant=random", "pipeline.time_limit_s=4", "pipeline.sync_every_s=2"]),
], ids=["distdgl", "lamp", "tma-random"])
def test_dgl_partitions_train_with_each_pipeline_that_can_use_them(dgl_parts, tmp_path, parts, pipeline):
    """Each pipeline on DGL's own parts (METIS; RandomTMA on DGL's random assignment) ends ok,
    above chance, and the launcher built no partition of its own. (SuperTMA needs degnn's
    supernode partitions, which DGL does not make: refused above for a partition method.)"""
    p = launch(tmp_path / "run", "cluster.machines=2", f"partition.root={tmp_path / 'own'}", *pipeline,
               "train.batch_size=64", "train.lr=0.02", f"partition.path={dgl_parts[parts]}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "ok" and s["test"] > 2 / s["num_classes"], s
    assert s["pipeline"] == pipeline[0].split("=")[1]
    assert "used as it is" in p.stdout and not (tmp_path / "own").exists()


def test_a_partition_without_labels_is_named_by_every_trainer(dgl_parts):
    """What a trainer checks once its DistGraph is up (the partition's node data is not read by
    the launcher: that would load a whole part), on the node data DGL wrote without labels."""
    from types import SimpleNamespace

    from degnn.entry import PartitionDataError, check_partition_data, compose_config
    from degnn.tasks import task_of

    feats = dgl.data.utils.load_tensors(str(dgl_parts["nolabel"].parent / "part0" / "node_feat.dgl"))
    graph = SimpleNamespace(ndata={k.split("/", 1)[1]: v for k, v in feats.items()})
    task = task_of(compose_config([]))
    with pytest.raises(PartitionDataError, match="has no node data label, train_mask, val_mask, test_mask"):
        check_partition_data(task, graph, dgl_parts["nolabel"])
