"""degnn.data.debian: the package graph from an APT index, a small fake one and the machine's own."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from degnn.data import DatasetError, dataset_version, graph_stats, load_dataset
from degnn.data import debian as D

# alpha (libs) Depends on beta, on gamma | delta (delta is no package: dropped), on the virtual
# mta (provided by exim and postfix) and on itself; Pre-Depends on beta again (one edge);
# Recommends epsilon:any. beta appears twice: the newer version's section (python) wins.
# epsilon's section is contrib/libs; gamma's long description mentions "python" (a section name).
INDEX = """\
Package: alpha
Version: 1.0-1
Section: libs
Depends: beta (>= 1.0), gamma | delta (<< 2), mta, alpha
Pre-Depends: beta
Recommends: epsilon:any
Description: shared library for alpha widgets
Tag: role::shared-lib

Package: beta
Version: 2.0~rc1-1
Section: utils
Description: beta tool, release candidate

Package: beta
Version: 2.0-1
Section: python
Description: beta tool for frobnicating

Package: gamma
Version: 1:0.5
Section: libs
Description: gamma widgets
 A long description that says python
 .
 and frobnicates widgets.

Package: epsilon
Version: 3
Section: contrib/libs
Description: epsilon runtime files

Package: exim
Version: 4.96-1
Section: mail
Provides: mta, exim4-daemon (= 4.96)
Description: mail transport agent

Package: postfix
Version: 3.7-1
Section: mail
Provides: mta
Depends: exim4-daemon
Description: another mail transport agent
"""


def undirected(edges, names):
    return {(names[u], names[v]) for u, v in edges.T}


def test_versions_follow_dpkg():
    if shutil.which("dpkg") is None:
        pytest.skip("no dpkg on this machine: a saved index's later stanza wins")
    assert D.newer("1.0", "1.0~rc1") and not D.newer("1.0~rc1", "1.0")
    assert D.newer("1:0.1", "2.0")  # the epoch first
    assert D.newer("1.0-1+deb12u1", "1.0-1") and D.newer("1.10", "1.9") and not D.newer("2.0-1", "2.0-1")


def test_parse_fake_index():
    edges, label, docs, classes, names = D.parse(INDEX, num_classes=3)
    assert names == ["alpha", "beta", "epsilon", "exim", "gamma", "postfix"]  # sorted, beta once
    assert (edges[0] < edges[1]).all()
    assert undirected(edges, names) == {
        ("alpha", "beta"), ("alpha", "gamma"), ("alpha", "exim"), ("alpha", "postfix"),
        ("alpha", "epsilon"), ("exim", "postfix")}  # no delta, no self-loop, virtuals -> providers
    # libs (alpha, gamma, epsilon from contrib/) is the largest section, then mail; python is "other"
    assert classes == ["libs", "mail", "other"]
    assert dict(zip(names, label.tolist())) == {"alpha": 0, "beta": 2, "epsilon": 0, "exim": 1,
                                                "gamma": 0, "postfix": 1}
    doc = dict(zip(names, docs))
    assert doc["beta"] == "beta tool for frobnicating"  # the newest version's description
    assert "python" not in doc["gamma"] and "frobnicates" in doc["gamma"]  # long text, section names gone
    assert "mail" not in doc["exim"] and "role" not in doc["alpha"]  # neither section nor Tag


def test_load_fake_index_through_ogb(tmp_path, capsys):
    f = tmp_path / "index.txt"
    f.write_text(INDEX)
    cfg = {"name": "debian", "kind": "debian", "root": str(tmp_path / "data"), "path": str(f),
           "num_classes": 3, "seed": 0}
    d = load_dataset(cfg)
    g = d.graph
    assert g.num_nodes() == 6 and g.num_edges() == 12 and d.num_classes == 3  # both directions
    assert g.ndata["feat"].shape == (6, 128)
    assert int(g.ndata["train_mask"].sum() + g.ndata["val_mask"].sum() + g.ndata["test_mask"].sum()) == 6
    s = d.info["graph_stats"]
    assert s["nodes"] == 6 and s["edges"] == 6 and s["degree_max"] == 5 and s["classes"] == 3
    assert "debian: 6 nodes, 6 undirected edges" in capsys.readouterr().err  # printed at build
    again = load_dataset(cfg)  # cached: the same folder
    assert again.info["dir"] == d.info["dir"]
    other = load_dataset({**cfg, "root": str(tmp_path / "elsewhere")}).graph  # built again: the same graph
    assert (other.ndata["feat"] == g.ndata["feat"]).all() and (other.ndata["label"] == g.ndata["label"]).all()
    assert [t.tolist() for t in other.edges()] == [t.tolist() for t in g.edges()]
    v = dataset_version(cfg)
    f.write_text(INDEX.replace("Section: mail", "Section: net"))
    assert dataset_version(cfg) != v  # a changed index is new data


def test_graph_stats_by_hand():
    # a path 0-1-2-3, labels 0 0 1 1: 2 of 3 edges join a class to itself
    src, dst = np.array([0, 1, 1, 2, 2, 3]), np.array([1, 0, 2, 1, 3, 2])
    s = graph_stats(src, dst, np.array([0, 0, 1, 1]), 4, 2)
    assert s["edges"] == 3 and s["degree_max"] == 2 and s["isolated"] == 0
    assert s["edge_homophily"] == pytest.approx(2 / 3, abs=1e-4)
    assert s["adjusted_homophily"] == pytest.approx((2 / 3 - 0.5) / 0.5, abs=1e-4)
    # each class: 2 of its 3 edge ends stay in it, against a node share of 1/2; summed over the
    # classes, divided by C - 1
    assert s["class_homophily"] == pytest.approx(2 * (2 / 3 - 1 / 2) / 1, abs=1e-4)
    # an unlabelled node (-1, as papers100M has) counts for the degrees, not for the homophily
    s = graph_stats(np.r_[src, 3, 4], np.r_[dst, 4, 3], np.array([0, 0, 1, 1, -1]), 5, 2)
    assert s["edges"] == 4 and s["degree_max"] == 2 and s["classes"] == 2
    assert s["edge_homophily"] == pytest.approx(2 / 3, abs=1e-4)


def test_empty_index_names_the_fix(tmp_path, monkeypatch):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DatasetError, match="run `apt-get update`"):
        load_dataset({"name": "debian", "kind": "debian", "root": str(tmp_path), "path": str(empty)})
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-cache").write_text("#!/bin/sh\nexit 0\n")  # an index never fetched prints nothing
    (fake / "apt-cache").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    with pytest.raises(DatasetError, match="this machine's APT index lists no packages; run `apt-get update`"):
        load_dataset({"name": "debian", "kind": "debian", "root": str(tmp_path)})


def _has_index() -> bool:
    exe = shutil.which("apt-cache")
    if exe is None:
        return False
    out = subprocess.run([exe, "dumpavail"], capture_output=True, text=True).stdout
    return "Package:" in out[:1000]


@pytest.mark.skipif(not _has_index(), reason="no APT package index here (apt-cache missing, or run apt-get update)")
def test_real_index():
    """The machine's index parses into a graph of the documented shape (the OGB round trip is the fake's)."""
    edges, label, docs, classes, names = D.parse(D.read_index(None))
    s = graph_stats(np.concatenate([edges[0], edges[1]]),
                    np.concatenate([edges[1], edges[0]]), label, len(names), D.NUM_CLASSES)
    assert s["nodes"] > 10_000 and len(classes) == D.NUM_CLASSES == 25 and s["classes"] == 25
    assert classes[-1] == "other" and s["degree_mean"] > 3
    assert 0.2 < s["edge_homophily"] < 0.9
