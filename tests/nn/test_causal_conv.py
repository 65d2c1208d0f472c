"""Mamba's causal convolution + SiLU: the C++ kernels equal F.conv1d + F.silu (values and every
gradient, fp32, 1e-5), the block's fused path equals its stateful path, and bad input is named."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn import quant_kernel
from attnlab.nn.causal_conv import causal_conv1d_silu
from attnlab.nn.mamba_block import MambaBlock, MambaState

CPP = quant_kernel.kernel() == "cpp"
needs_cpp = pytest.mark.skipif(not CPP, reason="the C++ extension does not build here")


def _run(impl, x, w, b):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    b = None if b is None else b.clone().requires_grad_()
    y = causal_conv1d_silu(x, w, b, impl=impl)
    g = torch.Generator().manual_seed(7)
    (y * torch.randn(y.shape, generator=g)).sum().backward()
    return [y.detach(), x.grad, w.grad] + ([] if b is None else [b.grad])


@needs_cpp
@pytest.mark.parametrize("b,t,di,k,bias", [(2, 9, 8, 4, True), (3, 70, 40, 4, True), (1, 5, 17, 3, False),
                                           (2, 2, 16, 4, True), (1, 6, 5, 1, True)])
def test_kernel_equals_conv1d_and_silu(b, t, di, k, bias):
    g = torch.Generator().manual_seed(t)
    x, w = torch.randn(b, t, di, generator=g), torch.randn(di, 1, k, generator=g)
    bb = torch.randn(di, generator=g) if bias else None
    for got, want, name in zip(_run("cpp", x, w, bb), _run("torch", x, w, bb), ["y", "x", "weight", "bias"]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)


def test_reference_is_causal():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 8, 4, generator=g), torch.randn(4, 1, 4, generator=g)
    y = causal_conv1d_silu(x, w, impl="torch")
    x2 = x.clone()
    x2[:, 5:] = 0  # the future does not change the past
    torch.testing.assert_close(causal_conv1d_silu(x2, w, impl="torch")[:, :5], y[:, :5])


def test_block_fused_path_equals_stateful_path():
    """Training's path (no state, no mask: the fused kernel where it builds) == prefill with a state."""
    torch.manual_seed(0)
    block = MambaBlock(d_model=8, d_state=4, d_conv=4, expand=2, dt_rank=2)
    u = torch.randn(2, 11, 8)
    with torch.no_grad():
        plain = block(u)
        stateful = block(u, state=MambaState(2, block.d_inner, block.d_conv, block.d_state))
    torch.testing.assert_close(plain, stateful, atol=1e-5, rtol=1e-5)


def test_bad_input_is_named():
    x, w = torch.zeros(2, 5, 8), torch.zeros(8, 1, 4)
    with pytest.raises(ValueError, match="impl must be one of"):
        causal_conv1d_silu(x, w, impl="cuda")
    with pytest.raises(ValueError, match="causal conv shapes disagree"):
        causal_conv1d_silu(x, torch.zeros(4, 1, 4))
