"""rms_norm.cpp (nn/norm.py RMSNorm on fp32 CPU rows): the composition's values bit for bit (the fused
decoding step and the reference model agree bit for bit through it) and gradients (1e-6 of the largest), a width that is not a multiple of the vector lanes, rows past one
∂w block; the same bits on 1 and 2 threads; a marked output recomputed to the same bits; the same
bits with and without gradients."""
from __future__ import annotations

import pytest
import torch

from attnlab.nn import quant_kernel, recompute
from attnlab.nn.norm import RMSNorm

pytestmark = pytest.mark.skipif(quant_kernel.kernel() != "cpp", reason="the C++ extension is not built here")


def norm(d: int) -> RMSNorm:
    torch.manual_seed(0)
    n = RMSNorm(d, eps=1e-5)
    with torch.no_grad():
        n.weight.uniform_(0.5, 1.5)
    return n


def grads(n: RMSNorm, x: torch.Tensor, g: torch.Tensor, fn) -> tuple:
    x = x.clone().requires_grad_(True)
    n.zero_grad(set_to_none=True)
    y = fn(x)
    y.backward(g)
    return y.detach(), x.grad, n.weight.grad.clone()


@pytest.mark.parametrize("shape", [(3, 70, 100), (2, 5, 128), (1, 1, 7)])
def test_equals_the_composition(shape):
    n = norm(shape[-1])
    x, g = torch.randn(shape) * 3, torch.randn(shape)
    ours = grads(n, x, g, n)
    ref = grads(n, x, g, n._normalize)
    assert n(x.clone().requires_grad_(True)).grad_fn.name().endswith("_FusedRMSNormBackward")  # the kernel ran
    assert torch.equal(ours[0], ref[0])
    for a, b in zip(ours[1:], ref[1:]):
        assert (a - b).abs().max() <= 1e-6 * b.abs().max()


def test_same_bits_on_one_and_two_threads():
    n = norm(96)
    x, g = torch.randn(4, 50, 96), torch.randn(4, 50, 96)
    kept = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = grads(n, x, g, n)
        torch.set_num_threads(2)
        two = grads(n, x, g, n)
    finally:
        torch.set_num_threads(kept)
    for a, b in zip(one, two):
        assert torch.equal(a, b)


def test_a_marked_output_recomputes_to_the_same_bits():
    n, lin = norm(64), torch.nn.Linear(64, 32)
    x, g = torch.randn(2, 9, 64), torch.randn(2, 9, 32)
    out = []
    for saving in (False, True):
        xr = x.clone().requires_grad_(True)
        n.zero_grad(set_to_none=True)
        lin.zero_grad(set_to_none=True)
        if saving:
            with recompute.saving_marked():
                y = lin(n(xr))
        else:
            y = lin(n(xr))
        y.backward(g)
        out.append((xr.grad, n.weight.grad.clone(), lin.weight.grad.clone()))
    for a, b in zip(*out):
        assert torch.equal(a, b)


def test_with_and_without_gradients_the_same_bits():
    # a frozen model (LoRA's base) and a trained one give the same forward: the choice of kernel does
    # not depend on whether the input requires gradients
    n = norm(40)
    x = torch.randn(3, 40)
    with torch.no_grad():
        frozen = n(x)
    assert torch.equal(n(x.clone().requires_grad_(True)).detach(), frozen)
    assert torch.equal(n(x).detach(), frozen)
