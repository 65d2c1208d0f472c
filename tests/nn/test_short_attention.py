"""The short attention of training (nn/short_attention.py): equal to SDPA in float64 (values and
every gradient; fp32 to 1e-5; grouped-query heads, padded keys, causal or not, T != S), bf16 exactly
the fp32 kernel rounded once, used by attention only where it applies (either build of the extension),
and a missing extension named."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.errors import UserError
from attnlab.nn import attention as attention_mod
from attnlab.nn import quant_kernel, short_attention
from attnlab.nn.attention import MultiHeadAttention, scaled_dot_product_attention

CPP = quant_kernel.kernel() == "cpp"
needs_cpp = pytest.mark.skipif(not CPP, reason="the C++ extension does not build here")


def _inputs(b, h, t, dh, dtype, seed=0, contiguous=False, kv_heads=None):
    g = torch.Generator().manual_seed(seed)
    heads = [h, kv_heads or h, kv_heads or h]
    if contiguous:
        return [torch.randn(b, n, t, dh, generator=g).to(dtype).requires_grad_() for n in heads]
    # (B, T, heads, Dh) viewed as (B, heads, T, Dh): the layout a projection's output gives
    return [torch.randn(b, t, n, dh, generator=g).to(dtype).transpose(1, 2).detach().requires_grad_()
            for n in heads]


def _grads(fn, xs, g_o):
    out = fn(*xs)
    out.backward(g_o.to(out.dtype))
    return [out.detach()] + [x.grad for x in xs]


@needs_cpp
@pytest.mark.parametrize("b,h,t,dh,kv_heads", [(2, 3, 64, 32, 3), (1, 2, 5, 16, 2), (2, 2, 128, 64, 2),
                                               (1, 1, 17, 128, 1), (3, 4, 33, 32, 4), (1, 1, 1, 16, 1),
                                               (2, 4, 64, 32, 2), (1, 6, 19, 16, 1)])
@pytest.mark.parametrize("contiguous", [False, True])
def test_fp32_equals_sdpa_in_float64(b, h, t, dh, kv_heads, contiguous):
    xs = _inputs(b, h, t, dh, torch.float32, seed=t, contiguous=contiguous, kv_heads=kv_heads)
    ref = [x.detach().double().requires_grad_() for x in xs]
    g_o = torch.randn(b, h, t, dh, generator=torch.Generator().manual_seed(1))
    ours = _grads(short_attention.attention, xs, g_o)
    want = _grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads < h),
                  ref, g_o)
    assert ours[0].dtype == torch.float32 and ours[0].shape == (b, h, t, dh)
    assert ours[2].shape == ours[3].shape == (b, kv_heads, t, dh)
    for got, exp in zip(ours, want):
        torch.testing.assert_close(got.double(), exp, atol=1e-5, rtol=1e-5)


@needs_cpp
def test_bf16_is_the_fp32_kernel_rounded_once_and_close_to_float64():
    xs = _inputs(2, 4, 64, 32, torch.bfloat16, seed=3)
    as_fp32 = [x.detach().float().requires_grad_() for x in xs]  # the same values, exactly
    out = short_attention.attention(*xs)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, short_attention.attention(*as_fp32).to(torch.bfloat16))
    g_o = torch.randn(2, 4, 64, 32, generator=torch.Generator().manual_seed(2)).bfloat16()
    ours = _grads(short_attention.attention, xs, g_o)
    ref = [x.detach().double().requires_grad_() for x in xs]
    want = _grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), ref, g_o.double())
    for got, exp in zip(ours, want):  # bf16's rounding of values of size ~1 (and of o inside the backward)
        torch.testing.assert_close(got.double(), exp, atol=4e-2, rtol=2e-2)


@needs_cpp
def test_a_query_never_sees_a_later_key():
    q, k, v = _inputs(1, 2, 20, 16, torch.float32, seed=5)
    out = short_attention.attention(q, k, v)
    out[:, :, 9].sum().backward()
    assert torch.all(k.grad[:, :, 10:] == 0) and torch.all(v.grad[:, :, 10:] == 0)
    assert torch.all(q.grad[:, :, :9] == 0) and q.grad[:, :, 9].abs().sum() > 0


@needs_cpp
def test_attention_uses_it_in_training_only(monkeypatch):
    calls = []
    real = short_attention.attention
    monkeypatch.setattr(short_attention, "attention", lambda *a: calls.append(1) or real(*a))
    layer = MultiHeadAttention(64, 4, dropout=0.0)
    x = torch.randn(2, 12, 64, requires_grad=True)
    train_out, _ = layer(x, is_causal=True)
    assert calls == [1]
    with torch.no_grad():  # inference keeps SDPA (and its bits)
        eval_out, _ = layer(x, is_causal=True)
    assert calls == [1]
    torch.testing.assert_close(train_out.detach(), eval_out, atol=1e-5, rtol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 projections: the kernel reads them as they are
        out, _ = layer(x, is_causal=True)
    assert calls == [1, 1] and out.dtype == torch.bfloat16


@needs_cpp
@pytest.mark.parametrize("case", ["dropout", "no_grad", "long", "odd_head_dim", "mask"])
def test_sdpa_where_it_does_not_apply(case, monkeypatch):
    calls = []
    monkeypatch.setattr(short_attention, "attention", lambda *a: calls.append(1))
    t, dh, dropout = 16, 16, 0.0
    if case == "long":
        t = short_attention.MAX_LENGTH + 1
    if case == "odd_head_dim":
        dh = 8
    if case == "dropout":
        dropout = 0.1
    q = torch.randn(1, 4, t, dh, requires_grad=case != "no_grad")
    k, v = torch.randn(1, 2, t, dh), torch.randn(1, 2, t, dh)
    if case == "mask":  # a sliding window: neither padding nor plain causal
        window = torch.ones(t, t, dtype=torch.bool).tril() & ~torch.ones(t, t, dtype=torch.bool).tril(-4)
        scaled_dot_product_attention(q, k, v, mask=window[None, None])
    else:
        scaled_dot_product_attention(q, k, v, dropout=dropout, is_causal=True)
    assert calls == []


def test_a_missing_extension_is_named(monkeypatch):
    monkeypatch.setattr(quant_kernel, "kernel", lambda: "torch")
    q = torch.randn(1, 1, 4, 16, requires_grad=True)
    assert short_attention.plan(q, q, q, None, 0.0, True) is None
    with pytest.raises(UserError, match="needs the C\\+\\+ extension"):
        short_attention.attention(q, q, q)
    out, _ = attention_mod.scaled_dot_product_attention(q, q, q, is_causal=True)  # SDPA instead
    assert out.shape == q.shape


@pytest.mark.parametrize("build", ["avx512", "avx2"])
def test_either_build_runs_it(monkeypatch, build):
    """The kernel has a native form for each build of the extension (nn/lanes.h: 16 or 8 lanes), so
    training attention takes it on AVX2 CPUs too; only without the extension does SDPA run."""
    monkeypatch.setattr(quant_kernel, "built_for", lambda: build)
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    assert short_attention.plan(q, q, q, None, 0.0, True) == (None, True)
    monkeypatch.setattr(quant_kernel, "built_for", lambda: None)
    assert short_attention.plan(q, q, q, None, 0.0, True) is None


def _padded_reference(q, k, v, lengths, causal):
    t, s = q.shape[2], k.shape[2]
    mask = torch.arange(s)[None, None, None, :] < lengths[:, None, None, None]          # (B, 1, 1, S)
    if causal:
        mask = mask & torch.ones(t, s, dtype=torch.bool).tril()
    groups = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                         attn_mask=mask)
    return out * mask.any(-1, keepdim=True)  # a query that sees no key gives zeros


@needs_cpp
@pytest.mark.parametrize("t,s,causal,kv_heads", [(23, 23, True, 4), (9, 31, False, 2), (40, 17, False, 4),
                                                 (1, 5, False, 1), (64, 64, False, 4)])
def test_padded_keys_equal_sdpa_in_float64(t, s, causal, kv_heads):
    b, h, dh = 4, 4, 64
    g = torch.Generator().manual_seed(t + s)
    xs = [torch.randn(b, n, length, dh, generator=g).requires_grad_() for n, length in
          [(h, t), (kv_heads, s), (kv_heads, s)]]
    lengths = torch.tensor([s, 1, max(1, s // 2), 0][:b])
    ref = [x.detach().double().requires_grad_() for x in xs]
    g_o = torch.randn(b, h, t, dh, generator=g)
    ours = _grads(lambda q, k, v: short_attention.attention(q, k, v, lengths, causal), xs, g_o)
    want = _grads(lambda q, k, v: _padded_reference(q, k, v, lengths, causal), ref, g_o)
    for got, exp in zip(ours, want):
        torch.testing.assert_close(got.double(), exp, atol=1e-5, rtol=1e-5)


@needs_cpp
def test_plan_reads_padding_masks_and_refuses_others():
    b, t = 3, 6
    q = torch.randn(b, 4, t, 16, requires_grad=True)
    lengths = torch.tensor([6, 2, 4])
    pad = torch.arange(t)[None, :] < lengths[:, None]                                # (B, S)
    key_pad = pad[:, None, None, :]                                                  # (B, 1, 1, S)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    found, is_causal = short_attention.plan(q, q, q, key_pad, 0.0, False)
    assert torch.equal(found, lengths) and not is_causal
    found, is_causal = short_attention.plan(q, q, q, causal[None, None] & key_pad, 0.0, False)
    assert torch.equal(found, lengths) and is_causal
    assert short_attention.plan(q, q, q, None, 0.0, True) == (None, True)
    assert short_attention.plan(q, q, q, None, 0.0, False) == (None, False)
    left = torch.flip(key_pad, dims=[-1])                                            # left padding
    assert short_attention.plan(q, q, q, left, 0.0, False) is None
    assert short_attention.plan(q, q, q, key_pad, 0.1, False) is None                # dropout
    with torch.no_grad():
        assert short_attention.plan(q, q, q, key_pad, 0.0, False) is None


@needs_cpp
def test_a_padded_batch_through_attention_equals_sdpa():
    """nn/attention.py routes a right-padded batch (the translation model's masks) to the kernel
    and gets SDPA's outputs at every real position."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, 4)
    x = torch.randn(3, 9, 64, requires_grad=True)
    pad = (torch.arange(9)[None, :] < torch.tensor([9, 3, 6])[:, None])[:, None, None, :]
    mask = torch.ones(9, 9, dtype=torch.bool).tril()[None, None] & pad
    out, _ = layer(x, mask=mask)
    with torch.no_grad():
        want, _ = layer(x, mask=mask)
    torch.testing.assert_close(out.detach(), want, atol=1e-5, rtol=1e-5)
