"""LoRAProduct (nn/lora_product.py): the training product of a LoRA layer gives the composition's
output and gradients (autograd's own ops: base_layer(x) + update(x)), and saves only the adapters'
inputs, never an (R, O) tensor."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.nn import lora_product
from attnlab.nn.lora import LoRALinear
from attnlab.nn.quant_linear import quantize_model


def layer(bias: bool, dropout: float = 0.0, dtype=torch.float32) -> LoRALinear:
    torch.manual_seed(0)
    lora = LoRALinear(nn.Linear(24, 40, bias=bias, dtype=dtype), rank=4, alpha=8, dropout=dropout).to(dtype)
    with torch.no_grad():
        lora.lora_B.weight.normal_(0, 0.1)
    return lora.train()


def reference(lora: LoRALinear, x: torch.Tensor) -> torch.Tensor:
    """The composition of autograd's ops (the layer's path without gradients)."""
    y = lora.base_layer(x)
    return y + lora.update(x).to(y.dtype)


def grads(lora: LoRALinear, x: torch.Tensor, forward, seed: int = 3):
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)  # the same dropout mask on both paths
    y = forward(lora, x)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y).to(y.dtype)).sum().backward()
    out = (y.detach(), x.grad, lora.lora_A.weight.grad.clone(), lora.lora_B.weight.grad.clone())
    lora.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_output_and_gradients_equal_autograds(bias, dropout):
    lora = layer(bias, dropout)
    x = torch.randn(3, 5, 24)
    ours = grads(lora, x, lambda m, t: m(t))
    ref = grads(lora, x, reference)
    for a, b in zip(ours, ref):
        assert (a - b).abs().max() <= 1e-6 * max(b.abs().max(), 1.0)


def test_gradcheck_in_float64():
    lora = layer(True, 0.0, torch.float64)
    x = torch.randn(2, 3, 24, dtype=torch.float64, requires_grad=True)
    a, b = lora.lora_A.weight, lora.lora_B.weight
    fn = lambda x, a, b: lora_product.LoRAProduct.apply(x, None, a, b, lora.base_layer, lora.scaling)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, a, b))


def test_quantized_base_gradients_equal_the_composition():
    base = nn.Sequential(nn.Linear(64, 32, bias=False))
    quantize_model(base, "q8_0")
    torch.manual_seed(0)
    lora = LoRALinear(base[0], rank=4, alpha=8).train()
    with torch.no_grad():
        lora.lora_B.weight.normal_(0, 0.1)
    x = torch.randn(2, 20, 64)
    ours, ref = grads(lora, x, lambda m, t: m(t)), grads(lora, x, reference)
    for a, b in zip(ours, ref):
        assert (a - b).abs().max() <= 1e-5 * max(b.abs().max(), 1.0)


def test_saves_only_the_input_and_the_rank_r_product():
    lora = layer(False)
    x = torch.randn(4, 6, 24, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        lora(x)
    assert sorted(saved) == sorted([(24, 24), (24, 4), (4, 24), (40, 4)])  # x (R, I), u (R, r), A, B


def test_not_used_under_autocast_or_a_trained_base():
    lora = layer(False)
    x = torch.randn(2, 24)
    assert lora_product.usable(lora.base_layer, x, lora.lora_A.weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not lora_product.usable(lora.base_layer, x, lora.lora_A.weight)
    lora.base_layer.weight.requires_grad_(True)
    assert not lora_product.usable(lora.base_layer, x, lora.lora_A.weight)
