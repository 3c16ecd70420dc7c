"""partitioners: DGL partition format, correctness, stats, caching, bad input, CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import dgl
import numpy as np
import pytest
import torch

import partitioners
from degnn.partition_cache import cache_dir, ensure_partitions
from partitioners import PartitionError, partition_graph, partition_stats

REPO = Path(__file__).resolve().parent.parent
METHODS = ("random", "metis", "supernode")


def planted_graph(n=2000, classes=8, deg=8, homophily=0.85, seed=0):
    """Planted communities: the label is the community; most edges stay inside it."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    m = n * deg // 2
    src = rng.integers(0, n, m)
    dst = rng.integers(0, n, m)
    same = rng.random(m) < homophily
    for k in range(classes):
        members = np.flatnonzero(y == k)
        idx = np.flatnonzero(same & (y[src] == k))
        dst[idx] = rng.choice(members, len(idx))
    g = dgl.to_bidirected(dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n))
    g.ndata["feat"] = torch.randn(n, 8)
    g.ndata["label"] = torch.from_numpy(y)
    r = rng.random(n)
    g.ndata["train_mask"] = torch.from_numpy(r < 0.5)
    g.ndata["val_mask"] = torch.from_numpy((r >= 0.5) & (r < 0.75))
    g.ndata["test_mask"] = torch.from_numpy(r >= 0.75)
    g.edata["w"] = torch.rand(g.num_edges())
    return g


@pytest.fixture(scope="module")
def graph():
    return planted_graph()


@pytest.fixture(scope="module")
def parted(graph, tmp_path_factory):
    """Every method with K=2 and 3, partitioned once for the module."""
    root = tmp_path_factory.mktemp("parts")
    out = {}
    for method in METHODS:
        for k in (2, 3):
            out[method, k] = partition_graph(graph, method, k, root / f"{method}-{k}", "toy", seed=1)
    return out


def _load_all(jpath, k):
    return [dgl.distributed.load_partition(str(jpath), i) for i in range(k)]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [2, 3])
def test_partition_roundtrip(graph, parted, method, k):
    jpath = parted[method, k]
    out = jpath.parent
    assert jpath.name == "toy.json" and (out / "COMPLETE").is_file()
    meta = json.loads(jpath.read_text())
    assert meta["num_parts"] == k and meta["graph_name"] == "toy" and meta["part_method"] == method
    assert meta["num_nodes"] == graph.num_nodes() and meta["num_edges"] == graph.num_edges()
    orig_nids = torch.load(out / "orig_nids.pt")
    orig_eids = torch.load(out / "orig_eids.pt")
    n, m = graph.num_nodes(), graph.num_edges()
    assert sorted(orig_nids.tolist()) == list(range(n))
    gsrc, gdst = graph.edges()

    owned = np.zeros(n, dtype=np.int64)
    seen_edges = np.zeros(m, dtype=np.int64)
    for i, (pg, nfeat, efeat, gpb, name, ntypes, etypes) in enumerate(_load_all(jpath, k)):
        assert name == "toy" and gpb.partid == i and gpb.num_partitions() == k
        gpb2, name2, _, _ = dgl.distributed.load_partition_book(str(jpath), i)
        assert name2 == "toy" and gpb2.partid == i
        inner = pg.ndata["inner_node"].bool()
        nid = pg.ndata[dgl.NID][inner]
        # contiguous range owned by part i, as the range partition book says
        assert (gpb.nid2partid(nid) == i).all()
        lo, hi = meta["node_map"]["_N"][i]
        assert nid.tolist() == list(range(lo, hi))
        orig = orig_nids[nid]
        owned[orig.numpy()] += 1
        for key in ("feat", "label", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(nfeat[f"_N/{key}"], graph.ndata[key][orig]), key
        # every inner edge maps to an original edge with the same endpoints
        ie = pg.edata["inner_edge"].bool()
        ls, ld = pg.edges()
        s_new = pg.ndata[dgl.NID][ls[ie]]
        d_new = pg.ndata[dgl.NID][ld[ie]]
        eid = pg.edata[dgl.EID][ie]
        assert (gpb.eid2partid(eid) == i).all()
        oe = orig_eids[eid]
        assert torch.equal(orig_nids[s_new], gsrc[oe]) and torch.equal(orig_nids[d_new], gdst[oe])
        assert (d_new >= lo).all() and (d_new < hi).all()  # an edge lives with its destination
        seen_edges[oe.numpy()] += 1
        assert torch.equal(efeat["_N:_E:_N/w"], graph.edata["w"][oe])
    assert (owned == 1).all(), "every node owned by exactly one part"
    assert (seen_edges == 1).all(), "every edge an inner edge of exactly one part"


@pytest.mark.parametrize("method", ["random", "metis"])
def test_the_runtime_reads_each_nodes_owner_as_the_partitioner_assigned_it(graph, parted, method):
    """The owner of every node as the runtime reads it, DGL's partition book (nid2partid of its
    new id, which orig_nids maps back), is the assignment the partitioner computed (stats.json
    hashes it before anything is written; random: the seed's assignment itself, METIS draws its
    own); machine i's own nodes are its node_map range, and the rows degnn reads as its own
    (own_rows: the KVStore's local rows in local-id order) are those nodes' features."""
    from degnn.runtime.own_rows import own_rows
    from partitioners.stats import digest

    k, jpath = 3, parted[method, 3]
    written = json.loads((jpath.parent / "stats.json").read_text())["assignment_digest"]
    orig = torch.load(jpath.parent / "orig_nids.pt")
    meta = json.loads(jpath.read_text())
    n = graph.num_nodes()
    for i, (pg, nfeat, _, gpb, _, _, _) in enumerate(_load_all(jpath, k)):
        owner = torch.empty(n, dtype=torch.long)
        owner[orig] = gpb.nid2partid(torch.arange(n)).long()  # by original id
        assert digest(owner.numpy()) == written, f"machine {i}: the owners are not the assignment written"
        if method == "random":
            want = torch.from_numpy(partitioners.compute_assignment(graph, method, k, seed=1))
            assert torch.equal(owner, want), f"machine {i}: {int((owner != want).sum())} nodes with another owner"
        lo, hi = meta["node_map"]["_N"][i]
        own = pg.ndata[dgl.NID][pg.ndata["inner_node"].bool()]
        assert torch.equal(own, torch.arange(lo, hi))
        assert torch.equal(torch.sort(orig[own]).values, torch.nonzero(owner == i).flatten())
        rows = own_rows(SimpleNamespace(local_partition=nfeat["_N/feat"]), gpb, own)
        assert rows is not None and torch.equal(rows, graph.ndata["feat"][orig[own]]), f"machine {i}: own rows"


@pytest.mark.parametrize("method", METHODS)
def test_stats(graph, parted, method):
    for k in (2, 3):
        jpath = parted[method, k]
        st = json.loads((jpath.parent / "stats.json").read_text())
        for key in ("method", "num_parts", "seed", "wall_time_s", "edge_cut_fraction", "label_tv_mean",
                    "label_tv_max", "label_tv_over", "parts", "graph_name"):
            assert key in st, key
        assert st["method"] == method and st["num_parts"] == k and st["seed"] == 1
        assert st["label_tv_over"] == "train"
        assert 0 <= st["edge_cut_fraction"] <= 1 and st["wall_time_s"] > 0
        parts = st["parts"]
        assert len(parts) == k
        assert sum(p["nodes"] for p in parts) == graph.num_nodes()
        assert sum(p["edges"] for p in parts) == graph.num_edges()
        assert sum(p["train_nodes"] for p in parts) == int(graph.ndata["train_mask"].sum())
        assert all(0 <= p["label_tv"] <= 1 for p in parts)
        # the halo stored in the part graphs equals the one computed from the assignment
        orig_nids = torch.load(jpath.parent / "orig_nids.pt")
        assign = np.empty(graph.num_nodes(), dtype=np.int64)
        halo = []
        for i, (pg, *_rest) in enumerate(_load_all(jpath, k)):
            inner = pg.ndata["inner_node"].bool()
            assign[orig_nids[pg.ndata[dgl.NID][inner]].numpy()] = i
            halo.append(int((~inner).sum()))
        assert [p["halo_nodes"] for p in parts] == halo
        again = partition_stats(graph, assign, k)
        assert [p["halo_nodes"] for p in again["parts"]] == halo
        assert again["edge_cut_fraction"] == pytest.approx(st["edge_cut_fraction"])
        # the hashes name the graph and the assignment the part graphs hold
        assert (again["graph_digest"], again["assignment_digest"]) == (st["graph_digest"], st["assignment_digest"])
    if method == "metis":  # METIS cuts far fewer edges than random dealing
        rnd = json.loads((parted["random", 2].parent / "stats.json").read_text())
        assert st["edge_cut_fraction"] < rnd["edge_cut_fraction"]


def test_label_uniformity_random_and_supernode_beat_metis(parted):
    """The TMA paper's claim: random and super-node parts have near-global label distributions."""
    for k in (2, 3):
        tv = {m: json.loads((parted[m, k].parent / "stats.json").read_text())["label_tv_mean"] for m in METHODS}
        assert tv["random"] < tv["metis"] and tv["supernode"] < tv["metis"], tv
        assert tv["random"] < 0.5 * tv["metis"], tv


def test_same_format_as_dgl_partition_graph(graph, parted, tmp_path):
    dgl.distributed.partition_graph(graph, "toy", 2, str(tmp_path), part_method="random")
    ours = json.loads(parted["random", 2].read_text())
    theirs = json.loads((tmp_path / "toy.json").read_text())
    assert set(theirs) <= set(ours)
    assert ours["part-0"] == theirs["part-0"] and ours["etypes"] == theirs["etypes"]
    a = dgl.distributed.load_partition(str(parted["random", 2]), 0)
    b = dgl.distributed.load_partition(str(tmp_path / "toy.json"), 0)
    assert set(a[0].ndata) == set(b[0].ndata) and set(a[0].edata) == set(b[0].edata)
    assert set(a[1]) == set(b[1]) and set(a[2]) == set(b[2])
    for key in a[0].ndata:
        assert a[0].ndata[key].dtype == b[0].ndata[key].dtype, key


def test_supernode_scales_down_on_small_graphs():
    assert partitioners.effective_num_supernodes(2000, 3, 15000) == 100
    assert partitioners.effective_num_supernodes(10_000_000, 4, 15000) == 15000
    assert partitioners.effective_num_supernodes(30, 4, 15000) == 4


@pytest.mark.parametrize("method", ["random", "supernode"])
def test_deterministic_given_seed(graph, method):
    # the seed reaches the method's own draw (the partition-book test builds its expected owners
    # with the same call, so a seed dropped inside the method passes there)
    a = partitioners.compute_assignment(graph, method, 3, seed=5)
    b = partitioners.compute_assignment(graph, method, 3, seed=5)
    c = partitioners.compute_assignment(graph, method, 3, seed=6)
    assert (a == b).all() and not (a == c).all()
    # the stats' hashes tell the two assignments apart, not the graph they share
    sa, sb, sc = (partition_stats(graph, x, 3) for x in (a, b, c))
    assert sa["assignment_digest"] == sb["assignment_digest"] != sc["assignment_digest"]
    assert sa["graph_digest"] == sc["graph_digest"]


# ----------------------------------------------------------------------------- a part's CSC file
def same_part_graph(mapped, saved):
    """The part graph a server maps from graph_csc.dgl is the one graph.dgl holds: every edge with
    its id, every ndata and edata field (in the dtype DGL's server casts it to)."""
    from degnn.part_csc import reserved_dtypes

    assert mapped is not None, "no CSC file beside graph.dgl"
    assert (mapped.num_nodes(), mapped.num_edges()) == (saved.num_nodes(), saved.num_edges())
    s, d, e = (t.numpy() for t in saved.edges(form="all"))
    ms, md, me = (t.numpy() for t in mapped.edges(form="all"))
    by_id, mby_id = np.argsort(e), np.argsort(me)
    assert np.array_equal(e[by_id], me[mby_id])
    assert np.array_equal(s[by_id], ms[mby_id]) and np.array_equal(d[by_id], md[mby_id])
    for mine, theirs in ((mapped.ndata, saved.ndata), (mapped.edata, saved.edata)):
        assert sorted(mine) == sorted(theirs)
        for k, v in theirs.items():
            want = v.to(reserved_dtypes()[k]) if k in reserved_dtypes() else v
            assert mine[k].dtype == want.dtype and torch.equal(mine[k], want), k


@pytest.mark.parametrize("method", ["random", "metis"])
def test_each_part_has_a_csc_file_of_its_graph(parted, method):
    from degnn.runtime.mapped_feats import load_part_mapped

    for i in range(3):
        f = str(Path(parted[method, 3]).parent / f"part{i}" / "graph.dgl")
        same_part_graph(load_part_mapped(f), dgl.load_graphs(f)[0][0])


@pytest.mark.parametrize("method", ["random", "metis"])
def test_a_server_keeps_its_own_nodes_in_edges(parted, method):
    """cluster.server_edges=inner: the part a server maps holds exactly the part's inner edges (the
    in-edges of its own nodes) with their ids and fields, and every node with its fields, so each
    own node's in-neighbours are what the whole part gives it."""
    from degnn.part_csc import CSC_FILE, inner_edges_only
    from degnn.runtime.mapped_feats import load_part_mapped, load_tensors_mapped

    for i in range(3):
        f = str(Path(parted[method, 3]).parent / f"part{i}" / "graph.dgl")
        whole, cut = dgl.load_graphs(f)[0][0], load_part_mapped(f, inner_only=True)
        inner_edge, inner = whole.edata["inner_edge"].bool(), whole.ndata["inner_node"].bool()
        assert 0 < int(inner_edge.sum()) < whole.num_edges()  # the part has outgoing halo edges to drop
        s, d, e = (t.numpy() for t in whole.edges(form="all"))
        keep = inner_edge.numpy()
        cs, cd, ce = (t.numpy() for t in cut.edges(form="all"))
        assert cut.num_nodes() == whole.num_nodes() and cut.num_edges() == int(keep.sum())
        got = sorted(zip(cut.edata[dgl.EID][ce].tolist(), cs.tolist(), cd.tolist()))
        want = sorted(zip(whole.edata[dgl.EID][e[keep]].tolist(), s[keep].tolist(), d[keep].tolist()))
        assert got == want
        # as a server samples (DGL's sampler on its graph, then the part's edge ids of what it took):
        # every in-edge of every own node, with its global id
        own = torch.nonzero(inner).flatten()
        took = dgl.sampling.sample_neighbors(cut, own, -1)
        ts, td = (t.numpy() for t in took.edges())
        assert sorted(zip(cut.edata[dgl.EID][took.edata[dgl.EID]].tolist(), ts.tolist(), td.tolist())) == want
        assert torch.equal(cut.in_degrees()[inner], whole.in_degrees()[inner])
        assert int(cut.in_degrees()[~inner].sum()) == 0
        for k, v in whole.ndata.items():
            assert torch.equal(cut.ndata[k].long(), v.long()), k
        # a part whose own nodes are not first is served whole, not cut wrongly
        t = load_tensors_mapped(str(Path(f).parent / CSC_FILE))
        t["ndata/inner_node"] = t["ndata/inner_node"].flip(0)
        assert inner_edges_only(t) is None


def test_a_server_holds_its_parts_structure_once(tmp_path):
    # 30k nodes, 600k edges in 2 parts: a part's structure is about 11 MB, well above the heap's noise (0-1 MB)
    big = planted_graph(n=30_000, deg=20, seed=2)
    j = partition_graph(big, "random", 2, tmp_path / "p", "big", seed=0)
    csc_mb = (tmp_path / "p" / "part0" / "graph_csc.dgl").stat().st_size / 2**20

    from benchmarks.server_memory import load_part

    mapped, dgls = load_part(j, "mapped"), load_part(j, "dgl")
    assert mapped["edges"] == dgls["edges"] > 300_000
    # DGL's own load holds graph.dgl (the part's COO and its fields) in the heap, then its CSC
    assert dgls["loaded"] > 0.8 * csc_mb and dgls["formats"] > 0.8 * csc_mb, (dgls, csc_mb)
    # the mapped graph's arrays are file pages: the heap grows by a fraction of the part at most
    assert max(mapped[k] for k in ("loaded", "formats", "copied", "peak_anon")) < 0.15 * csc_mb, (mapped, csc_mb)


# ----------------------------------------------------------------------------- bad input
def _no_temp_left(out: Path):
    return not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"method": "random", "num_parts": 0}, "at least 1"),
        ({"method": "random", "num_parts": 10**6}, "exceeds the graph's 2000 nodes"),
        ({"method": "kmeans", "num_parts": 2}, "unknown partition method 'kmeans'"),
    ],
)
def test_bad_input(graph, tmp_path, kwargs, fragment):
    out = tmp_path / "p"
    with pytest.raises(PartitionError, match=fragment) as e:
        partition_graph(graph, out=out, graph_name="toy", **kwargs)
    assert "\n" not in str(e.value)
    assert not out.exists() and _no_temp_left(out)


def test_refuses_other_graph_unless_forced(graph, tmp_path):
    out = tmp_path / "p"
    partition_graph(graph, "random", 2, out, "toy")
    for kw in ({"graph_name": "other", "num_parts": 2}, {"graph_name": "toy", "num_parts": 3}):
        with pytest.raises(PartitionError, match="already holds partitions of graph 'toy'.*force=true"):
            partition_graph(graph, "random", out=out, **kw)
    assert (out / "toy.json").is_file() and not (out / "other.json").exists()
    partition_graph(graph, "metis", 2, out, "other", force=True)
    assert (out / "other.json").is_file() and not (out / "toy.json").exists()
    # a same-graph re-run replaces the folder
    partition_graph(graph, "metis", 2, out, "other", seed=3)
    # unrelated files are not deleted without force
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    with pytest.raises(PartitionError, match="holds no partition"):
        partition_graph(graph, "random", 2, junk, "toy")
    assert (junk / "notes.txt").read_text() == "mine"


def test_interrupted_run_leaves_nothing(graph, tmp_path, monkeypatch):
    import partitioners.folder as api

    real = api.write_partitions

    def boom(*a, **kw):
        real(*a, **kw)
        raise KeyboardInterrupt("interrupted")

    monkeypatch.setattr(api, "write_partitions", boom)
    out = tmp_path / "p"
    with pytest.raises(KeyboardInterrupt):
        partition_graph(graph, "random", 2, out, "toy")
    assert not out.exists() and _no_temp_left(out)
    # a temp folder of a killed writer (dead pid) is cleaned by the next writer of that folder
    stale = tmp_path / ".p.tmp-999999999-deadbeef"
    (stale / "part0").mkdir(parents=True)
    monkeypatch.setattr(api, "write_partitions", real)
    partition_graph(graph, "random", 2, out, "toy")
    assert not stale.exists() and partitioners.is_complete(out)
    (out / "COMPLETE").unlink()
    assert not partitioners.is_complete(out)


# ----------------------------------------------------------------------------- ensure_partitions
def test_ensure_partitions_caches(graph, tmp_path, monkeypatch):
    from degnn.config import DatasetConfig, PartitionConfig
    import degnn.data

    calls = []

    def fake_load(cfg):
        calls.append(cfg.name)
        return SimpleNamespace(graph=graph)

    monkeypatch.setattr(degnn.data, "load_dataset", fake_load)
    monkeypatch.chdir(tmp_path)
    ds = DatasetConfig(name="toy", kind="synthetic")
    pc = PartitionConfig(method="supernode", num_parts=2, seed=3, root="parts")
    j = ensure_partitions(ds, pc)
    assert cache_dir(ds, pc).name.startswith("supernode-k2-s3-")
    assert j == tmp_path / "parts" / "toy" / cache_dir(ds, pc).name / "toy.json" == cache_dir(ds, pc) / "toy.json"
    assert partitioners.is_complete(j.parent) and calls == ["toy"]
    stamp = {p: p.stat().st_mtime_ns for p in j.parent.rglob("*")}
    assert ensure_partitions(ds, pc) == j
    assert calls == ["toy"], "second call must not reload or repartition"
    assert stamp == {p: p.stat().st_mtime_ns for p in j.parent.rglob("*")}
    # an incomplete folder is rewritten
    (j.parent / "COMPLETE").unlink()
    assert ensure_partitions(ds, pc) == j and calls == ["toy", "toy"]
    # other settings that change the result (num_supernodes) are a miss too
    pc.num_supernodes = 50
    j50 = ensure_partitions(ds, pc)
    assert calls == ["toy"] * 3
    # in a folder of its own: a run reading the first one is never handed the other's files
    assert j50.parent != j.parent and json.loads(j.read_text())["degnn"]["num_supernodes"] != 50
    assert json.loads(j50.read_text())["degnn"]["num_supernodes"] == 50
    # a different K is a different folder
    pc2 = PartitionConfig(method="random", num_parts=3, seed=0, root=str(tmp_path / "parts"))
    assert ensure_partitions(ds, pc2).parent.name.startswith("random-k3-s0-")
    with pytest.raises(PartitionError, match="at least 1"):
        ensure_partitions(ds, PartitionConfig(method="random", num_parts=0, root="parts"))


# ----------------------------------------------------------------------------- CLI
def _cli(*args, cwd=REPO, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO), DGL_LOG_LEVEL="error")
    return subprocess.run(
        [sys.executable, "-m", "partitioners", *args, "hydra.run.dir=" + str(Path(cwd) / ".hydra-tmp")],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


def test_cli_bad_input(tmp_path):
    r = _cli("partition=random", "partition.num_parts=0", f"out={tmp_path / 'p'}", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: partition.num_parts must be at least 1"), r.stderr
    assert not (tmp_path / "p").exists()
    r = _cli("partition=kmeans", f"out={tmp_path / 'p'}", cwd=tmp_path)
    assert r.returncode != 0 and "partition/kmeans" in r.stderr and "supernode" in r.stderr, r.stderr


def _dataset_available(root: Path) -> str:
    try:
        from hydra import compose, initialize_config_dir
        from degnn.config import CONF_DIR, register_configs
        from degnn.data import load_dataset

        register_configs()
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="partition", overrides=["dataset=synthetic-tiny", "out=x", f"dataset.root={root}"])
        load_dataset(cfg.dataset)
    except NotImplementedError as e:
        return f"degnn.data.load_dataset is not implemented yet ({e})"
    return ""


def test_cli_partitions_synthetic_tiny(tmp_path):
    data = tmp_path / "data"
    why = _dataset_available(data)
    if why:
        pytest.skip(why)
    out = tmp_path / "p"
    r = _cli("dataset=synthetic-tiny", f"dataset.root={data}", "partition=supernode", "partition.num_parts=2",
             f"out={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "edge cut fraction" in r.stdout and "label_tv" in r.stdout
    assert partitioners.is_complete(out) and (out / "synthetic-tiny.json").is_file()
    st = json.loads((out / "stats.json").read_text())
    assert st["method"] == "supernode" and st["num_parts"] == 2
    for i in range(2):
        dgl.distributed.load_partition(str(out / "synthetic-tiny.json"), i)
    # the same folder with another method: refused, one line
    r = _cli("dataset=synthetic-tiny", f"dataset.root={data}", "partition=random", "partition.num_parts=2",
             f"out={out}", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: out ") and "force=true" in r.stderr


# ----------------------------------------------------------------------------- served by DGL
_SERVE_SERVER = r"""
import sys, dgl
i, ipc, jpath = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dgl.distributed.DistGraphServer(i, ipc, 1, 1, jpath, graph_format=["csc", "coo"]).start()
"""

_SERVE_CLIENT = r"""
import os, sys, torch, dgl
jpath, expect_feat, expect_label = sys.argv[1], sys.argv[2], sys.argv[3]
dgl.distributed.initialize(sys.argv[4])
g = dgl.distributed.DistGraph("toy")
n = g.num_nodes()
ids = torch.arange(n)
assert torch.equal(g.ndata["feat"][ids], torch.load(expect_feat)), "feat"
assert torch.equal(g.ndata["label"][ids], torch.load(expect_label)), "label"
sg = dgl.distributed.sample_neighbors(g, torch.arange(0, n, 7), 3)
assert sg.num_edges() > 0
print("SERVED", n, g.num_edges(), sg.num_edges(), flush=True)
os._exit(0)  # DGL's orderly client exit takes ~15 s; the test's runner stops the servers
"""


def _free_ports(k):
    import socket

    socks = [socket.socket() for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


_SERVE_MAIN = r"""
import json, os, subprocess, sys
server, client, ipc, jpath, feat, label = sys.argv[1:7]
private = json.loads(os.environ["SERVE_PRIVATE_SHM"])
# machine 1 gets a /dev/shm of its own; machine 0 shares this one with the client
procs = [subprocess.Popen((private if i else []) + [sys.executable, "-c", server, str(i), ipc, jpath],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
try:
    rc = subprocess.run([sys.executable, "-c", client, jpath, feat, label, ipc], timeout=60,
                        env=dict(os.environ, DGL_ROLE="client", DGL_DIST_MODE="distributed")).returncode
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
sys.exit(rc)
"""


def _private_shm_prefix():
    """`unshare` + a fresh tmpfs on /dev/shm (root only), or None."""
    import shutil

    if shutil.which("unshare") is None or os.geteuid() != 0:
        return None
    probe = subprocess.run(["unshare", "--mount", "--ipc", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
                           capture_output=True)
    if probe.returncode != 0:
        return None
    return ["unshare", "--mount", "--ipc", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]


def test_dist_graph_server_serves_supernode_partition(graph, parted, tmp_path):
    """Two DistGraphServers (machines 127.0.0.1 and 127.0.0.2) serve a 2-part supernode
    partition; a client on machine 0 reads every node's features (local and remote rows) through
    DistGraph and samples neighbours. DGL names its kvstore shared-memory segments by tensor name
    only (``node~_N~feat-kvdata-``), so the run gets a private /dev/shm: other DGL servers on this
    host would otherwise overwrite them."""
    prefix = _private_shm_prefix()
    if prefix is None:
        pytest.skip("needs root and unshare for a private /dev/shm (DGL's shared-memory names collide across servers)")
    jpath = parted["supernode", 2]
    orig_nids = torch.load(jpath.parent / "orig_nids.pt")
    # DistGraph speaks new (shuffled) ids: row j holds original node orig_nids[j]
    torch.save(graph.ndata["feat"][orig_nids], tmp_path / "feat.pt")
    torch.save(graph.ndata["label"][orig_nids], tmp_path / "label.pt")
    ports = _free_ports(2)
    ipc = tmp_path / "ip_config.txt"
    ipc.write_text(f"127.0.0.1 {ports[0]}\n127.0.0.2 {ports[1]}\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), DGL_NUM_SERVER="1", DGL_NUM_CLIENT="1",
               SERVE_PRIVATE_SHM=json.dumps(prefix))
    r = subprocess.run(
        prefix + [sys.executable, "-c", _SERVE_MAIN, _SERVE_SERVER, _SERVE_CLIENT, str(ipc), str(jpath),
                  str(tmp_path / "feat.pt"), str(tmp_path / "label.pt")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0 and "SERVED 2000" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
