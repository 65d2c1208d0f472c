"""Mamba's causal depthwise convolution with the SiLU after it, in the block's (B, T, Di) layout.

Shape legend: B batch, T length, Di channels (the convolution is depthwise: one filter per channel),
K kernel width (d_conv).

    y_t = SiLU(bias + Σ_{k<K} w_k ⊙ x_{t−K+1+k}),   x_t = 0 for t < 0

Two implementations, equal up to fp32 rounding (tests/nn/test_causal_conv.py, values and gradients):
"torch", F.conv1d on the transposed input (its K − 1 left zeros as padding) then F.silu, the
reference; "cpp", causal_conv.cpp in the one C++ extension (nn/quant_kernel.py), which reads and
writes (B, T, Di) directly and recomputes the pre-activation in the backward pass (bench/mamba_block.py
times both inside a Mamba layer).

Source: Gu & Dao 2023, "Mamba", §3.4 and Figure 3; the fused causal-conv1d kernel of the reference
implementation (state-spaces/mamba) for the same operation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.errors import UserError
from attnlab.nn import quant_kernel  # the one C++ extension, built at first use

IMPLS = ("cpp", "torch")


class _ConvSiLU(torch.autograd.Function):
    """y = SiLU(causal depthwise conv(x)) by the C++ kernels: x (B, T, Di), w (K, Di), bias (Di,) or None."""

    @staticmethod
    def forward(ctx, x, w, bias):
        ctx.save_for_backward(x, w, bias)
        return torch.ops.attnlab_conv.conv_silu_forward(x, w, bias)

    @staticmethod
    def backward(ctx, g_y):
        x, w, bias = ctx.saved_tensors
        gx, gw, gb = torch.ops.attnlab_conv.conv_silu_backward(x, w, bias, g_y.contiguous())
        return gx, gw.sum(0), None if bias is None else gb.sum(0)


def _register_fakes() -> None:
    """Shapes of the kernels' outputs, for torch.compile (run once the extension has loaded)."""
    torch.library.register_fake("attnlab_conv::conv_silu_forward")(lambda x, w, bias: torch.empty_like(x))
    torch.library.register_fake("attnlab_conv::conv_silu_backward")(
        lambda x, w, bias, g_y: [torch.empty_like(x), x.new_empty(x.shape[0], w.shape[0], x.shape[2]),
                                 x.new_empty(x.shape[0], x.shape[2])])


quant_kernel.ON_LOAD.append(_register_fakes)


def causal_conv1d_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       impl: str | None = None) -> torch.Tensor:
    """SiLU of the causal depthwise convolution of x over time (module docstring).

    Args:
        x: (B, T, Di). weight: (Di, 1, K), nn.Conv1d(Di, Di, K, groups=Di)'s. bias: (Di,) or None.
        impl: "cpp", "torch", or None = the best available ("cpp" where the extension builds and x is
            on the CPU).
    Returns:
        (B, T, Di): x's dtype with "torch"; fp32 with "cpp" (which computes in fp32, also under autocast).
    Raises:
        UserError: for an unknown impl, "cpp" where the extension is not available, or shapes that
            disagree.
    Source: Gu & Dao 2023, §3.4.
    """
    if impl not in (None, *IMPLS):
        raise UserError(f"impl must be one of {', '.join(IMPLS)} or None, got {impl!r}", param="impl")
    di, k = x.shape[-1], weight.shape[-1]
    if x.dim() != 3 or weight.shape != (di, 1, k) or (bias is not None and bias.shape != (di,)):
        raise UserError(f"causal conv shapes disagree: x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias "
                        f"{None if bias is None else tuple(bias.shape)} (want (B, T, Di), (Di, 1, K), (Di,))")
    cpp = x.device.type == "cpu" and quant_kernel.kernel() == "cpp" and k <= 8
    if impl == "cpp" and not cpp:
        raise UserError("impl 'cpp': the C++ extension is not available here, or K > 8", param="impl")
    if cpp and impl != "torch":
        w = weight.float().view(di, k).t().contiguous()                                 # (K, Di)
        return _ConvSiLU.apply(x.float().contiguous(), w, None if bias is None else bias.float().contiguous())
    full = F.pad(x.transpose(1, 2), (k - 1, 0))                                          # (B, Di, K − 1 + T)
    return F.silu(F.conv1d(full, weight, bias, groups=di)).transpose(1, 2)               # (B, T, Di)
