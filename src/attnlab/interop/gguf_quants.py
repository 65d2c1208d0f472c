"""GGUF tensors of llama.cpp's ggml types: their type ids and block bytes, and decoding them to float32.

Shape legend: N elements of the tensor, NB blocks (N = 32 · NB), C the innermost (contiguous)
dimension, ggml's ne0, which every block lies inside (C % 32 == 0).
Block layouts (ggml-common.h `block_q8_0`, `block_q4_0`, `block_q4_1`); a block quantizes 32
consecutive weights of one row, little-endian:
    Q8_0  34 bytes: fp16 scale d, 32 int8 q                           w = q · d
    Q4_0  18 bytes: fp16 scale d, 16 bytes of 4-bit q                  w = (q − 8) · d
    Q4_1  20 bytes: fp16 scale d, fp16 minimum m, 16 bytes of 4-bit q  w = q · d + m
In Q4_0 / Q4_1, byte j holds element j in its low nibble and element j + 16 in its high nibble.
The formats themselves (qs, d, m and their algebra) are nn/quant.py's; here only how a GGUF file
lays them out: `from_gguf_blocks` splits a tensor's blocks into a QuantWeight, `to_gguf_blocks`
joins them, and these three types decode through nn/quant.py's dequantize.
F32, F16 and BF16 are plain arrays (BF16: the top 16 bits of an fp32).
Every other type gguf-py can decode (the K-quants Q2_K..Q6_K of 256-weight super-blocks, Q5_0, Q5_1,
the IQ types...) is decoded by `gguf.quants.dequantize`, the reference implementation, as it is.
Products and sums are taken in fp32 as separate operations, like gguf-py's reference (C builds of
ggml may fuse q · d + m into one FMA, a last-bit difference).
Source: ggml (llama.cpp) ggml-common.h and ggml-quants.c `dequantize_row_q8_0/q4_0/q4_1`; the GGUF
specification (ggml docs/gguf.md).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.nn.quant import BLOCK, QS_BYTES, SCALES, SCHEMES, QuantWeight, dequantize as dequantize_blocks, to_rows

GGML_TYPE = {"q8_0": 8, "q4_0": 2, "q4_1": 3}  # ggml type ids (gguf.GGMLQuantizationType) of our schemes
BLOCK_BYTES = {s: 2 * len(SCALES[s]) + QS_BYTES[s] for s in SCHEMES}  # a GGUF block: fp16 d [m], then qs
# ggml type id -> (name, bytes per block of 32, or bytes per element for the plain types)
TYPES: dict[int, tuple[str, int]] = {0: ("F32", 4), 1: ("F16", 2), 30: ("BF16", 2),
                                     **{GGML_TYPE[s]: (s.upper(), BLOCK_BYTES[s]) for s in SCHEMES}}
PLAIN = ("F32", "F16", "BF16")


def from_gguf_blocks(raw, scheme: str, shape: tuple[int, int]) -> QuantWeight:
    """Split a GGUF tensor's blocks (d [m] qs, little-endian) into a QuantWeight, copying the bytes.

    Args:
        raw: numpy or torch bytes of the tensor (any shape, C order). shape: (O, I) outermost first.
    Raises:
        ValueError: when the byte count does not match shape and scheme.
    """
    rows, cols = shape
    size = BLOCK_BYTES[scheme]
    data = raw.reshape(-1).view(torch.uint8) if isinstance(raw, torch.Tensor) else \
        torch.from_numpy(np.ascontiguousarray(raw).reshape(-1).view(np.uint8).copy())  # (bytes,)
    nb = cols // BLOCK
    if cols % BLOCK or data.numel() != rows * nb * size:
        raise UserError(f"a {scheme} tensor of shape {shape} needs {rows * nb * size} bytes, got {data.numel()}")
    blocks = data.reshape(rows, nb, size)
    scales = [blocks[..., 2 * i:2 * i + 2].contiguous().view(torch.float16).reshape(rows, nb)
              for i in range(len(SCALES[scheme]))]  # d (and m), (O, NB) each
    qs = blocks[..., 2 * len(scales):].contiguous()
    qs = qs.view(torch.int8).reshape(rows, cols) if scheme == "q8_0" else qs.reshape(rows, cols // 2)
    return QuantWeight(scheme, qs, scales[0], scales[1] if len(scales) > 1 else None)


def to_gguf_blocks(qw: QuantWeight) -> torch.Tensor:
    """The GGUF bytes of a QuantWeight in either layout (nn/quant.py): (O, NB · bytes per block)
    uint8, each block d [m] qs in ggml's row order."""
    qw = to_rows(qw)
    rows, cols = qw.shape
    nb = cols // BLOCK
    parts = [qw.d.contiguous().view(torch.uint8).reshape(rows, nb, 2)]
    if qw.m is not None:
        parts.append(qw.m.contiguous().view(torch.uint8).reshape(rows, nb, 2))
    parts.append(qw.qs.contiguous().view(torch.uint8).reshape(rows, nb, -1))
    return torch.cat(parts, dim=-1).reshape(rows, -1)


def _type_name(ggml_type) -> str:
    try:
        from gguf import GGMLQuantizationType  # optional dependency (the hf extra): type names
        return GGMLQuantizationType(int(ggml_type)).name
    except (ImportError, ValueError):
        return f"type {int(ggml_type)}"


def dequantize(raw: np.ndarray, ggml_type, shape: Sequence[int], name: str = "tensor") -> np.ndarray:
    """Decode one GGUF tensor to float32.

    Args:
        raw: the tensor's bytes, as uint8 or as the typed array GGUFReader gives (float32 for F32,
            float16 for F16, (rows, bytes per row) uint8 for the block types); any shape, C order.
        ggml_type: an int or gguf.GGMLQuantizationType: F32, F16, BF16, Q8_0, Q4_0, Q4_1 (ours),
            or any other type gguf.quants decodes (K-quants such as Q4_K, Q6_K; module doc).
        shape: the shape to return, outermost first (PyTorch's order: ggml's ne reversed, so a
            GGUF weight of ne [in, out] is (out, in)).
        name: the tensor's name, for error messages.
    Returns:
        A float32 array of `shape` (a new array; the input is never written).
    Raises:
        ValueError: an unsupported type (naming the tensor and the type, listing the supported
            ones), a last dimension that is not a multiple of 32 for a block type, or a byte
            count that does not match the shape.
    Source: ggml-quants.c `dequantize_row_*` (see the module doc).
    """
    code = int(ggml_type)
    shape = tuple(int(n) for n in shape)
    n = math.prod(shape)
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)  # (bytes,)
    if code not in TYPES:
        return _dequantize_with_gguf(data, code, shape, name)
    kind, size = TYPES[code]
    if kind not in PLAIN and (not shape or shape[-1] % BLOCK):
        raise UserError(f"{name}: a {kind} tensor needs a last dimension that is a multiple of "
                        f"{BLOCK}, got shape {shape}")
    expected = n * size if kind in PLAIN else n // BLOCK * size
    if data.size != expected:
        raise UserError(f"{name}: {kind} tensor of shape {shape} needs {expected} bytes, "
                        f"got {data.size}")
    if kind == "F32":
        return data.view("<f4").astype(np.float32).reshape(shape)
    if kind == "F16":
        return data.view("<f2").astype(np.float32).reshape(shape)
    if kind == "BF16":
        return (data.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    cols = shape[-1]
    qw = from_gguf_blocks(data, kind.lower(), (n // cols, cols))
    return dequantize_blocks(qw).numpy().reshape(shape)


def _dequantize_with_gguf(data: np.ndarray, code: int, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A type of ours-not (module doc) decoded by gguf.quants.dequantize: (bytes,) uint8 -> `shape`."""
    try:
        import gguf.quants as gq  # optional dependency (the hf extra), needed only for these types
        kind = gq.GGMLQuantizationType(code)
        block, size = gq.GGML_QUANT_SIZES[kind]
    except (ImportError, ValueError, KeyError):
        supported = ", ".join(n for n, _ in TYPES.values())
        raise UserError(f"{name}: GGUF tensor type {_type_name(code)} is not supported; supported: "
                        f"{supported}, and the types gguf.quants decodes (pip install gguf)") from None
    if not shape or shape[-1] % block:
        raise UserError(f"{name}: a {kind.name} tensor needs a last dimension that is a multiple of "
                        f"{block}, got shape {shape}")
    expected = math.prod(shape) // block * size
    if data.size != expected:
        raise UserError(f"{name}: {kind.name} tensor of shape {shape} needs {expected} bytes, got {data.size}")
    try:
        out = gq.dequantize(data.reshape(-1, size), kind)  # (blocks, block)
    except NotImplementedError:
        raise UserError(f"{name}: GGUF tensor type {kind.name} cannot be decoded by this gguf version") from None
    return np.ascontiguousarray(out, dtype=np.float32).reshape(shape)
