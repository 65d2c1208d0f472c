"""Linear layer with a fast path for the few rows of autoregressive decoding on CPU.

Shape legend: R rows (batch × new tokens), I in_features, O out_features, P row blocks.

Decoding one token reads every weight matrix once to multiply it by one vector, so its speed is the
speed at which the matrix-vector product streams the weights from memory; `F.linear` sends a
(1, I) input to the BLAS gemv routine, whose speed depends on the CPU and the BLAS build: on the
AMD EPYC hosts of this VM MKL's gemv streams at 12-20 GB/s of ~34 (an x86 vendor check inside MKL),
on the Intel host of issue 17 it beat a batched product 2.4×. So the form is a per-machine choice
(nn/cpu_tuning.py's `linear_form`, a fixed rule on /proc/cpuinfo, recorded in every bench JSON):

    "cpp"   the decode products' own AVX512 kernel (decode_matvec.h, the fused step's fp32 tiles:
            4 weight rows × up to 4 x rows, 16-lane FMA, prefetched per machine), where the C++
            extension builds; the form on both host kinds (issue 23's bench: bench/decode_tuning.py)
    "bmm"   W split into P blocks of rows, every W_p x in one batched product (`torch.bmm`): the
            fallback on AMD without the extension
    "blas"  F.linear: the fallback elsewhere

Each is the same product up to the order of the fp32 additions (≈ 1e-6 relative). Training and
prefill (more than MAX_FAST_ROWS rows), autograd, and every other device or dtype take `F.linear`
unchanged. `MAX_FAST_ROWS = 0` turns the fast path off.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn import cpu_tuning
from attnlab.nn.quant_kernel import kernel

ROW_BLOCKS = 4      # P: blocks of output rows, one small product each ("bmm")
MAX_FAST_ROWS = 16  # R up to which the fast forms beat F.linear (fp32, CPU)
_form: dict = {}


def form(grad: bool = False) -> str:
    """This machine's few-row fp32 product: "cpp", "bmm" or "blas" (module doc); decided once.
    grad=True: the form for a product autograd records (the "cpp" op has no backward)."""
    if "name" not in _form:
        _form["name"] = cpu_tuning.linear_form(kernel() == "cpp")
        _form["grad"] = cpu_tuning.linear_form(False)
    return _form["grad" if grad else "name"]


def _cpp(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(R, I) · (O, I)ᵀ -> (R, O) with the decode products' fp32 kernel (decode_matvec.h)."""
    return torch.ops.attnlab_quant.linear_f32(x, weight)


def _bmm(x: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
    out_features, in_features = weight.shape
    blocks = weight.view(ROW_BLOCKS, out_features // ROW_BLOCKS, in_features)  # (P, O/P, I)
    xt = x.reshape(1, rows, in_features).expand(ROW_BLOCKS, rows, in_features).transpose(1, 2)  # (P, I, R)
    y = torch.bmm(blocks, xt)  # (P, O/P, R)
    return y.permute(2, 0, 1).reshape(*x.shape[:-1], out_features)  # (..., O)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x Wᵀ + b, as `F.linear`, with fp32 CPU inputs of at most MAX_FAST_ROWS rows computed in
    this machine's fast form (module doc).

    Args:
        x: (..., I). weight: (O, I). bias: (O,) or None.
    Returns:
        (..., O), x's dtype.
    """
    out_features, in_features = weight.shape
    rows = x.numel() // in_features if in_features else 0
    if (rows == 0 or rows > MAX_FAST_ROWS or x.device.type != "cpu" or x.dtype != torch.float32
            or weight.dtype != torch.float32 or not weight.is_contiguous()):
        return F.linear(x, weight, bias)
    how = form(grad=torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    if how == "cpp":
        y = _cpp(x.reshape(rows, in_features), weight).view(*x.shape[:-1], out_features)
    elif how != "blas" and out_features % ROW_BLOCKS == 0:
        y = _bmm(x, weight, rows)
    else:
        return F.linear(x, weight, bias)
    return y if bias is None else y + bias


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, names and initialisation) whose forward is `linear` above, so
    that batch-1 decoding on CPU streams the weights at the faster rate."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in_features) -> (..., out_features)."""
        return linear(x, self.weight, self.bias)
