"""Position-wise feed-forward networks: the paper's FFN (ReLU/GELU) and SwiGLU.

Shape legend: B batch, T length, D model dim, F hidden dim (d_ff).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import UserError
from attnlab.nn import recompute
from attnlab.nn.linear import Linear


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (GPT-2's "gelu_new"; Hendrycks & Gimpel 2016, §2)."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": gelu_tanh}
FFN_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")


class FeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x + b1) + b2, applied to each position separately.

    Args:
        d_model: D. d_ff: F (the paper uses 4·D). activation: "relu" (paper), "gelu" (BERT) or
            "gelu_tanh" (GPT-2's tanh approximation).
        dropout: dropout on the hidden activations. bias: biases on both projections.
    Source: Vaswani et al. 2017, §3.3, equation (2).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise UserError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.up_proj = Linear(d_model, d_ff, bias=bias)
        self.down_proj = Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.down_proj(self.dropout(self.act(self.up_proj(x))))


class _GatedSiLU(torch.autograd.Function):
    """SiLU(g) ⊙ u saving only g and u: autograd's two ops (silu, mul) also keep SiLU(g), an (R, F)
    tensor per layer. The backward recomputes σ(g): ∂/∂u = grad ⊙ SiLU(g), ∂/∂g = silu_backward(grad ⊙ u, g),
    the ops' own formulas in their order (the same values; ∂/∂u formed in SiLU(g)'s place, no second
    (R, F) temporary)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return _gated(gate, up)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate) if ctx.needs_input_grad[0] else None
        grad_up = F.silu(gate).mul_(grad) if ctx.needs_input_grad[1] else None  # in SiLU(g)'s place: one (R, F) less
        return grad_gate, grad_up


def _gated(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate).mul_(up)


def gated_silu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) ⊙ up, SwiGLU's gating (same shapes and dtype); in training one autograd function
    that keeps only its two inputs (_GatedSiLU), its output marked as recomputable from them
    (nn/recompute.py: the down projection that saves it keeps gate and up instead, kept anyway)."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad) and gate.dtype == up.dtype \
            and not torch.is_autocast_enabled(gate.device.type):
        return recompute.mark(_GatedSiLU.apply(gate, up), _gated, gate, up)
    return F.silu(gate) * up


class SwiGLU(nn.Module):
    """SwiGLU(x) = W_down (SiLU(W_gate x) ⊙ W_up x), the FFN of LLaMA, Mistral and Qwen.

    Three matrices instead of two, so models usually take F ≈ 8/3 · D to keep the FFN's
    parameter count at the 4·D two-matrix FFN's.

    Args:
        d_model: D. d_ff: F. dropout: on the gated hidden activations. bias: on all projections.
    Source: Shazeer 2020, "GLU Variants Improve Transformer", equation (6) (FFN_SwiGLU).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = False):
        super().__init__()
        self.gate_proj = Linear(d_model, d_ff, bias=bias)
        self.up_proj = Linear(d_model, d_ff, bias=bias)
        self.down_proj = Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.down_proj(self.dropout(gated_silu(self.gate_proj(x), self.up_proj(x))))


def make_ffn(d_model: int, d_ff: int, activation: str, dropout: float = 0.0, bias: bool = True) -> nn.Module:
    """FeedForward for "relu"/"gelu"/"gelu_tanh", SwiGLU for "swiglu".

    Raises:
        ValueError: for an unknown activation, listing the allowed ones.
    """
    if activation == "swiglu":
        return SwiGLU(d_model, d_ff, dropout, bias)
    if activation not in ACTIVATIONS:
        raise UserError(f"activation must be one of {FFN_ACTIVATIONS}, got {activation!r}")
    return FeedForward(d_model, d_ff, activation, dropout, bias)
