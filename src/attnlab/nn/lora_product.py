"""The training product of a LoRA layer as one autograd function: the frozen base plus the update,
saving only what the adapters' gradients need.

Shape legend: R rows (batch × tokens), I in_features, O out_features, r rank.

    h = x W₀ᵀ (+ b) + s · (x̃ Aᵀ) Bᵀ          x̃ = dropout(x) (x itself without dropout), s = α / r

Composed of autograd's own ops, the layer keeps x̃ for A's gradient, keeps u = x̃ Aᵀ for B's, and
runs three (R, O) element-wise passes (the update, its scaling, the sum) forward and more backward.
Here the update is added into the base's output in place (addmm, β = 1, α = s), and the backward is

    ∂L/∂x = g W₀  (+ through x̃:  s · (g B) A)       ∂L/∂B = s · gᵀ u       ∂L/∂A = s · (g B)ᵀ x̃

with the base's input gradient and the update's summed in place too. Saved: x̃ (the tensor the
layer's input already is without dropout: nothing new) and u (R, r); never an (R, O) tensor, and
no gradient of the frozen W₀ (which is neither computed nor asked for). The base is an fp32 / bf16
nn.Linear or a QuantLinear (its quantized product and its input gradient, nn/quant_linear.py).

Source: Hu et al. 2021, §4.1 (the update); the gradients are those of the composition, in the
order autograd takes them (tests/nn/test_lora_product.py compares them to autograd's to 1e-6).
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.nn.quant_linear import QuantLinear


def _base_product(base: nn.Module, x2: torch.Tensor) -> torch.Tensor:
    """(R, I) -> (R, O): x W₀ᵀ + b of the frozen base."""
    if isinstance(base, QuantLinear):
        y = base.product(x2)
        return y if base.bias is None else y + base.bias.to(y.dtype)
    if base.bias is None:
        return x2 @ base.weight.t()
    return torch.addmm(base.bias, x2, base.weight.t())


def _base_input_grad(base: nn.Module, g2: torch.Tensor) -> torch.Tensor:
    """(R, O) -> (R, I): g W₀, a new tensor (the update's term is added into it)."""
    if isinstance(base, QuantLinear):
        return base.input_grad(g2)
    return g2 @ base.weight


class LoRAProduct(torch.autograd.Function):
    """forward(x, x̃ or None, A, B, base, s) -> (..., O) (module docstring); x̃ None means x̃ = x."""

    @staticmethod
    def forward(ctx, x, xd, a, b, base, scaling):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xd2 = x2 if xd is None else xd.reshape(-1, shape[-1])
        u = xd2 @ a.t()  # (R, r)
        y = _base_product(base, x2)
        y = y.addmm_(u, b.t(), alpha=scaling)
        ctx.base, ctx.scaling, ctx.shape, ctx.separate = base, scaling, shape, xd is not None
        ctx.save_for_backward(xd2, u, a, b)
        return y.view(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        xd2, u, a, b = ctx.saved_tensors
        s = ctx.scaling
        g2 = grad.reshape(-1, grad.shape[-1])
        # The two products with the (R, O) gradient as (r, ·) results transposed: MKL runs these
        # skinny shapes 2.5-5x faster than g2 @ b and g2ᵀ @ u (the same sums, on AMD EPYC Zen 4)
        gb = (b.t() @ g2.t()).t()  # (R, r)
        grad_b = (u.t() @ g2).t().mul_(s) if ctx.needs_input_grad[3] else None  # (O, r)
        grad_a = (gb.t() @ xd2).mul_(s) if ctx.needs_input_grad[2] else None
        grad_x = grad_xd = None
        if ctx.needs_input_grad[0]:
            grad_x = _base_input_grad(ctx.base, g2)
            if not ctx.separate:
                grad_x.addmm_(gb, a, alpha=s)
            grad_x = grad_x.view(ctx.shape)
        if ctx.separate and ctx.needs_input_grad[1]:
            grad_xd = (gb @ a).mul_(s).view(ctx.shape)
        return grad_x, grad_xd, grad_a, grad_b, None, None


def usable(base: nn.Module, x: torch.Tensor, a: torch.Tensor) -> bool:
    """Whether LoRAProduct computes this layer exactly as the composition would: a frozen base, the
    input in the adapters' dtype (no casts between them), and no autocast (which casts each op)."""
    if torch.is_autocast_enabled(x.device.type) or x.dtype != a.dtype:
        return False
    if isinstance(base, QuantLinear):
        return x.dtype == torch.float32
    return not base.weight.requires_grad and base.weight.dtype == x.dtype and (
        base.bias is None or not base.bias.requires_grad)
