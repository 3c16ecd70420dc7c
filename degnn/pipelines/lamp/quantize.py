"""Per-row quantization of hidden states (LAMP's historical embeddings and owner answers).

bits = 32: float32 as is.  bits = 16: float16 (round to nearest).  bits = 8, 4, 2: asymmetric
min-max integer codes per row (AdaQP / Sancus^q style): ``offset_i`` = the row's minimum,
``scale_i`` = (max_i - offset_i) / (2^b - 1), code = floor((x - offset) / scale + u) with u ~ U[0, 1)
(stochastic rounding: E[dequantize(quantize(x))] = x), codes packed 8 / b to a byte.

Scale and offset travel as float16 (4 bytes a row in all). Both are rounded so that the codes
never need clamping: the offset is rounded *down* to a float16 and the scale computed from it is
rounded *up*, so (x - offset) / scale lies in [0, 2^b - 1] for every x of the row; that keeps
stochastic rounding exactly unbiased and the error below one step (``scale``) per element.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

BITS = (32, 16, 8, 4, 2)


class QRows(NamedTuple):
    """Quantized rows: ``codes`` [n, packed] (float32 / float16 / uint8), ``scale`` and ``offset``
    [n] float16 (empty for 32 and 16 bits)."""
    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self)


def check_bits(bits: int) -> int:
    if bits not in BITS:
        raise ValueError(f"pipeline.bits must be one of {', '.join(map(str, BITS))}, got {bits}")
    return bits


def row_bytes(dim: int, bits: int) -> int:
    """Bytes one quantized row of `dim` values takes (codes + scale + offset)."""
    if bits == 32:
        return 4 * dim
    if bits == 16:
        return 2 * dim
    per = 8 // bits
    return -(-dim // per) + 4


def _half_step(h: torch.Tensor, up: bool) -> torch.Tensor:
    """The float16 neighbour of each value of `h` (float16) toward +inf (up) or -inf."""
    bits = h.view(torch.int16).to(torch.int32)
    pos = bits >= 0  # sign bit clear (includes +0)
    zero = (bits == 0) | (bits == -32768)
    if up:
        nxt = torch.where(pos, bits + 1, bits - 1)
        nxt = torch.where(zero, torch.ones_like(bits), nxt)
    else:
        nxt = torch.where(pos, bits - 1, bits + 1)
        nxt = torch.where(zero, torch.full_like(bits, -32767), nxt)  # -smallest subnormal
    # int32 -> int16 keeps the bit pattern of negative halves (two's complement)
    return nxt.to(torch.int16).view(torch.float16)


def round_half(x: torch.Tensor, up: bool) -> torch.Tensor:
    """x (float32) rounded to float16 toward +inf (up) or -inf (down)."""
    h = x.clamp(-60000.0, 60000.0).to(torch.float16)
    wrong = (h.float() < x) if up else (h.float() > x)
    if bool(wrong.any()):
        h = torch.where(wrong, _half_step(h, up), h)
    return h


def quantize(x: torch.Tensor, bits: int, stochastic: bool = True,
             generator: Optional[torch.Generator] = None) -> QRows:
    x = x.detach().float()
    empty = torch.empty(0, dtype=torch.float16)
    if bits == 32:
        return QRows(x.contiguous(), empty, empty)
    if bits == 16:
        return QRows(x.to(torch.float16), empty, empty)
    check_bits(bits)
    n, dim = x.shape
    levels = (1 << bits) - 1
    if n == 0:
        return QRows(torch.empty(0, -(-dim // (8 // bits)), dtype=torch.uint8), empty, empty)
    lo, hi = x.min(1).values, x.max(1).values
    offset = round_half(lo, up=False)
    scale = round_half((hi - offset.float()) / levels, up=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # constant rows: every code 0
    v = (x - offset.float()[:, None]) / scale.float()[:, None]
    if stochastic:
        v = torch.floor(v + torch.rand(v.shape, generator=generator))
    else:
        v = torch.round(v)
    q = v.clamp_(0, levels).to(torch.uint8)
    return QRows(pack_codes(q, bits), scale, offset)


def pack_codes(q: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [n, dim] of `bits` bits each, packed 8 // bits to a byte (the first code in the
    low bits; a row padded with zero codes to whole bytes): [n, ceil(dim / (8 // bits))]."""
    per = 8 // bits
    if per > 1:
        n, dim = q.shape
        pad = (-dim) % per
        if pad:
            q = torch.cat([q, torch.zeros(n, pad, dtype=torch.uint8)], 1)
        q = q.view(n, (dim + pad) // per, per)
        out = torch.zeros(q.shape[:2], dtype=torch.uint8)
        for j in range(per):
            out |= q[:, :, j] << (j * bits)
        q = out
    return q.contiguous()


def unpack_codes(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """pack_codes undone: uint8 codes [n, dim]."""
    per = 8 // bits
    if per == 1:
        return codes
    mask = (1 << bits) - 1
    parts = [(codes >> (j * bits)) & mask for j in range(per)]
    return torch.stack(parts, 2).view(len(codes), codes.shape[1] * per)[:, :dim]


def dequantize(rows: QRows, bits: int, dim: int) -> torch.Tensor:
    codes, scale, offset = rows
    if bits in (32, 16):
        return codes.float()
    codes = unpack_codes(codes, bits, dim)
    return codes.float() * scale.float()[:, None] + offset.float()[:, None]
