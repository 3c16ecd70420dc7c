"""Chunked graphs: the streaming generator, the streaming random partitioner against the in-memory
one, bad chunks, and both within their memory budget on a graph bigger than the budget."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from degnn.chunked import open_chunked
from degnn.data.synthetic_stream import generate_chunked, knobs

REPO = Path(__file__).resolve().parents[1]
TIMES = ("wall_time_s", "assign_time_s", "write_time_s", "checksum_time_s", "load_time_s", "peak_rss_mb", "budget_mb", "streamed")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("chunked") / "g"
    # a 1 MiB budget: several edge and node chunks
    generate_chunked(knobs(3000, 5, 16, 10.0, seed=1), d, budget_bytes=1 << 20)
    return d


def _part(out: Path, i: int):
    import dgl

    (pg,), _ = dgl.load_graphs(str(out / f"part{i}" / "graph.dgl"))
    from dgl.data.utils import load_tensors

    return pg, load_tensors(str(out / f"part{i}" / "node_feat.dgl"))


def test_generator_writes_the_model(small):
    g = open_chunked(small)
    assert len(g.edge_files) > 1 and len(g.node_chunks) > 1
    meta = json.loads((small / "metadata.json").read_text())
    assert meta["node_type"] == ["_N"] and meta["edges"]["_N:_E:_N"]["format"] == {"name": "csv", "delimiter": " "}
    from degnn.chunked import read_whole

    src, dst, nd = read_whole(g)
    # every drawn edge stored both ways, no self-loops, about num_nodes * avg_degree of them
    assert len(src) == g.num_edges and abs(len(src) - 3000 * 10) < 3000 * 10 * 0.02
    assert not (src == dst).any()
    fwd = set(zip(src.tolist(), dst.tolist()))
    assert all((d, s) in fwd for s, d in list(fwd)[:2000])
    # homophily: about half the edges within a class (label noise takes some), far above 1/5
    y = nd["label"]
    assert 0.35 < (y[src] == y[dst]).mean() < 0.55
    # skewed degrees (Pareto propensities) and the split's shares
    deg = np.bincount(dst, minlength=3000)
    assert deg.max() > 8 * deg.mean()
    assert abs(nd["train_mask"].mean() - 0.54) < 0.03 and (nd["train_mask"] + nd["val_mask"] + nd["test_mask"] == 1).all()
    assert nd["feat"].shape == (3000, 16) and nd["feat"].dtype == np.float32


def test_streamed_partition_equals_in_memory(small, tmp_path):
    import torch

    from degnn.data import load_dataset
    from partitioners.folder import CHECKSUMS, damage, is_complete, partition_graph
    from degnn.runtime.mapped_feats import load_part_mapped
    from partitioners.stream_random import partition_chunked
    from test_partitioners import same_part_graph

    cfg = {"name": "cg", "kind": "chunked", "path": str(small), "to_bidirected": False}
    data = load_dataset(cfg)
    mem = tmp_path / "mem"
    st = tmp_path / "st"
    partition_graph(data.graph, "random", 4, mem, "cg", seed=3)
    # a 4 MiB budget: the edge pass reads its chunks in several blocks
    partition_chunked(small, 4, st, "cg", seed=3, budget_bytes=4 << 20)
    assert is_complete(st)
    # the streamed folder carries checksums too, and they match its files
    assert (st / CHECKSUMS).is_file() and damage(st, full=True) is None
    sm, ss = (json.loads((p / "stats.json").read_text()) for p in (mem, st))
    # same assignment, halos, node and edge counts per part, label uniformity, graph digest
    assert {k: v for k, v in ss.items() if k not in TIMES} == {k: v for k, v in sm.items() if k not in TIMES}
    jm, js = (json.loads((p / "cg.json").read_text()) for p in (mem, st))
    assert js["node_map"] == jm["node_map"] and js["edge_map"] == jm["edge_map"]
    on_m = torch.load(mem / "orig_nids.pt").numpy()
    on_s = torch.load(st / "orig_nids.pt").numpy()
    oe_m = torch.load(mem / "orig_eids.pt").numpy()
    oe_s = np.load(st / "orig_eids.npy")
    feat = data.graph.ndata["feat"].numpy()
    osrc, odst = (t.numpy() for t in data.graph.edges())
    for i in range(4):
        (pm, fm), (ps, fs) = _part(mem, i), _part(st, i)
        assert ps.num_nodes() == pm.num_nodes() and ps.num_edges() == pm.num_edges()
        # the same nodes (inner and halo) and edges (inner and outgoing), in original ids
        def ids(pg, on, oe):
            inner = pg.ndata["inner_node"].bool().numpy()
            nid = on[pg.ndata["_ID"].numpy()]
            ie = pg.edata["inner_edge"].bool().numpy()
            s, d = pg.edges()
            # outgoing halo edges: DGL's in-memory partition leaves their _ID unset (garbage), so
            # only inner edges are compared by original id
            eid = np.where(ie, oe[np.where(ie, pg.edata["_ID"].numpy(), 0)], -1)
            return (sorted(nid[inner]), sorted(nid[~inner]), sorted(eid[ie]),
                    sorted(zip(nid[s.numpy()].tolist(), nid[d.numpy()].tolist(), eid.tolist())))
        assert ids(ps, on_s, oe_s) == ids(pm, on_m, oe_m)
        # the streamed part sets every edge's _ID, its outgoing halo edges' too: the original edge
        # with that new id joins the same two nodes
        s, d = (t.numpy() for t in ps.edges())
        snid = on_s[ps.ndata["_ID"].numpy()]
        orig = oe_s[ps.edata["_ID"].numpy()]
        assert np.array_equal(osrc[orig], snid[s]) and np.array_equal(odst[orig], snid[d])
        # the CSC file a server maps is the part graph of graph.dgl
        same_part_graph(load_part_mapped(str(st / f"part{i}" / "graph.dgl")), ps)
        # node data: the part's own rows, in its new-id order, are the original rows
        own = on_s[ps.ndata["_ID"].numpy()[ps.ndata["inner_node"].bool().numpy()]]
        assert np.array_equal(fs["_N/feat"].numpy(), feat[own])
        assert sorted(fs) == sorted(fm) and all(fs[k].dtype == fm[k].dtype for k in fs)
        assert torch.equal(fs["_N/label"], data.graph.ndata["label"][torch.from_numpy(own)])
    # DGL's own loader reads the streamed partition
    import dgl

    g0 = dgl.distributed.load_partition(str(st / "cg.json"), 1)
    assert g0[0].num_nodes() == _part(st, 1)[0].num_nodes()


def _break(src: Path, dst: Path, how: str) -> str:
    """A copy of chunked graph `src` at `dst` broken one way; returns the file the error must name."""
    import shutil

    shutil.copytree(src, dst)
    meta = json.loads((dst / "metadata.json").read_text())
    edge1 = dst / meta["edges"]["_N:_E:_N"]["data"][1]
    feat1 = dst / meta["node_data"]["_N"]["feat"]["data"][1]
    if how == "missing":
        edge1.unlink()
        return str(edge1)
    if how == "truncated_npy":
        b = feat1.read_bytes()
        feat1.write_bytes(b[: len(b) - 100])
        return str(feat1)
    if how == "truncated_csv":
        b = edge1.read_bytes()
        edge1.write_bytes(b[: len(b) - 4])  # the last line loses its destination
        return str(edge1)
    if how == "lengths":
        lab1 = dst / meta["node_data"]["_N"]["label"]["data"][1]
        np.save(lab1, np.load(lab1)[:-3])
        return str(lab1)
    if how == "out_of_range":
        lines = edge1.read_text().splitlines()
        lines[5] = "99999999 1"
        edge1.write_text("\n".join(lines) + "\n")
        return str(edge1)
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["missing", "truncated_npy", "truncated_csv", "lengths", "out_of_range"])
def test_a_bad_chunk_is_named_and_nothing_is_written(small, tmp_path, how):
    from partitioners.stream_random import partition_chunked

    bad = tmp_path / "bad"
    name = _break(small, bad, how)
    out = tmp_path / "out"
    from partitioners import PartitionError

    with pytest.raises(PartitionError) as e:
        partition_chunked(bad, 2, out, "cg")
    msg = str(e.value)
    assert name in msg and "\n" not in msg, msg
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]


def _peak_child(code: str, tmp_path: Path) -> dict:
    """Run `code` in a fresh Python; it prints nothing; we get its baseline RSS after imports
    (VmRSS) and its peak (VmHWM), in MiB."""
    probe = (
        "import json, sys\n"
        "def rss(key):\n"
        "    for l in open('/proc/self/status'):\n"
        "        if l.startswith(key): return int(l.split()[1]) / 1024\n"
        + code.split("#RUN\n")[0]
        + "base = rss('VmRSS:')\n"
        + code.split("#RUN\n")[1]
        + "print(json.dumps({'base': base, 'peak': rss('VmHWM:')}))\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_generator_and_partitioner_stay_within_a_small_budget(tmp_path):
    """160k nodes, 128-dim features, ~1.6M edges: 82 MB of features and 26 MB of edges in memory
    (more as drawn), over a 64 MiB budget; each process's peak above its imports stays under it."""
    budget = 64
    d = tmp_path / "g"
    spec = json.dumps({"num_nodes": 160_000, "num_classes": 8, "feat_dim": 128, "avg_degree": 10.0})
    gen = _peak_child(
        "from pathlib import Path\nfrom degnn.data.synthetic_stream import generate_chunked, knobs\n#RUN\n"
        f"generate_chunked(knobs(**{spec}), Path({str(d)!r}), {budget} << 20)\n", tmp_path)
    g = open_chunked(d)
    whole_mb = (g.num_nodes * 128 * 4 + g.num_edges * 16) / 2 ** 20
    assert whole_mb > 1.5 * budget, whole_mb
    assert gen["peak"] - gen["base"] < budget, gen
    part = _peak_child(
        "import dgl, pandas, torch\nfrom partitioners.stream_random import partition_chunked\n#RUN\n"
        f"partition_chunked({str(d)!r}, 8, {str(tmp_path / 'p')!r}, 'g', budget_bytes={budget} << 20)\n", tmp_path)
    print("generator", gen, "partitioner", part, "graph MiB", whole_mb)
    assert part["peak"] - part["base"] < budget, part
    stats = json.loads((tmp_path / "p" / "stats.json").read_text())
    assert stats["num_edges"] == g.num_edges and sum(p["nodes"] for p in stats["parts"]) == g.num_nodes
