"""DGL's tensor-dict file format (what `dgl.data.utils.save_tensors` writes, DGL 1.1), and a writer
that appends it row block by row block.

    u64 magic DICT_MAGIC, u64 count, u64 count, then count times:
        u64 name length, the name's bytes,
        u64 magic ARRAY_MAGIC, u64 reserved, i32 device type, i32 device id, i32 ndim,
        u8 type code, u8 bits, u16 lanes, i64 shape[ndim], i64 data bytes, the data (C order)

degnn.runtime.mapped_feats reads it (servers map node features instead of loading them);
partitioners.stream_random writes it: every array's header states its shape, so the shapes are
given up front and the rows appended as they come, without holding an array whole.
"""
from __future__ import annotations

import struct
from typing import BinaryIO, List, Tuple

import numpy as np

DICT_MAGIC = 0xDD5A9FBE3FA2443F
ARRAY_MAGIC = 0xDD5E40F096B4A13F
CPU = 1
# DLPack (type code, bits) -> numpy dtype; lanes must be 1
DTYPES = {(0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64,
          (1, 8): np.uint8, (1, 16): np.uint16, (1, 32): np.uint32, (1, 64): np.uint64,
          (2, 16): np.float16, (2, 32): np.float32, (2, 64): np.float64}

# numpy dtype -> DLPack (type code, bits); bool is stored as DGL stores it, unsigned 8 bits
_CODES = {np.dtype(v): k for k, v in DTYPES.items()}
_CODES[np.dtype(bool)] = (1, 8)


class TensorDictWriter:
    """Arrays `specs` [(name, dtype, shape)] written in that order; call `append(rows)` with each
    array's rows in order (the writer moves to the next array once one is full)."""

    def __init__(self, f: BinaryIO, specs: List[Tuple[str, np.dtype, Tuple[int, ...]]]):
        self.f = f
        self.specs = [(n, np.dtype(d), tuple(int(s) for s in sh)) for n, d, sh in specs]
        self.current = -1
        self.left = 0
        f.write(struct.pack("<QQQ", DICT_MAGIC, len(specs), len(specs)))
        self._next()

    def _next(self) -> None:
        while self.left == 0 and self.current + 1 < len(self.specs):
            self.current += 1
            name, dtype, shape = self.specs[self.current]
            code, bits = _CODES[dtype]
            raw = name.encode()
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            self.f.write(struct.pack("<Q", len(raw)) + raw)
            self.f.write(struct.pack("<QQiiiBBH", ARRAY_MAGIC, 0, CPU, 0, len(shape), code, bits, 1))
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

