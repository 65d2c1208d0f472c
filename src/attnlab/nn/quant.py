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


@dataclass
class QuantWeight:
    """One block-quantized (O, I) matrix: qs (O, I) int8 or (O, I/2) uint8, d (O, NB) fp16 and, for
    q4_1, m (O, NB) fp16 (None otherwise)."""

    scheme: str
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None = None

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


def dequantize(qw: QuantWeight, rows: slice | None = None) -> torch.Tensor:
    """The fp32 weight (O, I) a QuantWeight stands for (optionally only `rows`), with gguf-py's
    operation order: q · d, (q − 8) · d, q · d + m."""
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
    return q.reshape(r, i), d.reshape(r, -1)
