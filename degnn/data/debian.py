"""The Debian package graph, from the machine's own APT index: written in OGB's layout, read back by ogb.

Built offline from `apt-cache dumpavail` (every available binary package's stanza, from the lists
`apt-get update` fetched into /var/lib/apt/lists; about 63,700 packages on bookworm main + security
+ updates), or from a saved copy of that output (`dataset.path`).

- nodes: binary packages, one per name (the newest version when a name appears more than once, by
  Debian's version order), numbered in sorted name order;
- edges: Depends, Pre-Depends and Recommends. Every alternative of `a | b` gets an edge; a name no
  package has is a virtual package and gets an edge to each package that Provides it; a name that
  is neither is dropped (a package of another suite or architecture). Made undirected, duplicates and
  self-loops dropped;
- label: the package's Section without its archive area (`contrib/`, `non-free/`, ...): the
  `num_classes - 1` most common sections (25 classes by default: 24 sections and `other`, which
  holds every rarer section), class ids in order of size, ties by name;
- features: the hashed TF-IDF of wordnet.py over the package's description (the short one and the
  long one where the index has it; bookworm's index has only the short one), with every token that
  is a section name (`python`, `perl`, `doc`, `games`, ...) removed. Neither the package's name, nor
  its Section, Tag, Source or Priority enters the features;
- node task: a seeded random 60/20/20 split.
"""
from __future__ import annotations

import hashlib
import json
import os.path as osp
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import numpy as np

from .graph import DatasetError, GraphData, config_value, graph_stats, node_masks, resolve_root
from . import ogb_layout as L
from .evaluate import accuracy_evaluator
from .wordnet import tfidf_features

DEB_VERSION = 1  # bump when parsing/features change
NUM_CLASSES = 25
RELATIONS = ("Depends", "Pre-Depends", "Recommends")
FIELDS = ("Package", "Version", "Section", "Description", "Provides") + RELATIONS
OTHER = "other"
_TOKEN = re.compile(r"[a-z]+")
_FIX = ("run `apt-get update` (as root) to fetch the package lists, or set dataset.path to a file "
        "holding the output of `apt-cache dumpavail`")


# ---------------------------------------------------------------- Debian's version order

def newer(a: str, b: str) -> bool:
    """Whether Debian version `a` sorts after `b`, by dpkg's own order (`dpkg --compare-versions`).
    Only a saved index with one name twice needs it (dumpavail gives one stanza a name); without dpkg
    the later stanza wins."""
    exe = shutil.which("dpkg")
    if exe is None:
        return True
    return subprocess.run([exe, "--compare-versions", a or "0", "gt", b or "0"]).returncode == 0


# ---------------------------------------------------------------- the index

def read_index(path: Optional[str]) -> str:
    """The text of `apt-cache dumpavail`, or of the saved file `path`."""
    if path:
        path = osp.abspath(osp.expanduser(str(path)))
        if not osp.isfile(path):
            raise DatasetError(f"dataset.path {path} is not a file; save the index with "
                               f"`apt-cache dumpavail > FILE`, or unset dataset.path to read this machine's")
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        where = path
    else:
        exe = shutil.which("apt-cache")
        if exe is None:
            raise DatasetError("apt-cache not found: the Debian package graph needs APT (a Debian or "
                               "Ubuntu machine); set dataset.path to a saved `apt-cache dumpavail` file")
        proc = subprocess.run([exe, "dumpavail"], capture_output=True, text=True, errors="replace")
        if proc.returncode != 0:
            msg = (proc.stderr.strip().splitlines() or ["no message"])[0]
            raise DatasetError(f"apt-cache dumpavail failed ({msg}); {_FIX}")
        text = proc.stdout
        where = "this machine's APT index"
    if "\nPackage:" not in "\n" + text:
        raise DatasetError(f"{where} lists no packages; {_FIX}")
    return text


def parse_stanzas(text: str) -> Dict[str, Dict[str, str]]:
    """{package name: its fields (FIELDS only, continuation lines joined)}, the newest version of each."""
    out: Dict[str, Dict[str, str]] = {}
    for block in re.split(r"\n\s*\n", text):
        st: Dict[str, str] = {}
        key = None
        for line in block.split("\n"):
            if line[:1] in (" ", "\t"):
                if key is not None:
                    st[key] += "\n" + line[1:]
                continue
            k, sep, v = line.partition(":")
            key = k if sep and k in FIELDS else None
            if key is not None:
                st[key] = v.strip()
        name = st.get("Package")
        if not name:
            continue
        old = out.get(name)
        if old is None or newer(st.get("Version", ""), old.get("Version", "")):
            out[name] = st
    return out


def _names(field: str) -> List[List[str]]:
    """A relation field as [[alternative names], ...]: versions, architecture qualifiers, profiles gone."""
    groups = []
    for group in field.replace("\n", " ").split(","):
        alts = []
        for alt in group.split("|"):
            name = re.split(r"[\s(\[<]", alt.strip(), maxsplit=1)[0].split(":", 1)[0]
            if name:
                alts.append(name)
        if alts:
            groups.append(alts)
    return groups


def section_of(st: Dict[str, str]) -> str:
    return st.get("Section", "").strip().rpartition("/")[2] or OTHER


def parse(text: str, num_classes: int = NUM_CLASSES) -> Tuple[np.ndarray, np.ndarray, List[str], List[str], List[str]]:
    """(edges [2,E] undirected u<v, label [N], documents [N], class names, package names) of an index."""
    pkgs = parse_stanzas(text)
    names = sorted(pkgs)
    ids = {n: i for i, n in enumerate(names)}
    providers: Dict[str, List[int]] = {}
    for n in names:
        for alts in _names(pkgs[n].get("Provides", "")):
            providers.setdefault(alts[0], []).append(ids[n])
    src, dst = [], []
    for me, n in enumerate(names):
        st = pkgs[n]
        for rel in RELATIONS:
            for alts in _names(st.get(rel, "")):
                for a in alts:
                    targets = [ids[a]] if a in ids else providers.get(a, ())
                    for t in targets:
                        if t != me:
                            src.append(min(me, t))
                            dst.append(max(me, t))
    num = len(names)
    key = np.unique(np.asarray(src, dtype=np.int64) * num + np.asarray(dst, dtype=np.int64))
    edges = np.stack([key // num, key % num]) if len(key) else np.zeros((2, 0), dtype=np.int64)
    sections = [section_of(pkgs[n]) for n in names]
    counts: Dict[str, int] = {}
    for s in sections:
        counts[s] = counts.get(s, 0) + 1
    ranked = sorted((s for s in counts if s != OTHER), key=lambda s: (-counts[s], s))
    classes = ranked[:num_classes - 1] + [OTHER]
    cid = {s: i for i, s in enumerate(classes)}
    label = np.asarray([cid.get(s, num_classes - 1) for s in sections], dtype=np.int64)
    drop = {w for s in list(counts) + [OTHER] for w in _TOKEN.findall(s.lower())}
    docs = []
    for n in names:
        words = _TOKEN.findall(pkgs[n].get("Description", "").lower())
        docs.append(" ".join(w for w in words if w not in drop))
    return edges, label, docs, classes, names


# ---------------------------------------------------------------- the OGB-layout folder

def _knobs(cfg, text: Optional[str] = None) -> Dict[str, object]:
    path = config_value(cfg, "path")
    if text is None:
        text = read_index(path)
    return {"v": DEB_VERSION, "seed": int(config_value(cfg, "seed", 0)),
            "feat_dim": int(config_value(cfg, "feat_dim", 128)) or 128,
            "num_classes": int(config_value(cfg, "num_classes", 0)) or NUM_CLASSES,
            "index_sha1": hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()}


def _build(tmp: str, name: str, k: Dict[str, object], text: str) -> None:
    edges, label, docs, classes, names = parse(text, k["num_classes"])
    feat = tfidf_features(docs, k["feat_dim"])
    n = label.shape[0]
    L.write_raw(tmp, edges=edges, num_nodes=n, feat=feat, label=label)
    perm = np.random.default_rng(k["seed"]).permutation(n)
    a, b = int(0.6 * n), int(0.8 * n)
    L.write_node_split(tmp, "random", {"train": perm[:a], "valid": perm[a:b], "test": perm[b:]})
    stats = graph_stats(np.concatenate([edges[0], edges[1]]), np.concatenate([edges[1], edges[0]]),
                        label, n, k["num_classes"])
    with open(osp.join(tmp, "classes.json"), "w") as fh:
        json.dump({"classes": classes, "packages": names}, fh)
    with open(osp.join(tmp, "stats.json"), "w") as fh:
        json.dump(stats, fh, indent=1)
    print(f"{name}: " + format_stats(stats), file=sys.stderr)
    L.mark_release(tmp, k)
    L.read_node(name, tmp, _meta(name, tmp, k))  # ogb builds processed/ inside the temp folder


def format_stats(s: Dict[str, object]) -> str:
    return (f"{s['nodes']:,} nodes, {s['edges']:,} undirected edges, degree mean {s['degree_mean']} "
            f"median {s['degree_median']} max {s['degree_max']}, {s['classes']} classes, edge homophily "
            f"{s['edge_homophily']}, adjusted {s['adjusted_homophily']}, class-insensitive {s['class_homophily']}")


def _meta(name: str, d: str, k: Dict[str, object]):
    # edges are stored once (u<v); ogb adds the reverse copies, like it does for ogbn-products
    return L.node_meta(d, name, k["num_classes"], "random", add_inverse_edge=True)


def load_debian(cfg) -> GraphData:
    name = config_value(cfg, "name")
    if config_value(cfg, "task", "node") != "node":
        raise DatasetError(f"dataset {name}: the Debian package graph is a node-classification graph; "
                           f"use dataset.task=node")
    text = read_index(config_value(cfg, "path"))
    k = _knobs(cfg, text)
    h = hashlib.sha1(json.dumps(k, sort_keys=True).encode()).hexdigest()[:10]
    d = osp.join(resolve_root(cfg), f"{name.replace('-', '_')}_{h}")
    if not L.is_complete(d):
        L.build_atomically(d, lambda tmp: _build(tmp, name, k, text))
    _, g, labels, split = L.read_node(name, d, _meta(name, d, k))
    g.ndata["label"] = labels.reshape(-1)
    g.ndata.update(node_masks(g.num_nodes(), split))
    with open(osp.join(d, "classes.json")) as fh:
        classes = json.load(fh)["classes"]
    return GraphData(name=name, task="node", graph=g, num_classes=k["num_classes"], metric="acc",
                     evaluate=accuracy_evaluator(), info={"dir": d, "source": "apt", "classes": classes})
