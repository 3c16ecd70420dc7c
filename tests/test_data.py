"""degnn.data: every source through ogb's real loaders, offline, in tmp folders."""
from __future__ import annotations

import os
import os.path as osp
import urllib.error
import urllib.request

import dgl
import numpy as np
import pytest
import torch

from degnn.data import DatasetError, load_dataset
from degnn.data import ogb_layout as L
from degnn.compat import WEIGHTS_ONLY_TAKES_NUMPY

WORDNET = "/usr/share/wordnet"


def cfg(root, **kw):
    base = dict(name="synthetic-tiny", kind="synthetic", task="node", root=str(root), path=None,
                num_nodes=2000, num_classes=8, feat_dim=128, avg_degree=7.0, homophily=0.5,
                feat_noise=1.0, wordnet_dir=WORDNET, to_bidirected=True, seed=0)
    base.update(kw)
    return base


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="module")
def tiny(tiny_root):
    return load_dataset(cfg(tiny_root))


# ---------------------------------------------------------------- synthetic

def test_synthetic_written_in_ogb_layout_and_read_by_ogb(tiny, tiny_root):
    d = tiny.info["dir"]
    assert d.startswith(str(tiny_root))
    for rel in ("RELEASE_v1.txt", "raw/edge.csv.gz", "raw/node-feat.csv.gz", "raw/node-label.csv.gz",
                "raw/num-node-list.csv.gz", "raw/num-edge-list.csv.gz", "split/random/train.csv.gz",
                "processed/dgl_data_processed"):
        assert osp.isfile(osp.join(d, rel)), rel
    # nothing half-written left behind
    assert not [p for p in os.listdir(tiny_root) if ".tmp-" in p]


def test_synthetic_shapes_dtypes_masks(tiny):
    g = tiny.graph
    n = g.num_nodes()
    assert n == 2000 and tiny.num_classes == 8 and tiny.task == "node" and tiny.metric == "acc"
    assert g.ndata["feat"].shape == (n, 128) and g.ndata["feat"].dtype == torch.float32
    assert g.ndata["label"].shape == (n,) and g.ndata["label"].dtype == torch.int64
    assert int(g.ndata["label"].min()) >= 0 and int(g.ndata["label"].max()) < 8
    masks = [g.ndata[k] for k in ("train_mask", "val_mask", "test_mask")]
    assert all(m.dtype == torch.bool for m in masks)
    assert int(sum(m.long() for m in masks).max()) == 1  # disjoint ...
    assert int(sum(m.sum() for m in masks)) == n  # ... and covering
    # bidirected, no self-loops, no duplicates
    src, dst = g.edges()
    assert not bool((src == dst).any())
    assert g.has_edges_between(dst, src).all()
    assert np.unique((src * n + dst).numpy()).shape[0] == g.num_edges()


def test_synthetic_is_plausible(tiny):
    g = tiny.graph
    assert 0.25 < tiny.info["homophily"] < 0.6  # communities, but far from homophily 1
    deg = g.in_degrees().float()
    assert 8 < float(deg.mean()) < 20
    assert float(deg.max()) > 8 * float(deg.median())  # power-law-ish: hubs
    y = g.ndata["label"]
    assert tiny.evaluate(y, y) == 1.0
    assert tiny.evaluate(y, (y + 1) % 8) == 0.0


def test_synthetic_deterministic_and_cached(tiny, tiny_root, tmp_path):
    again = load_dataset(cfg(tmp_path / "other"))  # regenerated from scratch elsewhere
    assert torch.equal(again.graph.edges()[0], tiny.graph.edges()[0])
    assert torch.equal(again.graph.ndata["feat"], tiny.graph.ndata["feat"])
    assert torch.equal(again.graph.ndata["train_mask"], tiny.graph.ndata["train_mask"])
    other = load_dataset(cfg(tmp_path / "other", seed=1))
    assert other.info["dir"] != again.info["dir"]
    assert not torch.equal(other.graph.ndata["feat"], tiny.graph.ndata["feat"])
    # a repeat load reads ogb's processed/ cache instead of regenerating
    stamp = os.stat(osp.join(tiny.info["dir"], L.PROCESSED)).st_mtime_ns
    cached = load_dataset(cfg(tiny_root))
    assert os.stat(osp.join(tiny.info["dir"], L.PROCESSED)).st_mtime_ns == stamp
    assert cached.info["load_s"] < 2.0


def test_not_bidirected_keeps_directed_edges(tiny_root):
    d = load_dataset(cfg(tiny_root, to_bidirected=False))
    assert d.graph.num_edges() == int(round(2000 * 7.0))
    assert d.info["bidirected"] is False


def test_bad_config_errors(tmp_path):
    with pytest.raises(DatasetError, match="num_classes"):
        load_dataset(cfg(tmp_path, num_classes=0))
    with pytest.raises(DatasetError, match="kind"):
        load_dataset(cfg(tmp_path, kind="nope"))
    with pytest.raises(DatasetError, match="dataset.task"):
        load_dataset(cfg(tmp_path, task="edges"))


# ---------------------------------------------------------------- wordnet

needs_wordnet = pytest.mark.skipif(not osp.isfile(osp.join(WORDNET, "data.noun")),
                                   reason="WordNet not installed at /usr/share/wordnet (apt-get install wordnet-base)")


@pytest.fixture(scope="module")
def wn_root(tmp_path_factory):
    return tmp_path_factory.mktemp("wn")


@needs_wordnet
def test_wordnet_node(wn_root):
    d = load_dataset(cfg(wn_root, name="wordnet", kind="wordnet"))
    g = d.graph
    assert 117_000 < g.num_nodes() < 118_500 and d.num_classes == 45
    assert g.ndata["feat"].shape == (g.num_nodes(), 128)
    assert int(g.ndata["label"].max()) == 44
    assert abs(float(g.ndata["train_mask"].float().mean()) - 0.6) < 0.01
    assert g.num_edges() > 300_000 and 0.3 < d.info["homophily"] < 0.95
    norms = g.ndata["feat"].norm(dim=1)
    assert float((norms - 1).abs().max()) < 1e-3  # every synset has a gloss: L2-normed TF-IDF


@needs_wordnet
def test_wordnet_link_and_mrr(wn_root):
    d = load_dataset(cfg(wn_root, name="wordnet-link", kind="wordnet", task="link"))
    assert d.task == "link" and d.metric == "mrr"
    s = d.link_split
    n_val = s["valid"]["source_node"].shape[0]
    assert n_val == 2000 and s["valid"]["target_node_neg"].shape == (n_val, 1000)
    assert s["test"]["target_node_neg"].shape == (2000, 1000)
    g = d.graph
    # held-out edges are not in the training graph, in either direction
    src, dst = s["test"]["source_node"], s["test"]["target_node"]
    assert not bool(g.has_edges_between(src, dst).any()) and not bool(g.has_edges_between(dst, src).any())
    assert d.evaluate(torch.ones(n_val), torch.zeros(n_val, 1000)) == 1.0
    gen = torch.Generator().manual_seed(0)
    rand = d.evaluate(torch.rand(n_val, generator=gen), torch.rand(n_val, 1000, generator=gen))
    assert rand < 0.02
    # ties: OGB ranks at the mean of the optimistic (1) and pessimistic (4) rank -> 1 / 2.5
    assert abs(d.evaluate(torch.zeros(4), torch.zeros(4, 3)) - 1 / 2.5) < 1e-6


def _link_cfg(root, **kw):
    return cfg(root, name="synthetic-tiny-link", task="link", **kw)


def test_link_split_protocol(tmp_path):
    """A generated link graph: 1000 fixed negatives per held-out edge, none the source or one of
    its neighbours; held-out edges are not in the training graph (either direction); the same
    seed gives the same candidates in another folder, another seed other ones."""
    d = load_dataset(_link_cfg(tmp_path / "a"))
    assert d.task == "link" and d.metric == "mrr" and d.info["num_neg"] == 1000
    g, s = d.graph, d.link_split
    n = g.num_nodes()
    every = [(g.edges()[0], g.edges()[1])] + [(s[p]["source_node"], s[p]["target_node"]) for p in ("valid", "test")]
    linked = set()
    for a, b in every:
        linked.update(zip(a.tolist(), b.tolist()))
        linked.update(zip(b.tolist(), a.tolist()))
    for p in ("valid", "test"):
        src, dst, neg = s[p]["source_node"], s[p]["target_node"], s[p]["target_node_neg"]
        assert neg.shape == (len(src), 1000) and 0 < len(src) <= 2000
        assert not bool(g.has_edges_between(src, dst).any()) and not bool(g.has_edges_between(dst, src).any())
        assert int(neg.min()) >= 0 and int(neg.max()) < n
        pairs = zip(src.repeat_interleave(1000).tolist(), neg.reshape(-1).tolist())
        assert not any(u == w or (u, w) in linked for u, w in pairs)
    again = load_dataset(_link_cfg(tmp_path / "b")).link_split
    other = load_dataset(_link_cfg(tmp_path / "c", seed=1)).link_split
    for p in ("valid", "test"):
        for key in ("source_node", "target_node", "target_node_neg"):
            assert torch.equal(again[p][key], s[p][key]), (p, key)
        assert not torch.equal(other[p]["target_node_neg"][:5], s[p]["target_node_neg"][:5])


# ---------------------------------------------------------------- custom

def _small_graph(n=50):
    g = dgl.rand_graph(n, 200, seed=0) if "seed" in dgl.rand_graph.__code__.co_varnames else dgl.rand_graph(n, 200)
    g.ndata["feat"] = torch.randn(n, 16)
    g.ndata["label"] = torch.arange(n) % 3
    idx = torch.arange(n)
    g.ndata["train_mask"] = idx < 30
    g.ndata["val_mask"] = (idx >= 30) & (idx < 40)
    g.ndata["test_mask"] = idx >= 40
    return g


def test_custom_link_folder_gets_seeded_negatives(tmp_path):
    root = tmp_path / "mylink"
    rng = np.random.default_rng(0)
    n = 3000  # more nodes than negatives, so none has to repeat
    L.write_raw(str(root), edges=rng.integers(0, n, size=(2, 6000)), num_nodes=n, feat=rng.normal(size=(n, 8)))
    L.write_link_split(str(root), "mine", {p: {"source_node": np.arange(10) + k, "target_node": np.arange(10) + 50}
                                          for k, p in enumerate(("train", "valid", "test"))})
    L.mark_release(str(root))
    d = load_dataset(cfg(tmp_path, name="custom", kind="custom", task="link", path=str(root)))
    neg = d.link_split["valid"]["target_node_neg"]
    assert d.metric == "mrr" and neg.shape == (10, 1000)
    assert not bool((neg == d.link_split["valid"]["source_node"][:, None]).any())
    again = load_dataset(cfg(tmp_path, name="custom", kind="custom", task="link", path=str(root)))
    assert torch.equal(again.link_split["test"]["target_node_neg"], d.link_split["test"]["target_node_neg"])


def test_custom_file(tmp_path):
    g = _small_graph()
    p = tmp_path / "g.bin"
    dgl.save_graphs(str(p), [g])
    d = load_dataset(cfg(tmp_path, name="custom", kind="custom", num_classes=0, path=str(p)))
    assert d.num_classes == 3 and d.graph.ndata["label"].dtype == torch.int64
    assert torch.equal(d.graph.ndata["feat"], g.ndata["feat"])
    assert int(d.graph.ndata["train_mask"].sum()) == 30
    with pytest.raises(DatasetError, match="dataset.num_classes=3"):
        load_dataset(cfg(tmp_path, name="custom", kind="custom", num_classes=2, path=str(p)))


def test_custom_file_missing_or_bad_field(tmp_path):
    g = _small_graph()
    del g.ndata["label"]
    p = tmp_path / "g.bin"
    dgl.save_graphs(str(p), [g])
    with pytest.raises(DatasetError, match=r"g\.bin: node data 'label' missing; expected feat"):
        load_dataset(cfg(tmp_path, name="custom", kind="custom", num_classes=0, path=str(p)))
    g = _small_graph()
    g.ndata["label"] = g.ndata["label"].float()
    dgl.save_graphs(str(p), [g])
    with pytest.raises(DatasetError, match="'label' is torch.float32"):
        load_dataset(cfg(tmp_path, name="custom", kind="custom", num_classes=0, path=str(p)))
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(cfg(tmp_path, name="custom", kind="custom", num_classes=0, path=str(tmp_path / "nope.bin")))
    (tmp_path / "junk.bin").write_bytes(b"not a graph")
    with pytest.raises(DatasetError, match="dgl.load_graphs"):
        load_dataset(cfg(tmp_path, name="custom", kind="custom", num_classes=0, path=str(tmp_path / "junk.bin")))


def test_non_finite_features_are_refused_at_load(tmp_path):
    g = _small_graph()
    g.ndata["feat"][[3, 7, 9]] = torch.tensor(float("nan"))
    g.ndata["feat"][7, 0] = float("inf")
    p = tmp_path / "g.bin"
    dgl.save_graphs(str(p), [g])
    with pytest.raises(DatasetError) as e:
        load_dataset(cfg(tmp_path, name="custom", kind="custom", num_classes=0, path=str(p)))
    msg = str(e.value)
    assert "'feat' holds NaN or infinite values in 3 of 50 rows (first: node 3)" in msg
    assert "\n" not in msg


def test_split_file_that_would_run_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("this must not run",))

    f = tmp_path / "train.pt"
    torch.save({"source_node": Evil()}, f)
    with pytest.raises(DatasetError, match=r"train\.pt refers to .*print.*refused"):
        L.load_split_file(str(f))
    torch.save({"source_node": np.arange(4), "w": np.ones(2, dtype=np.float32)}, f)
    if not WEIGHTS_ONLY_TAKES_NUMPY:  # torch<2.4: refused too, saying which torch reads it
        with pytest.raises(DatasetError, match=r"train\.pt holds numpy arrays.*torch>=2\.4"):
            L.load_split_file(str(f))
        return
    assert L.load_split_file(str(f))["source_node"].tolist() == [0, 1, 2, 3]


def _write_fake_arxiv(d, n=300, with_release=True):
    """A tiny graph in ogbn-arxiv's exact layout (labels < 40, node_year, split/time)."""
    rng = np.random.default_rng(0)
    edges = rng.integers(0, n, size=(2, 1500))
    L.write_raw(str(d), edges=edges, num_nodes=n, feat=rng.normal(size=(n, 128)),
                label=rng.integers(0, 40, size=n), extra_node={"node_year": rng.integers(1990, 2020, size=n)})
    perm = rng.permutation(n)
    L.write_node_split(str(d), "time", {"train": perm[:150], "valid": perm[150:200], "test": perm[200:]})
    if with_release:
        L.mark_release(str(d))


def test_custom_ogb_folder(tmp_path):
    _write_fake_arxiv(tmp_path / "mine")
    d = load_dataset(cfg(tmp_path, name="custom", kind="custom", num_classes=0, path=str(tmp_path / "mine")))
    assert d.graph.num_nodes() == 300 and int(d.graph.ndata["test_mask"].sum()) == 100
    assert osp.isfile(tmp_path / "mine" / L.PROCESSED)


# ---------------------------------------------------------------- real OGB (offline)

def test_real_ogb_loader_reads_canonical_folder(tmp_path):
    _write_fake_arxiv(tmp_path / "ogbn_arxiv")
    d = load_dataset(cfg(tmp_path, name="ogbn-arxiv", kind="ogb"))
    assert d.num_classes == 40 and d.graph.num_nodes() == 300
    assert int(d.graph.ndata["train_mask"].sum()) == 150


@pytest.mark.skipif(not WEIGHTS_ONLY_TAKES_NUMPY, reason="torch<2.4 cannot load numpy arrays weights-only "
                    "(docs/limitations.md)")
def test_real_ogb_link_reads_numpy_pickled_splits(tmp_path):
    # OGB's own citation2 split files are pickled dicts of numpy arrays (torch>=2.6 weights_only trap)
    root = tmp_path / "ogbl_citation2"
    rng = np.random.default_rng(0)
    n = 100
    L.write_raw(str(root), edges=rng.integers(0, n, size=(2, 400)), num_nodes=n, feat=rng.normal(size=(n, 8)),
                extra_node={"node_year": rng.integers(1990, 2020, size=n)})
    sdir = root / "split" / "time"
    sdir.mkdir(parents=True)
    torch.save({"source_node": np.arange(10), "target_node": np.arange(10)}, sdir / "train.pt")
    for part in ("valid", "test"):
        torch.save({"source_node": np.arange(5), "target_node": np.arange(5) + 1,
                    "target_node_neg": rng.integers(0, n, size=(5, 1000))}, sdir / f"{part}.pt")
    L.mark_release(str(root))
    d = load_dataset(cfg(tmp_path, name="ogbl-citation2", kind="ogb", task="link"))
    assert d.metric == "mrr" and d.link_split["valid"]["target_node_neg"].shape == (5, 1000)
    assert torch.is_tensor(d.link_split["train"]["source_node"])


def test_missing_ogb_offline_names_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DEGNN_OFFLINE", "1")
    with pytest.raises(DatasetError, match=str(tmp_path / "ogbn_products")):
        load_dataset(cfg(tmp_path, name="ogbn-products", kind="ogb"))


def test_missing_ogb_download_failure_names_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("DEGNN_OFFLINE", raising=False)

    def no_network(*a, **k):
        raise urllib.error.URLError("network is unreachable (test)")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.setattr("degnn.data.ogb_real._reachable", lambda url: True)  # reach ogb's own urlopen
    with pytest.raises(DatasetError, match=r"download failed.*" + str(tmp_path / "ogbn_arxiv")):
        load_dataset(cfg(tmp_path, name="ogbn-arxiv", kind="ogb"))


def test_missing_ogb_unreachable_host_names_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("DEGNN_OFFLINE", raising=False)

    def no_route(*a, **k):
        raise OSError("no route to host (test)")

    monkeypatch.setattr("socket.create_connection", no_route)
    with pytest.raises(DatasetError, match=r"unreachable.*" + str(tmp_path / "ogbl_citation2")):
        load_dataset(cfg(tmp_path, name="ogbl-citation2", kind="ogb", task="link"))


def test_large_download_prompt_without_terminal_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("DEGNN_OFFLINE", raising=False)

    class Big:  # what urlopen returns for a 2 GB zip: ogb then asks "proceed? (y/N)" on stdin
        def info(self):
            return {"Content-Length": str(2 << 30)}

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: Big())
    monkeypatch.setattr("degnn.data.ogb_real._reachable", lambda url: True)
    with pytest.raises(DatasetError, match=r"no terminal.*" + str(tmp_path / "ogbn_products")):
        load_dataset(cfg(tmp_path, name="ogbn-products", kind="ogb"))


def test_ogb_folder_without_release_never_prompts(tmp_path, monkeypatch):
    monkeypatch.setenv("DEGNN_OFFLINE", "1")
    _write_fake_arxiv(tmp_path / "ogbn_arxiv", with_release=False)
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("ogb prompted on stdin"))
    with pytest.raises(DatasetError, match="RELEASE_v1.txt"):
        load_dataset(cfg(tmp_path, name="ogbn-arxiv", kind="ogb"))


def test_truncated_gzip_names_file(tmp_path):
    _write_fake_arxiv(tmp_path / "ogbn_arxiv")
    p = tmp_path / "ogbn_arxiv" / "raw" / "edge.csv.gz"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=r"edge\.csv\.gz is corrupted or truncated; delete the folder"):
        load_dataset(cfg(tmp_path, name="ogbn-arxiv", kind="ogb"))


def test_corrupted_processed_cache(tmp_path):
    _write_fake_arxiv(tmp_path / "ogbn_arxiv")
    load_dataset(cfg(tmp_path, name="ogbn-arxiv", kind="ogb"))
    (tmp_path / "ogbn_arxiv" / L.PROCESSED).write_bytes(b"garbage")
    with pytest.raises(DatasetError, match="processed/"):
        load_dataset(cfg(tmp_path, name="ogbn-arxiv", kind="ogb"))


def test_unsupported_ogb_name(tmp_path):
    with pytest.raises(DatasetError, match="not supported"):
        load_dataset(cfg(tmp_path, name="ogbn-mag", kind="ogb"))
    with pytest.raises(DatasetError, match="dataset.task=link"):
        load_dataset(cfg(tmp_path, name="ogbl-citation2", kind="ogb", task="node"))


def test_hydra_yaml_and_relative_root(tiny, tiny_root, monkeypatch):
    from omegaconf import OmegaConf

    from degnn.config import CONF_DIR, DatasetConfig

    base = OmegaConf.structured(DatasetConfig)
    monkeypatch.chdir(tiny_root.parent)
    c = OmegaConf.merge(base, OmegaConf.load(osp.join(CONF_DIR, "dataset", "synthetic-tiny.yaml")),
                        {"root": tiny_root.name})  # relative: resolved against the current dir
    d = load_dataset(c)
    assert d.info["dir"] == tiny.info["dir"]
    c = OmegaConf.merge(base, OmegaConf.load(osp.join(CONF_DIR, "dataset", "custom.yaml")))
    with pytest.raises(DatasetError, match="dataset.path="):  # `path: ???` unset
        load_dataset(c)


def test_dataset_version_changes_with_the_data(tmp_path, monkeypatch):
    """Caches built from a dataset (partitions) key on dataset_version: new data, new key."""
    import os

    from degnn.data import dataset_version
    from degnn.data import synthetic

    cfg = {"name": "synthetic-tiny", "kind": "synthetic", "num_nodes": 2000, "num_classes": 8, "root": str(tmp_path)}
    before = dataset_version(cfg)
    monkeypatch.setattr(synthetic, "GEN_VERSION", synthetic.GEN_VERSION + 1)
    assert dataset_version(cfg) != before

    f = tmp_path / "g.bin"
    f.write_bytes(b"x")
    custom = {"name": "custom", "kind": "custom", "path": str(f)}
    v1 = dataset_version(custom)
    os.utime(f, (1, 1))
    assert dataset_version(custom) != v1
