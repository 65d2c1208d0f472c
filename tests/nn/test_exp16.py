"""The C++ kernels' inline exp (decode_ops.h exp16) rounds as PyTorch's own vectorized exp (Sleef's
expf16_u10, the exp inside F.silu): the convolution kernel with one tap of weight 1 is F.silu(x), bit
for bit, over the whole range of exp (through its underflow at −104 and overflow past 88.7), at
the special values; and the selective scan's decays exp(Δ A), which take lanes.h's cheaper vexp2,
within its stated bound."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn import quant_kernel
from attnlab.nn.causal_conv import causal_conv1d_silu
from attnlab.nn.ssm import selective_scan

pytestmark = pytest.mark.skipif(quant_kernel.kernel() != "cpp", reason="the C++ extension does not build here")

SPECIAL = [0.0, 1.0, -1.0, 88.72, 88.73, 100.0, 100.01, -87.33, -103.97, -104.0, -104.01, -150.0,
           float("inf"), float("-inf"), float("nan"), 1e-30, -1e-30, 0.5 * 0.6931472, -0.5 * 0.6931472]


def _silu_by_kernel(x: torch.Tensor) -> torch.Tensor:
    """x (n,) through conv_silu_forward with K = 1, weight 1, no bias: SiLU(0 + 1 · x) = x / (1 + exp(−x))
    (−0 becomes +0 in that sum, so −0 is not among the SPECIAL values)."""
    n = x.numel()
    return causal_conv1d_silu(x.view(1, 1, n), torch.ones(n, 1, 1), impl="cpp").view(n)


def _grid() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    dense = torch.linspace(-110.0, 110.0, 400_003)
    small = torch.randn(200_000, generator=g) * 3                     # where exp's result is near 1
    tiny = torch.randn(50_000, generator=g) * 1e-4
    return torch.cat([dense, small, tiny, torch.tensor(SPECIAL)])


def test_exp_inside_silu_is_pytorchs_bit_for_bit():
    x = _grid()
    got, want = _silu_by_kernel(x), F.silu(x)
    same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())
    bad = (~same).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} values differ, first x = {x[bad[0]].item()!r}"


def test_decays_are_exp_within_the_stated_bound():
    """h_1 = exp(Δ A) · h_0 with h_0 = 1, x = 0: the scan returns its decays themselves, computed as
    2^(Δ log2(e) · A) by lanes.h vexp2: against e^x in float64, a relative error of at most
    2e-7 (the polynomial's 3 ulp) + 1.2e-7 · |x| (the argument's two roundings, Δ · log2(e) then · A:
    each moves x by up to 2^-24 of itself); below fp32's normal range (x < −87.3) within its smallest
    normal of e^x (the AVX512 build's scalef keeps denormals, the AVX2 build flushes them to 0);
    exactly 1 at x = 0 (Δ = 0 leaves the state as it is)."""
    g = torch.Generator().manual_seed(0)
    a = -torch.cat([torch.linspace(0.0, 110.0, 4096), torch.rand(4096, generator=g) * 5,
                    torch.rand(8192, generator=g) * 88])  # A ≤ 0, as the model's
    di = a.numel()
    zero = torch.zeros(1, 1, di)
    _, h = selective_scan(zero, torch.ones(1, 1, di), a.view(di, 1), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1),
                          h0=torch.ones(1, di, 1), impl="cpp")
    got, want = h.view(di).double(), torch.exp(a.double())
    normal = want >= torch.finfo(torch.float32).tiny
    rel = (got - want).abs()[normal] / want[normal]
    assert (rel <= 2e-7 + 1.2e-7 * a.double().abs()[normal]).all(), rel.max().item()
    assert (got - want).abs()[~normal].max().item() <= torch.finfo(torch.float32).tiny
    assert got[0].item() == 1.0
