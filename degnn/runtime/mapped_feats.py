"""Graph servers that load a part's structure and node features without a second copy in memory.

Structure: a part written by degnn has its CSC arrays beside graph.dgl (degnn/part_csc.py); the
server builds its graph over a memory map of them instead of loading graph.dgl into its heap and
building the CSC there, so its copy into shared memory reads page cache (load_part_mapped).

Node features: DGL's `DistGraphServer` reads `node_feat.dgl` whole into the heap (`load_tensors`)
and then copies every tensor into shared memory, so while it starts a server holds its features
twice: a server loading a quarter of bench=scale's 4M graph was killed by a 1.6 GiB memory cgroup,
and loads under 1.45 GiB this way. Here the server reads the same file through `numpy.memmap`
instead: the copy into shared memory pages the file in from the page cache, which the kernel can
reclaim, so only the shared-memory copy stays.

The file layout read here is DGL's tensor-dict format (degnn/tensor_dict.py lays it out).
Any file that does not parse exactly (another DGL version, a type this does not know, a size that
does not add up) is read by DGL's own `load_tensors`, as before; but a file shorter than its own
headers say (truncated: DGL's reader would read past its end, a server died of SIGSEGV on one) is
a PartitionFileError naming its path, and so is a `graph.dgl` DGL cannot load (`install`).
"""
from __future__ import annotations

import logging
import os
import struct
from typing import Dict, Optional

import numpy as np

from degnn.tensor_dict import ARRAY_MAGIC, CPU, DICT_MAGIC, DTYPES

log = logging.getLogger(__name__)

class _Unparsed(Exception):
    pass


class PartitionFileError(RuntimeError):
    """A part file that is truncated or damaged; the message is one line naming its path."""


def _refuse(path: str, what: str) -> PartitionFileError:
    return PartitionFileError(f"the partition file {path} is {what}; copy it again or partition "
                              f"again (a partition degnn caches: partition.verify=true checks it)")


def _layout(path: str):
    """[(name, dtype, shape, offset)] of a DGL tensor-dict file; _Unparsed where it is not one,
    PartitionFileError where its arrays end past the end of the file."""
    size = os.path.getsize(path)
    out = []
    with open(path, "rb") as f:
        def read(fmt):
            n = struct.calcsize(fmt)
            b = f.read(n)
            if len(b) != n:
                raise _Unparsed("truncated")
            return struct.unpack(fmt, b)

        magic, count, count2 = read("<QQQ")
        if magic != DICT_MAGIC or count != count2:
            raise _Unparsed("not a DGL tensor dict")
        for _ in range(count):
            (nlen,) = read("<Q")
            if nlen > 4096:
                raise _Unparsed("name too long")
            name = f.read(nlen).decode()
            magic, _, dev, _, ndim, code, bits, lanes = read("<QQiiiBBH")
            if magic != ARRAY_MAGIC or dev != CPU or lanes != 1 or (code, bits) not in DTYPES or not 0 <= ndim <= 8:
                raise _Unparsed(f"array {name}: unknown header")
            shape = read(f"<{ndim}q") if ndim else ()
            (nbytes,) = read("<q")
            dtype = np.dtype(DTYPES[(code, bits)])
            if nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
                raise _Unparsed(f"array {name}: size does not match its shape")
            out.append((name, dtype, tuple(shape), f.tell()))
            f.seek(nbytes, os.SEEK_CUR)
            if f.tell() > size:
                raise _refuse(path, f"truncated ({size} bytes; its array {name} ends at byte "
                                    f"{f.tell()})")
        if f.tell() != size:
            raise _Unparsed("trailing bytes")
    return out


def load_tensors_mapped(path: str) -> Optional[Dict[str, "object"]]:
    """The tensors of a DGL tensor-dict file as torch tensors over a private (copy-on-write)
    memory map of it, or None where the file does not parse."""
    import torch

    try:
        layout = _layout(path)
    except (_Unparsed, UnicodeDecodeError, struct.error) as e:
        log.info("%s: read by DGL (%s)", path, e)
        return None
    out = {}
    for name, dtype, shape, offset in layout:
        if int(np.prod(shape, dtype=np.int64)) == 0:  # memmap refuses empty arrays
            out[name] = torch.from_numpy(np.empty(shape, dtype=dtype))
        else:
            out[name] = torch.from_numpy(np.memmap(path, dtype=dtype, mode="c", offset=offset, shape=shape))
    return out


def load_part_mapped(graph_file: str, inner_only: bool = False):
    """The part graph of `graph_file` (a part's graph.dgl) built over a memory map of the CSC file
    degnn's writers put beside it (degnn/part_csc.py), or None where there is none or it does not
    parse (DGL then loads graph.dgl, as for a partition made elsewhere). `inner_only`: only the
    in-edges of the part's own nodes (degnn.part_csc.inner_edges_only), where the part allows."""
    from degnn.part_csc import CSC_FILE, graph_from_csc, inner_edges_only

    path = os.path.join(os.path.dirname(graph_file), CSC_FILE)
    if not os.path.exists(path):
        return None
    tensors = load_tensors_mapped(path)
    if tensors is not None and inner_only:
        inner = inner_edges_only(tensors)
        if inner is None:
            log.warning("%s: own nodes' in-edges are not a prefix of the part; serving all its edges", path)
        tensors = inner or tensors
    g = graph_from_csc(tensors) if tensors is not None else None
    if g is not None:
        log.info("%s: part graph mapped from %s (%d nodes, %d edges)", graph_file, path, g.num_nodes(),
                 g.num_edges())
    return g


def install(inner_only: bool = False) -> None:
    """Make this process's DGL partition loading read a part's graph through `load_part_mapped`
    (with `inner_only`) and its tensor files (the graph server's `load_partition_feats`) through
    `load_tensors_mapped`, each falling back to DGL's reader; and name a part graph file DGL cannot
    load."""
    from dgl.distributed import partition

    dgl_load = partition.load_tensors
    if getattr(dgl_load, "degnn_mapped", False):
        return
    dgl_load_graphs = partition.load_graphs

    def load_graphs(filename, idx_list=None):
        mapped = load_part_mapped(filename, inner_only) if idx_list is None else None
        if mapped is not None:
            return [mapped], {}
        try:
            return dgl_load_graphs(filename, idx_list)
        except Exception as e:  # noqa: BLE001 - DGL's C++ error: several lines of backtrace
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise _refuse(filename, f"not a whole DGL graph file (truncated or damaged: DGL says "
                                    f"{first[:120]})") from None

    partition.load_graphs = load_graphs

    def load_tensors(filename, return_dgl_ndarray=False):
        mapped = None if return_dgl_ndarray else load_tensors_mapped(filename)
        return mapped if mapped is not None else dgl_load(filename, return_dgl_ndarray)

    load_tensors.degnn_mapped = True
    partition.load_tensors = load_tensors
