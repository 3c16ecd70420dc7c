"""WordNet 3.0 as a real graph (Debian's wordnet-base): written in OGB's layout, read back by ogb.

- nodes: synsets of data.noun/verb/adj/adv (117,659 in WordNet 3.0);
- edges: every pointer of every synset (hypernym, part-of, antonym, derivation, ...), made
  undirected, duplicates and self-loops dropped;
- label: the synset's lexicographer file number (noun.animal, verb.motion, ...; 45 classes);
- features: a hashed TF-IDF of the gloss and the synset's words, `feat_dim` buckets (128 by
  default), hashed with zlib.crc32 so it is the same in every process (Python's hash() is salted);
- node task: a seeded random 60/20/20 split.
- link task (wordnet-link): 2,000 undirected edges each (about 1.1%) are held out as valid and
  test and removed from the training graph; each held-out edge gets 1000 fixed negative targets
  (OGB's citation2 protocol; linksplit.py draws them, seeded), metric MRR. Written in OGB's link
  layout (split/random/split_dict.pt) and read by DglLinkPropPredDataset.
"""
from __future__ import annotations

import hashlib
import json
import os.path as osp
import re
import zlib
from typing import Dict, List, Tuple

import numpy as np

from .graph import DatasetError, GraphData, config_value, node_masks, resolve_root
from . import ogb_layout as L
from .evaluate import accuracy_evaluator, mrr_evaluator
from .linksplit import hold_out, link_knobs

FILES = ("noun", "verb", "adj", "adv")
NUM_CLASSES = 45  # lexicographer files 00..44
# pointer pos letters -> the data file holding that synset ('s' = adjective satellite, in data.adj)
POS_FILE = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
WN_VERSION = 1  # bump when parsing/features change
_TOKEN = re.compile(r"[a-z]+")


def parse(wordnet_dir: str) -> Tuple[np.ndarray, np.ndarray, List[str]]:
    """(edges [2,E] undirected u<v, label [N], documents [N]) from the data.* files."""
    ids: Dict[Tuple[str, int], int] = {}
    labels: List[int] = []
    docs: List[str] = []
    raw_ptrs: List[Tuple[int, str, int]] = []
    for fn in FILES:
        path = osp.join(wordnet_dir, "data." + fn)
        if not osp.isfile(path):
            raise DatasetError(f"WordNet file {path} missing; install Debian's wordnet-base "
                               f"(apt-get install wordnet-base) or set dataset.wordnet_dir to a folder with data.{fn}")
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                if line.startswith("  "):  # license header
                    continue
                try:
                    head, _, gloss = line.partition(" | ")
                    t = head.split()
                    me = len(ids)
                    ids[(fn, int(t[0]))] = me
                    labels.append(int(t[1]))
                    w_cnt = int(t[3], 16)
                    # adjective markers like "(a)" / "(p)" are not part of the word
                    words = [re.sub(r"\(.*\)$", "", w).replace("_", " ") for w in t[4:4 + 2 * w_cnt:2]]
                    i = 4 + 2 * w_cnt
                    p_cnt = int(t[i])
                    for j in range(p_cnt):
                        _, off, pos, _ = t[i + 1 + 4 * j: i + 5 + 4 * j]
                        raw_ptrs.append((me, POS_FILE[pos], int(off)))
                    docs.append(" ".join(words) + " " + gloss)
                except (ValueError, IndexError, KeyError) as exc:
                    raise DatasetError(f"WordNet file {path} line {lineno} is malformed ({exc}); "
                                       f"reinstall wordnet-base or point dataset.wordnet_dir elsewhere") from exc
    src, dst = [], []
    for me, fn, off in raw_ptrs:
        other = ids.get((fn, off))
        if other is not None and other != me:
            src.append(min(me, other))
            dst.append(max(me, other))
    n = len(ids)
    key = np.unique(np.asarray(src, dtype=np.int64) * n + np.asarray(dst, dtype=np.int64))
    return np.stack([key // n, key % n]), np.asarray(labels, dtype=np.int64), docs


def tfidf_features(docs: List[str], dim: int) -> np.ndarray:
    """Hashed TF-IDF: idf per token, token weight added into bucket crc32(token) % dim, rows L2-normed."""
    vocab: Dict[str, int] = {}
    rows, cols = [], []
    for i, doc in enumerate(docs):
        for tok in _TOKEN.findall(doc.lower()):
            rows.append(i)
            cols.append(vocab.setdefault(tok, len(vocab)))
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    n, v = len(docs), len(vocab)
    pair = np.unique(rows * v + cols, return_counts=True)
    doc_of, tok_of, tf = pair[0] // v, pair[0] % v, pair[1].astype(np.float64)
    df = np.bincount(tok_of, minlength=v)
    idf = np.log((1.0 + n) / (1.0 + df)) + 1.0
    bucket_of_tok = np.zeros(v, dtype=np.int64)
    for tok, t in vocab.items():
        bucket_of_tok[t] = zlib.crc32(tok.encode()) % dim
    feat = np.zeros((n, dim), dtype=np.float64)
    np.add.at(feat, (doc_of, bucket_of_tok[tok_of]), tf * idf[tok_of])
    norm = np.linalg.norm(feat, axis=1, keepdims=True)
    return (feat / np.maximum(norm, 1e-12)).astype(np.float32)


def _knobs(cfg) -> Dict[str, object]:
    k = {"v": WN_VERSION, "task": config_value(cfg, "task", "node"),
         "seed": int(config_value(cfg, "seed", 0)),
         "feat_dim": int(config_value(cfg, "feat_dim", 128)) or 128,
         "wordnet_dir": osp.realpath(str(config_value(cfg, "wordnet_dir", "/usr/share/wordnet")))}
    if k["task"] == "link":  # the held-out edges and negatives (node-task caches keep their key)
        k["link_split"] = link_knobs()
    return k


def _build(tmp: str, name: str, k: Dict[str, object]) -> None:
    edges, label, docs = parse(k["wordnet_dir"])
    feat = tfidf_features(docs, k["feat_dim"])
    n = label.shape[0]
    rng = np.random.default_rng(k["seed"])
    if k["task"] == "node":
        L.write_raw(tmp, edges=edges, num_nodes=n, feat=feat, label=label)
        perm = rng.permutation(n)
        a, b = int(0.6 * n), int(0.8 * n)
        L.write_node_split(tmp, "random", {"train": perm[:a], "valid": perm[a:b], "test": perm[b:]})
    else:
        train_edges, split = hold_out(edges, n, rng)
        L.write_raw(tmp, edges=train_edges, num_nodes=n, feat=feat)
        L.write_link_split(tmp, "random", split)
    L.mark_release(tmp, k)
    _read(name, tmp, k)  # ogb builds processed/ inside the temp folder


def _meta(name: str, d: str, k: Dict[str, object]):
    # edges are stored once (u<v); ogb adds the reverse copies, like it does for ogbn-products
    if k["task"] == "node":
        return L.node_meta(d, name, NUM_CLASSES, "random", add_inverse_edge=True)
    return L.link_meta(d, name, "random", add_inverse_edge=True)


def _read(name: str, d: str, k: Dict[str, object]):
    if k["task"] == "node":
        return L.read_node(name, d, _meta(name, d, k))
    return L.read_link(name, d, _meta(name, d, k))


def load_wordnet(cfg) -> GraphData:
    name = config_value(cfg, "name")
    k = _knobs(cfg)
    if not osp.isdir(k["wordnet_dir"]):
        raise DatasetError(f"WordNet folder {k['wordnet_dir']} missing; install Debian's wordnet-base "
                           f"(apt-get install wordnet-base) or set dataset.wordnet_dir")
    h = hashlib.sha1(json.dumps(k, sort_keys=True).encode()).hexdigest()[:10]
    d = osp.join(resolve_root(cfg), f"{name.replace('-', '_')}_{h}")
    if not L.is_complete(d):
        L.build_atomically(d, lambda tmp: _build(tmp, name, k))
    if k["task"] == "node":
        _, g, labels, split = _read(name, d, k)
        g.ndata["label"] = labels.reshape(-1)
        g.ndata.update(node_masks(g.num_nodes(), split))
        return GraphData(name=name, task="node", graph=g, num_classes=NUM_CLASSES, metric="acc",
                         evaluate=accuracy_evaluator(), info={"dir": d, "source": "wordnet"})
    _, g, split = _read(name, d, k)
    return GraphData(name=name, task="link", graph=g, num_classes=0, metric="mrr", evaluate=mrr_evaluator(),
                     link_split=split, info={"dir": d, "source": "wordnet",
                                             "num_neg": int(split["valid"]["target_node_neg"].shape[1])})
