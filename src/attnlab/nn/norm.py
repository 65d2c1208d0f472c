"""Normalisation layers: LayerNorm and RMSNorm.

Shape legend: B batch, T length, D model dim.
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.nn import quant_kernel, recompute  # quant_kernel: the one C++ extension (rms_norm.cpp)

NORMS = ("layernorm", "rmsnorm")


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x²) + eps) · g: LayerNorm without centring and without a bias.

    The mean square is taken in fp32 whatever the input dtype (as LLaMA does), and the result is
    cast back before the gain is applied. In training the output is marked as recomputable from the
    input (nn/recompute.py): the layers that save it for their backward keep the input instead,
    which the norm's own backward keeps anyway.

    fp32 CPU rows, where the C++ extension builds (nn/quant_kernel.py), take rms_norm.cpp: one pass
    over each row forward and backward in place of the composition's ~15 operator calls (the forward
    its values bit for bit, the gradients to fp32 rounding: tests/nn/test_rms_norm_kernel.py), with
    or without gradients; elsewhere the composition.

    Args:
        d_model: D. eps: added to the mean square.
    Source: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", equation (4).
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D), same dtype."""
        if (x.dtype == torch.float32 and x.device.type == "cpu" and self.weight.dtype == torch.float32
                and quant_kernel.kernel() == "cpp"):
            out = _FusedRMSNorm.apply(x, self.weight, self.eps)
            return recompute.mark(out, self._fused, x)
        return recompute.mark(self._normalize(x), self._normalize, x)

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        """rms_norm.cpp's forward (the recomputation of a marked output: the same bits)."""
        return torch.ops.attnlab_norm.rms_forward(x.contiguous(), self.weight, self.eps)[0]

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h.to(x.dtype)).to(x.dtype)


class _FusedRMSNorm(torch.autograd.Function):
    """RMSNorm by rms_norm.cpp: x (..., D) fp32, weight (D,) fp32 -> (..., D), a tensor of its own
    (not a view: recompute.mark's attribute is found on it); its backward gives ∂x and ∂weight (the
    kernel's per-block partial sums added here)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        x = x.contiguous()
        y, rstd = torch.ops.attnlab_norm.rms_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, g):
        x, weight, rstd = ctx.saved_tensors
        gx, gw = torch.ops.attnlab_norm.rms_backward(g.contiguous(), x, weight, rstd)
        return gx, gw.sum(0), None


def _register_fakes() -> None:
    """Shapes of the kernels' outputs, for torch.compile (run once the extension has loaded)."""
    torch.library.register_fake("attnlab_norm::rms_forward")(
        lambda x, w, eps: (torch.empty_like(x), x.new_empty(x.numel() // x.shape[-1])))
    torch.library.register_fake("attnlab_norm::rms_backward")(
        lambda g, x, w, rstd: (torch.empty_like(x), x.new_empty(-(-(x.numel() // x.shape[-1]) // 64), x.shape[-1])))


quant_kernel.ON_LOAD.append(_register_fakes)


def make_norm(kind: str, d_model: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """A "layernorm" (with or without bias) or "rmsnorm" of width d_model.

    Raises:
        ValueError: for an unknown kind.
    """
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps=eps)
    raise UserError(f"norm must be one of {NORMS}, got {kind!r}")
