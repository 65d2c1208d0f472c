"""Normalisation layers: LayerNorm and RMSNorm.

Shape legend: B batch, T length, D model dim.
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.nn import recompute

NORMS = ("layernorm", "rmsnorm")


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x²) + eps) · g: LayerNorm without centring and without a bias.

    The mean square is taken in fp32 whatever the input dtype (as LLaMA does), and the result is
    cast back before the gain is applied. In training the output is marked as recomputable from the
    input (nn/recompute.py): the layers that save it for their backward keep the input instead,
    which the norm's own backward keeps anyway.

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
        return recompute.mark(self._normalize(x), self._normalize, x)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h.to(x.dtype)).to(x.dtype)


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
