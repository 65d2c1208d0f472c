"""ggml block quantization of weight matrices (Q8_0, Q4_0, Q4_1) and of activations, in PyTorch.

Shape legend: O out_features (rows), I in_features, NB = I / 32 blocks per row, R activation rows.
A block is 32 consecutive weights of one row with an fp16 scale d (and, for Q4_1, an fp16 minimum m):
    Q8_0   qs int8  (O, I)        w = q · d                      q in −127..127
    Q4_0   qs uint8 (O, I/2)      w = (q − 8) · d                q in 0..15, two per byte
    Q4_1   qs uint8 (O, I/2)      w = q · d + m                  q in 0..15, two per byte
Byte j of a Q4 block holds element j in its low nibble and element j + 16 in its high nibble (ggml's
`block_q4_0` / `block_q4_1`); the scales are d (O, NB) and m (O, NB), fp16. This module is the one
source of these formats: the GGUF reader and writer (interop/gguf_quants.py: ggml's type ids, each
block's bytes d [m] qs) and the C++ kernels (nn/quant_kernel.h's Scheme enum = quant_kernel.SCHEME_ID,
tested) read QS_BYTES and SCALES from here.
Quantizing follows ggml-quants.c `quantize_row_q8_0/q4_0/q4_1_ref` (and gguf-py's gguf.quants, which
reproduces them bit for bit): Q8_0 d = max|x| / 127, q = round-half-away(x / d); Q4_0 d = x_max / −8
(x_max the element of largest magnitude), q = min(15, trunc(x / d + 8.5)); Q4_1 d = (max − min) / 15,
m = min, q = min(15, trunc((x − min) / d + 0.5)); the fp32 d is used for q and then stored as fp16.
Activations (the kernel's other operand) are quantized the Q8_0 way per 32-block of each row, with
an fp32 scale and round-half-to-even (what the SIMD conversion does): `quantize_activations`.
Two layouts of the same bytes (QuantWeight.tile): 0, the rows above (ggml's, what files hold), and
T > 0, the C++ kernel's T-row tiles (issue 23; nn/quant_tiles.h reads them): the first ⌊O/T⌋·T rows
in tiles of T rows, each tile's qs as (NB, K, T, 4) (K = bytes per block / 4: dword k of block b of
the tile's T rows side by side, one vector per (b, k) with row i in lane i), Q8_0's bytes stored as
q XOR 0x80 (= q + 128 unsigned, the kernel's operand), and its d / m as (NB, T); the last O % T rows
as in layout 0. Same shapes, dtypes and bytes: `to_tiles` / `to_rows` convert, exactly.
Source: ggml (llama.cpp) ggml-common.h, ggml-quants.c; gguf-py gguf/quants.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.errors import UserError

BLOCK = 32                                  # weights per block
SCHEMES = ("q8_0", "q4_0", "q4_1")          # block types a QuantLinear holds
QS_BYTES = {"q8_0": BLOCK, "q4_0": BLOCK // 2, "q4_1": BLOCK // 2}  # bytes of qs per block (8 or 4 bits a weight)
SCALES = {"q8_0": ("d",), "q4_0": ("d",), "q4_1": ("d", "m")}       # fp16 scales per block, in ggml's order
TILES = (0, 8, 16)                          # QuantWeight.tile: 0 = ggml's rows, else rows per kernel tile


@dataclass
class QuantWeight:
    """One block-quantized (O, I) matrix: qs (O, I) int8 or (O, I/2) uint8, d (O, NB) fp16 and, for
    q4_1, m (O, NB) fp16 (None otherwise); tile: their layout (module doc: 0 = rows, T = T-row tiles)."""

    scheme: str
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None = None
    tile: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return self.d.shape[0], self.d.shape[1] * BLOCK

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)


def check_scheme(scheme: str) -> str:
    """Return scheme, or raise ValueError naming it and the supported ones."""
    if scheme not in SCHEMES:
        raise UserError(f"quantization {scheme!r} is not supported; supported: {', '.join(SCHEMES)}")
    return scheme


def _blocks(w: torch.Tensor) -> torch.Tensor:
    if w.dim() != 2 or w.shape[1] % BLOCK:
        raise UserError(f"block quantization needs a 2-D weight whose last dimension is a multiple of "
                        f"{BLOCK}, got shape {tuple(w.shape)}")
    return w.detach().to(torch.float32).reshape(-1, BLOCK)  # (O·NB, 32)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    """gguf-py np_roundf: sign(v) · (floor|v| + floor(2 (|v| − floor|v|))), exact in fp32."""
    a = v.abs()
    f = a.floor()
    return torch.sign(v) * (f + (2 * (a - f)).floor())


def _pack(q: torch.Tensor) -> torch.Tensor:
    """(O·NB, 32) values 0..15 -> (O·NB, 16) bytes: element j low nibble, element j + 16 high."""
    q = q.to(torch.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _unpack(qs: torch.Tensor) -> torch.Tensor:
    """(…, 16·k) bytes -> (…, 32·k) uint8 values 0..15 in element order (per 16-byte block)."""
    b = qs.reshape(*qs.shape[:-1], -1, 16)  # (…, NB, 16)
    return torch.cat([b & 0x0F, b >> 4], dim=-1).reshape(*qs.shape[:-1], -1)


def quantize(w: torch.Tensor, scheme: str) -> QuantWeight:
    """Block-quantize a weight matrix exactly as ggml's reference quantizers (module doc).

    Args:
        w: (O, I) float weight, I a multiple of 32. scheme: "q8_0", "q4_0" or "q4_1".
    Returns:
        QuantWeight with qs, d (and m) as in the module doc.
    Raises:
        ValueError: an unsupported scheme (named), or a shape that is not (O, 32·k).
    """
    check_scheme(scheme)
    x = _blocks(w)
    rows = w.shape[0]
    if scheme == "q8_0":
        d = x.abs().amax(dim=1, keepdim=True) / 127  # (O·NB, 1)
        q = _round_half_away(x * _inverse(d)).to(torch.int8)
        return QuantWeight(scheme, q.reshape(rows, -1), d.to(torch.float16).reshape(rows, -1))
    if scheme == "q4_0":
        imax = x.abs().argmax(dim=1, keepdim=True)
        d = x.gather(1, imax) / -8
        q = torch.trunc(x * _inverse(d) + 8.5).clamp(0, 15)
        return QuantWeight(scheme, _pack(q).reshape(rows, -1), d.to(torch.float16).reshape(rows, -1))
    lo, hi = x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)
    d = (hi - lo) / 15
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).clamp(0, 15)
    return QuantWeight(scheme, _pack(q).reshape(rows, -1), d.to(torch.float16).reshape(rows, -1),
                       lo.to(torch.float16).reshape(rows, -1))


def _tile_view(t: torch.Tensor, tiles: int, tile: int, k: int, packed: bool) -> torch.Tensor:
    """The first tiles·tile rows of t (qs: NB·k·4 bytes a row; scales: k = 0, NB a row) as
    (tiles, tile, NB, k, 4) in rows order, or (tiles, NB, k, tile, 4) in tiled order."""
    k, width = max(k, 1), 4 if k else 1
    nb = t.shape[1] // (k * width)
    head = t[:tiles * tile]
    return head.reshape(tiles, nb, k, tile, width) if packed else head.reshape(tiles, tile, nb, k, width)


def _relayout(qw: QuantWeight, tile: int, packed: bool) -> QuantWeight:
    """qw (in layout `tile` when packed, else in rows) in the other layout: new tensors."""
    tiles, k = qw.d.shape[0] // tile, QS_BYTES[qw.scheme] // 4
    order = (0, 3, 1, 2, 4) if packed else (0, 2, 3, 1, 4)

    def convert(t: torch.Tensor, kk: int) -> torch.Tensor:
        out = t.clone()
        out[:tiles * tile] = _tile_view(t, tiles, tile, kk, packed).permute(*order).reshape(tiles * tile, t.shape[1])
        return out

    qs = convert(qw.qs.view(torch.uint8), k)
    if qw.scheme == "q8_0":  # the tiles hold q + 128 (unsigned), rows hold q
        qs[:tiles * tile] ^= 0x80
        qs = qs.view(torch.int8)
    return QuantWeight(qw.scheme, qs, convert(qw.d, 0), None if qw.m is None else convert(qw.m, 0),
                       0 if packed else tile)


def _check_tile(tile: int) -> None:
    if tile not in TILES:
        raise UserError(f"tile={tile!r}: must be one of {', '.join(map(str, TILES))} (rows per kernel tile; 0 = rows)")


def to_tiles(qw: QuantWeight, tile: int) -> QuantWeight:
    """qw in the kernel's layout of `tile` rows per tile (module doc): new tensors, or qw itself when
    it is in that layout already; tile 0: to_rows(qw).

    Raises:
        UserError: tile not in TILES.
    """
    _check_tile(tile)
    if qw.tile == tile:
        return qw
    qw = to_rows(qw)
    return qw if tile == 0 else _relayout(qw, tile, packed=False)


def to_rows(qw: QuantWeight) -> QuantWeight:
    """qw in layout 0 (ggml's rows): itself when it is, else new tensors (the exact inverse of to_tiles)."""
    return qw if qw.tile == 0 else _relayout(qw, qw.tile, packed=True)


def take_rows(qw: QuantWeight, ids: torch.Tensor) -> QuantWeight:
    """Rows `ids` (N,) int64 of qw in layout 0, whatever qw's layout: (N, ·) tensors (an embedding
    lookup; only these rows are read)."""
    rows = QuantWeight(qw.scheme, qw.qs[ids], qw.d[ids], None if qw.m is None else qw.m[ids])
    tiles = qw.d.shape[0] // qw.tile if qw.tile else 0
    if tiles == 0:
        return rows
    inside = (ids < tiles * qw.tile)[:, None]
    t, i = torch.where(inside[:, 0], ids // qw.tile, 0), torch.where(inside[:, 0], ids % qw.tile, 0)

    def take(x: torch.Tensor, kk: int, flat: torch.Tensor) -> torch.Tensor:
        found = _tile_view(x, tiles, qw.tile, kk, packed=True)[t, :, :, i, :].reshape(len(ids), -1)
        return torch.where(inside, found, flat)

    qs = take(qw.qs.view(torch.uint8), QS_BYTES[qw.scheme] // 4, rows.qs.view(torch.uint8))
    if qw.scheme == "q8_0":
        qs = torch.where(inside, qs ^ 0x80, qs).view(torch.int8)
    return QuantWeight(qw.scheme, qs, take(qw.d, 0, rows.d), None if qw.m is None else take(qw.m, 0, rows.m))


def dequantize(qw: QuantWeight, rows: slice | None = None) -> torch.Tensor:
    """The fp32 weight (O, I) a QuantWeight stands for (optionally only `rows`), with gguf-py's
    operation order: q · d, (q − 8) · d, q · d + m; either layout (a tiled one through a rows copy of
    what is asked for: to_rows, or take_rows of `rows`)."""
    if qw.tile:
        qw = to_rows(qw) if rows is None else take_rows(qw, torch.arange(qw.d.shape[0])[rows])
        rows = None
    sl = rows if rows is not None else slice(None)
    qs, d = qw.qs[sl], qw.d[sl].to(torch.float32)
    o, nb = d.shape
    d = d.reshape(o, nb, 1)
    if qw.scheme == "q8_0":
        return (qs.reshape(o, nb, BLOCK).to(torch.float32) * d).reshape(o, -1)
    q = _unpack(qs).reshape(o, nb, BLOCK)
    if qw.scheme == "q4_0":
        return (d * (q.to(torch.int8) - 8).to(torch.float32)).reshape(o, -1)
    return (d * q.to(torch.float32) + qw.m[sl].to(torch.float32).reshape(o, nb, 1)).reshape(o, -1)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8 per 32-block of each row, as the kernel does: d = max|x| / 127, q = round-half-even(x · (1/d)).

    Args:
        x: (R, I) fp32, I a multiple of 32.
    Returns:
        (q (R, I) int8, d (R, NB) fp32); x ≈ q · d, each element within d / 2.
    """
    r, i = x.shape
    b = x.reshape(r, i // BLOCK, BLOCK)
    d = b.abs().amax(dim=-1, keepdim=True) / 127  # (R, NB, 1)
    q = torch.round(b * _inverse(d)).to(torch.int8)
    return q.reshape(r, i), d.reshape(r, i // BLOCK)
