"""The codec of LAMP's rows: how a row of float values is encoded to be kept or sent, and the
only place that knows that layout (`pipeline.codec`, `pipeline.bits`).

Every row LAMP keeps or moves goes through a Codec: the histories (history.py), the owners'
answers and the halo sync's rows (compute.Rows), history pushes (compute.HistoryRows), pushed
gradient rows (compute.GradRows) and the halo nodes' input features (compute.HaloFeatures, at
`pipeline.halo_bits`). Everything else holds encoded rows as one opaque *packed* value: a tuple of
tensors, each either one entry a row along dim 0 or empty (a part the setting leaves out, such as
min-max's scale and offset at 32 or 16 bits). A message carries it as one field, spread into its
tensors on the wire (compute.flat), so DGL RPC sends each as a raw buffer.

A codec says how to encode and decode; tables, indexing, concatenation, its bytes a row and the
byte layout of a shared table (one uint8 row a node, the parts side by side) follow from the
parts it returns. Another quantizer is another subclass here and an entry in CODECS.

* minmax (the default): quantize.py's asymmetric per-row codes, a float16 scale and offset a row
  (`dim * bits / 8 + 4` bytes), stochastically rounded (unbiased);
* absmax: symmetric per-row codes in -(2^(b-1) - 1) .. 2^(b-1) - 1 around zero and a float16
  scale only (`dim * bits / 8 + 2` bytes: one level fewer, two bytes less), stochastically
  rounded too.
At 32 and 16 bits both keep float32 / float16 rows as they are.
"""
from __future__ import annotations

import os
import tempfile
from typing import Dict, List, Optional, Tuple, Type

import torch

from degnn.pipelines.lamp.quantize import BITS, QRows, dequantize, pack_codes, quantize, round_half, unpack_codes

Packed = Tuple[torch.Tensor, ...]


def sparse_file(where: str, prefix: str, nbytes: int) -> str:
    """The path of a new file of `nbytes` zero bytes in the directory `where` (sparse: no page is
    written until the table over it is), for a table to map."""
    fd, path = tempfile.mkstemp(prefix=prefix, dir=where)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    return path


def zero_table(shape: Tuple[int, ...], dtype: torch.dtype, where: Optional[str]) -> torch.Tensor:
    """A zero tensor of `shape` in memory, or (`where`: a directory) over a sparse file there."""
    numel = int(torch.Size(shape).numel())
    if where is None or numel == 0:
        return torch.zeros(shape, dtype=dtype)
    path = sparse_file(where, "degnn-lamp-table-", numel * torch.empty(0, dtype=dtype).element_size())
    try:
        return torch.from_file(path, shared=True, size=numel, dtype=dtype).view(shape)
    finally:
        os.unlink(path)  # the mapping keeps it


class Codec:
    """Rows of `dim` float values at `bits` (one of BITS). Subclasses give `encode` and `decode`;
    the rest works on the parts `encode` returns."""

    name = ""
    BITS: Tuple[int, ...] = BITS

    def __init__(self, dim: int, bits: int):
        if bits not in self.BITS:
            raise ValueError(f"pipeline.bits must be one of {', '.join(map(str, self.BITS))} "
                             f"(codec {self.name}), got {bits}")
        self.dim, self.bits = int(dim), int(bits)
        # the layout, from one encoded row (a generator of its own: the global random stream
        # stays as it was); per part: (dtype, shape of one row's entry), or None when empty
        proto = self.encode(torch.zeros(1, self.dim), torch.Generator())
        self.parts = [(t.dtype, tuple(t.shape[1:])) if t.dim() and len(t) == 1 else None for t in proto]
        self.blank = tuple(t[:0] for t in proto)  # the parts of no rows (empty parts as encoded)
        self.widths = [0 if p is None else torch.empty((1,) + p[1], dtype=p[0]).element_size()
                       * int(torch.Size(p[1]).numel()) for p in self.parts]
        self.row_bytes = sum(self.widths)
        # a table of rows can be read as float32 values in place (no decoding)
        self.exact = self.parts[0] == (torch.float32, (self.dim,)) and self.row_bytes == 4 * self.dim

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, bits={self.bits})"

    # --- what a codec defines ------------------------------------------------------------------
    def encode(self, x: torch.Tensor, generator: Optional[torch.Generator] = None) -> Packed:
        """Float rows [n, dim] -> packed rows (`generator`: stochastic rounding's draws)."""
        raise NotImplementedError

    def decode(self, rows: Packed) -> torch.Tensor:
        """Packed rows -> float32 rows [n, dim]."""
        raise NotImplementedError

    # --- tables and indexing ---------------------------------------------------------------------
    def table(self, n: int, where: Optional[str] = None) -> Packed:
        """A table of `n` zero rows, to `put` rows into and `take` them from. `where`: a directory
        for its parts as memory-mapped files (unlinked at once: the mappings keep them), whose pages
        the kernel may write back and drop when the machine is short of memory; None: in memory."""
        return tuple(b if p is None else zero_table((n,) + p[1], p[0], where) for b, p in zip(self.blank, self.parts))

    def take(self, rows: Packed, idx: torch.Tensor) -> Packed:
        return tuple(t if p is None else t[idx] for t, p in zip(rows, self.parts))

    def put(self, table: Packed, idx: torch.Tensor, rows: Packed) -> None:
        for t, r, p in zip(table, rows, self.parts):
            if p is not None:
                t[idx] = r

    def cat(self, pieces: List[Packed]) -> Packed:
        if not pieces:
            return self.blank
        return tuple(pieces[0][i] if p is None else torch.cat([r[i] for r in pieces])
                     for i, p in enumerate(self.parts))

    def count(self, rows: Packed) -> int:
        """How many rows `rows` holds."""
        return next(len(t) for t, p in zip(rows, self.parts) if p is not None)

    # --- as bytes: a table shared through a file ---------------------------------------------------
    def to_bytes(self, rows: Packed) -> torch.Tensor:
        """uint8 [n, row_bytes]: each row's parts side by side, in order."""
        n = self.count(rows)
        return torch.cat([t.contiguous().view(torch.uint8).view(n, w)
                          for t, w in zip(rows, self.widths) if w], 1)

    def from_bytes(self, b: torch.Tensor) -> Packed:
        """to_bytes undone."""
        out, at = [], 0
        for blank, p, w in zip(self.blank, self.parts, self.widths):
            if p is None:
                out.append(blank)
                continue
            out.append(b[:, at:at + w].contiguous().view(p[0]).view((len(b),) + p[1]))
            at += w
        return tuple(out)


class MinMaxCodec(Codec):
    """quantize.py's asymmetric min-max codes (scale and offset a row)."""

    name = "minmax"

    def encode(self, x, generator=None):
        return quantize(x, self.bits, generator=generator)

    def decode(self, rows):
        return dequantize(QRows(*rows), self.bits, self.dim)


class AbsMaxCodec(Codec):
    """Symmetric per-row codes: scale_i = max_i |x| / (2^(b-1) - 1), rounded *up* to a float16 so
    that no code needs clamping (as quantize.py's scale), code = floor(x / scale + u), u ~ U[0, 1),
    stored as code + 2^(b-1) - 1 and packed like min-max's. Zero stays exactly zero; a row costs
    the float16 scale only."""

    name = "absmax"

    def encode(self, x, generator=None):
        x = x.detach().float()
        if self.bits == 32:
            return (x.contiguous(), torch.empty(0, dtype=torch.float16))
        if self.bits == 16:
            return (x.to(torch.float16), torch.empty(0, dtype=torch.float16))
        half = (1 << (self.bits - 1)) - 1
        scale = round_half(x.abs().max(1).values / half, up=True) if len(x) else torch.empty(0, dtype=torch.float16)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # zero rows: every code 0
        v = torch.floor(x / scale.float()[:, None] + torch.rand(x.shape, generator=generator))
        return (pack_codes((v.clamp_(-half, half) + half).to(torch.uint8), self.bits), scale)

    def decode(self, rows):
        codes, scale = rows
        if self.bits >= 16:
            return codes.float()
        half = (1 << (self.bits - 1)) - 1
        return (unpack_codes(codes, self.bits, self.dim).float() - half) * scale.float()[:, None]


CODECS: Dict[str, Type[Codec]] = {c.name: c for c in (MinMaxCodec, AbsMaxCodec)}


def make_codec(name: str, dim: int, bits: int) -> Codec:
    """The codec `name` (pipeline.codec) for rows of `dim` values at `bits`."""
    if name not in CODECS:
        raise ValueError(f"pipeline.codec={name}: choose one of {', '.join(CODECS)}")
    return CODECS[name](dim, bits)
