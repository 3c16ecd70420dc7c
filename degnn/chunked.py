"""A graph stored in chunks (DGL's chunked graph format), read and written a block at a time.

The layout is the one DGL's distributed partitioning pipeline reads (its "chunked graph format"),
restricted to one node type and one edge type, so the same folder also goes through DGL's
ParMETIS pipeline (docs/usage.md, "Graphs bigger than one machine"):

    <dir>/metadata.json   graph_name, node_type ["_N"], num_nodes_per_chunk [[n0, n1, ...]],
                          edge_type ["_N:_E:_N"], num_edges_per_chunk [[e0, e1, ...]],
                          edges {"_N:_E:_N": {format {name csv, delimiter " "}, data [files]}},
                          node_data {"_N": {<name>: {format {name numpy}, data [files]}}},
                          edge_data {}
    edge chunks           text, one edge a line: "src dst" (node ids, global, 0-based)
    node data chunks      .npy, chunk i holds rows num_nodes_per_chunk[:i].sum() onwards

Node data a node task reads: feat (float, [N, F]), label (int, [N]), train_mask / val_mask /
test_mask ([N], 0/1). The graph is used as stored: no reverse edges are added, so a graph meant to
be undirected stores both directions.

Readers never hold a whole file: edges come in blocks of at most `rows` lines, node data in blocks
of rows read from the file (not memory-mapped: mapped pages would count in the reader's RSS).
Every problem with the folder (a chunk missing or truncated, a chunk of another length than the
metadata says, a node id out of range) is a ChunkedError naming the file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np


META = "metadata.json"
NTYPE = "_N"
ETYPE = "_N:_E:_N"
NODE_KEYS = ("feat", "label", "train_mask", "val_mask", "test_mask")


class ChunkedError(ValueError):
    """A chunked graph folder that does not hold what its metadata says (names the file); the
    dataset loader and the partitioner raise it on as their own error (DatasetError, PartitionError)."""


def _npy_header(path: Path) -> Tuple[Tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of a .npy file, checked against the file's size."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except FileNotFoundError:
        raise ChunkedError(f"chunk {path} is missing; restore it or rewrite the chunked graph") from None
    except (OSError, ValueError) as e:
        raise ChunkedError(f"chunk {path} is not a readable .npy file ({e}); rewrite it") from None
    if fortran:
        raise ChunkedError(f"chunk {path} is in Fortran order; save it with numpy.save of a C-ordered array")
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if os.path.getsize(path) < need:
        raise ChunkedError(f"chunk {path} is truncated ({os.path.getsize(path)} of {need} bytes); rewrite it")
    return tuple(int(s) for s in shape), dtype, offset


class ChunkedGraph:
    """A checked view of a chunked graph folder (metadata and every chunk's presence and length)."""

    def __init__(self, path: Path, meta: Dict[str, object]):
        self.path = path
        self.meta = meta
        self.graph_name = str(meta.get("graph_name", path.name))
        self.node_chunks: List[int] = [int(n) for n in meta["num_nodes_per_chunk"][0]]
        self.edge_files: List[Tuple[Path, int]] = list(zip(
            [self._file(f) for f in meta["edges"][ETYPE]["data"]],
            [int(e) for e in meta["num_edges_per_chunk"][0]]))
        self.num_nodes = int(sum(self.node_chunks))
        self.num_edges = int(sum(e for _, e in self.edge_files))
        nd = meta.get("node_data", {}).get(NTYPE, {})
        self.node_data: Dict[str, List[Path]] = {k: [self._file(f) for f in v["data"]] for k, v in nd.items()}

    def _file(self, f: str) -> Path:
        p = Path(f)
        return p if p.is_absolute() else self.path / p

    def field_shape(self, name: str) -> Tuple[Tuple[int, ...], np.dtype]:
        """(row shape, dtype) of node data `name` (from its first chunk)."""
        shape, dtype, _ = _npy_header(self.node_data[name][0])
        return shape[1:], dtype

    def node_blocks(self, name: str, rows: int) -> Iterator[Tuple[int, np.ndarray]]:
        """(first node id, rows) of node data `name`, at most `rows` rows at a time."""
        start = 0
        for path in self.node_data[name]:
            shape, dtype, offset = _npy_header(path)
            row_items = int(np.prod(shape[1:], dtype=np.int64))
            with open(path, "rb") as f:
                f.seek(offset)
                for lo in range(0, shape[0], max(1, rows)):
                    k = min(rows, shape[0] - lo)
                    a = np.fromfile(f, dtype=dtype, count=k * row_items).reshape((k,) + shape[1:])
                    yield start + lo, a
            start += shape[0]

    def edge_blocks(self, rows: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """(src, dst) int64 blocks of at most `rows` edges, in file order; checks every line."""
        import pandas as pd

        n = self.num_nodes
        for path, count in self.edge_files:
            seen = 0
            try:
                reader = pd.read_csv(path, sep=" ", header=None, names=["s", "d"], dtype=np.int64,
                                     engine="c", chunksize=max(1, rows))
                for block in reader:
                    a = block.to_numpy()
                    src, dst = a[:, 0].copy(), a[:, 1].copy()
                    del a, block
                    bad = (src < 0) | (src >= n) | (dst < 0) | (dst >= n)
                    if bad.any():
                        i = int(np.argmax(bad))
                        raise ChunkedError(
                            f"chunk {path} line {seen + i + 1}: edge {src[i]} {dst[i]} names a node "
                            f"outside 0..{n - 1} (the metadata's {n} nodes); fix the edge or num_nodes_per_chunk")
                    seen += len(src)
                    if seen > count:
                        break
                    yield src, dst
            except FileNotFoundError:
                raise ChunkedError(f"chunk {path} is missing; restore it or rewrite the chunked graph") from None
            except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
                if isinstance(e, ChunkedError):
                    raise
                if isinstance(e, pd.errors.EmptyDataError):
                    seen = 0
                else:
                    raise ChunkedError(f"chunk {path} has a line that is not two integers (truncated?): "
                                       f"{str(e).splitlines()[0]}; rewrite it") from None
            if seen != count:
                raise ChunkedError(f"chunk {path} has {'more than ' if seen > count else ''}{seen} edges but "
                                   f"num_edges_per_chunk says {count}; rewrite the chunk or fix metadata.json")


def open_chunked(path) -> ChunkedGraph:
    """The chunked graph at `path` (a folder with metadata.json, or the file itself), checked:
    the metadata's keys, every chunk file present, every node data chunk of its chunk's length.
    (Edge chunks are text: their lengths and ids are checked as they are read, `edge_blocks`.)"""
    p = Path(str(path)).expanduser().absolute()
    mpath = p if p.is_file() else p / META
    if not mpath.is_file():
        raise ChunkedError(f"{mpath} does not exist; give the folder of a chunked graph (docs/usage.md)")
    try:
        meta = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise ChunkedError(f"{mpath} is not readable JSON ({e}); rewrite it") from None
    for key in ("num_nodes_per_chunk", "num_edges_per_chunk", "edges"):
        if key not in meta:
            raise ChunkedError(f"{mpath} has no {key}; it is not DGL's chunked graph format (docs/usage.md)")
    if meta.get("node_type", [NTYPE]) != [NTYPE] or meta.get("edge_type", [ETYPE]) != [ETYPE] \
            or ETYPE not in meta["edges"]:
        raise ChunkedError(f"{mpath}: node types {meta.get('node_type')} and edge types {meta.get('edge_type')}; "
                           f"degnn reads one node type {NTYPE} and one edge type {ETYPE}")
    g = ChunkedGraph(mpath.parent, meta)
    if len(g.edge_files) != len(meta["edges"][ETYPE]["data"]):
        raise ChunkedError(f"{mpath}: {len(meta['edges'][ETYPE]['data'])} edge files but "
                           f"{len(g.edge_files)} counts in num_edges_per_chunk; make them agree")
    fmt = meta["edges"][ETYPE].get("format", {})
    if fmt.get("name", "csv") != "csv" or fmt.get("delimiter", " ") != " ":
        raise ChunkedError(f"{mpath}: edge format {fmt}; degnn reads space-separated csv edge chunks")
    for path, count in g.edge_files:
        if not path.is_file():
            raise ChunkedError(f"chunk {path} is missing; restore it or rewrite the chunked graph")
        # a text chunk cut short mid-line may still parse ("12 3" of "12 345"): every line ends in \n
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size:
                f.seek(size - 1)
            if (size or count) and (not size or f.read(1) != b"\n"):
                raise ChunkedError(f"chunk {path} does not end with a newline (truncated?); rewrite it")
    for name, files in g.node_data.items():
        if len(files) != len(g.node_chunks):
            raise ChunkedError(f"{mpath}: node data {name} has {len(files)} chunks but num_nodes_per_chunk "
                               f"has {len(g.node_chunks)}; make them agree")
        row = None
        for f, n in zip(files, g.node_chunks):
            shape, dtype, _ = _npy_header(f)
            if shape[0] != n:
                raise ChunkedError(f"chunk {f} has {shape[0]} rows but num_nodes_per_chunk says {n}; "
                                   f"rewrite the chunk or fix metadata.json")
            if row is not None and (shape[1:], dtype) != row:
                raise ChunkedError(f"chunk {f} holds {dtype} rows of shape {shape[1:]} but the first chunk "
                                   f"{row[1]} rows of shape {row[0]}; write every chunk alike")
            row = (shape[1:], dtype)
    return g


class ChunkedWriter:
    """Writes a chunked graph: edge blocks and node data blocks appended as chunks, then metadata.

    Edges are written as zero-padded fixed-width decimals ("00012 00345"): formatting them with
    numpy arithmetic is ~20x faster than pandas' to_csv, and csv readers parse the padding away."""

    def __init__(self, out: Path, num_nodes: int):
        self.out = Path(out)
        self.num_nodes = int(num_nodes)
        self.width = len(str(max(self.num_nodes - 1, 0)))
        (self.out / "edges").mkdir(parents=True, exist_ok=True)
        (self.out / "node_data").mkdir(parents=True, exist_ok=True)
        self.edge_files: List[str] = []
        self.edge_counts: List[int] = []
        self.node_files: Dict[str, List[str]] = {}
        self.node_counts: Dict[str, List[int]] = {}

    def _digits(self, v: np.ndarray, buf: np.ndarray, col: int) -> None:
        v = v.astype(np.int64, copy=True)
        for k in range(self.width - 1, -1, -1):
            buf[:, col + k] = 48 + (v % 10)
            v //= 10

    def add_edges(self, src: np.ndarray, dst: np.ndarray) -> None:
        w = self.width
        buf = np.empty((len(src), 2 * w + 2), dtype=np.uint8)
        self._digits(src, buf, 0)
        buf[:, w] = ord(" ")
        self._digits(dst, buf, w + 1)
        buf[:, 2 * w + 1] = ord("\n")
        name = f"edges/edges-{len(self.edge_files):05d}.csv"
        buf.tofile(self.out / name)
        self.edge_files.append(name)
        self.edge_counts.append(int(len(src)))

    def add_node_rows(self, name: str, rows: np.ndarray) -> None:
        files = self.node_files.setdefault(name, [])
        f = f"node_data/{name}-{len(files):05d}.npy"
        np.save(self.out / f, np.ascontiguousarray(rows))
        files.append(f)
        self.node_counts.setdefault(name, []).append(int(len(rows)))

    def finish(self, graph_name: str, extra: Optional[Dict[str, object]] = None) -> Path:
        counts = list(self.node_counts.values())
        if not counts or any(c != counts[0] for c in counts) or sum(counts[0]) != self.num_nodes:
            raise ChunkedError(f"internal: node data chunks {self.node_counts} do not cover {self.num_nodes} nodes alike")
        meta = {
            "graph_name": graph_name,
            "node_type": [NTYPE],
            "num_nodes_per_chunk": [counts[0]],
            "edge_type": [ETYPE],
            "num_edges_per_chunk": [self.edge_counts],
            "edges": {ETYPE: {"format": {"name": "csv", "delimiter": " "}, "data": self.edge_files}},
            "node_data": {NTYPE: {k: {"format": {"name": "numpy"}, "data": v} for k, v in self.node_files.items()}},
            "edge_data": {},
        }
        if extra:
            meta["degnn"] = extra  # ours; DGL's pipeline reads only the keys above
        path = self.out / META
        path.write_text(json.dumps(meta, indent=1))
        return path


def read_whole(g: ChunkedGraph, rows: int = 1 << 22):
    """(src, dst, {name: array}) of the whole graph in memory: for graphs that fit one process."""
    src, dst = [], []
    for s, d in g.edge_blocks(rows):
        src.append(s)
        dst.append(d)
    nd = {name: np.concatenate([b for _, b in g.node_blocks(name, rows)]) for name in g.node_data}
    empty = np.zeros(0, dtype=np.int64)
    return (np.concatenate(src) if src else empty), (np.concatenate(dst) if dst else empty), nd
