"""Write a DGL tensor-dict file (what `dgl.data.utils.save_tensors` writes) row block by row block.

The format is the one degnn.runtime.mapped_feats reads (its docstring lays it out; the magic numbers
and type codes come from there): every array's header states its shape, so the shapes are given up
front and the rows are appended as they come, in array order, without holding an array whole.
"""
from __future__ import annotations

import struct
from typing import BinaryIO, List, Tuple

import numpy as np

from degnn.runtime.mapped_feats import _ARRAY_MAGIC, _CPU, _DICT_MAGIC, _DTYPES

# numpy dtype -> DLPack (type code, bits); bool is stored as DGL stores it, unsigned 8 bits
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}
_CODES[np.dtype(bool)] = (1, 8)


class TensorDictWriter:
    """Arrays `specs` [(name, dtype, shape)] written in that order; call `append(rows)` with each
    array's rows in order (the writer moves to the next array once one is full)."""

    def __init__(self, f: BinaryIO, specs: List[Tuple[str, np.dtype, Tuple[int, ...]]]):
        self.f = f
        self.specs = [(n, np.dtype(d), tuple(int(s) for s in sh)) for n, d, sh in specs]
        self.current = -1
        self.left = 0
        f.write(struct.pack("<QQQ", _DICT_MAGIC, len(specs), len(specs)))
        self._next()

    def _next(self) -> None:
        while self.left == 0 and self.current + 1 < len(self.specs):
            self.current += 1
            name, dtype, shape = self.specs[self.current]
            code, bits = _CODES[dtype]
            raw = name.encode()
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            self.f.write(struct.pack("<Q", len(raw)) + raw)
            self.f.write(struct.pack("<QQiiiBBH", _ARRAY_MAGIC, 0, _CPU, 0, len(shape), code, bits, 1))
            self.f.write(struct.pack(f"<{len(shape)}q", *shape) + struct.pack("<q", nbytes))
            self.left = shape[0] if shape else 1

    def append(self, rows: np.ndarray) -> None:
        name, dtype, shape = self.specs[self.current]
        if rows.shape[1:] != shape[1:] or len(rows) > self.left:
            raise ValueError(f"internal: rows of shape {rows.shape} do not fit array {name} {shape} ({self.left} left)")
        np.ascontiguousarray(rows, dtype=dtype if dtype != np.dtype(bool) else np.uint8).tofile(self.f)
        self.left -= len(rows)
        self._next()

    def done(self) -> bool:
        return self.left == 0 and self.current == len(self.specs) - 1


def write_empty(path) -> None:
    """An empty tensor dict (a part without edge data)."""
    with open(path, "wb") as f:
        TensorDictWriter(f, [])

