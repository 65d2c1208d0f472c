import math

import pytest
import torch

from attnlab.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from attnlab.nn.lora import LoRALinear
from attnlab.nn.masks import causal_mask, padding_mask


def per_head_reference(mha: MultiHeadAttention, x, kv, mask):
    """softmax(QKᵀ/√dk)V for each head separately, concatenated, then W_O (paper §3.2.2)."""
    dh, outs = mha.head_dim, []
    q_all, k_all, v_all = mha.q_proj(x), mha.k_proj(kv), mha.v_proj(kv)
    for h in range(mha.n_heads):
        q, k, v = (t[..., h * dh:(h + 1) * dh] for t in (q_all, k_all, v_all))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
        scores = scores.masked_fill(~mask[:, 0], float("-inf"))
        outs.append(scores.softmax(-1) @ v)
    return mha.out_proj(torch.cat(outs, -1))


def test_mha_equals_per_head_reference_both_impls():
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    src = torch.tensor([[4, 5, 6, 7, 8, 0, 0], [4, 5, 6, 7, 8, 9, 3]])
    for impl in ("sdpa", "math"):
        mha = MultiHeadAttention(16, 4, impl=impl)
        mask = padding_mask(src, 0).expand(2, 1, 5, 7)
        out, _ = mha(x, mem, mask=mask)
        torch.testing.assert_close(out, per_head_reference(mha, x, mem, mask), atol=1e-5, rtol=1e-5)


def test_math_path_returns_weights_that_sum_to_one_over_visible_keys():
    mha = MultiHeadAttention(16, 4, impl="math")
    x = torch.randn(1, 4, 16)
    _, w = mha(x, mask=causal_mask(4), need_weights=True)
    assert w.shape == (1, 4, 4, 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, 4))
    assert (w.triu(1) == 0).all()  # no weight on future keys


def test_fully_masked_rows_give_zeros_not_nan_forward_and_backward():
    for impl in ("sdpa", "math"):
        q = torch.randn(2, 2, 3, 4, requires_grad=True)
        k = torch.randn(2, 2, 5, 4, requires_grad=True)
        v = torch.randn(2, 2, 5, 4, requires_grad=True)
        mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)
        mask[0] = False  # the first batch row sees no key at all
        out, _ = scaled_dot_product_attention(q, k, v, mask, impl=impl)
        assert torch.isfinite(out).all()
        assert (out[0] == 0).all()
        out.sum().backward()
        for t in (q, k, v):
            assert torch.isfinite(t.grad).all()


def test_a_mask_every_query_sees_through_keeps_the_kernels_output():
    # a causal mask after a cached prefix (a shared-prefix training batch): no row is empty, so the
    # output is the kernel's own tensor (no zeroing product, no second (B, H, T, Dh) copy kept)
    q, k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    q.requires_grad_(True)
    mask = causal_mask(3, offset=2)
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    assert "Mul" not in type(out.grad_fn).__name__
    ref, _ = scaled_dot_product_attention(q, k, v, mask, impl="math")
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_gqa_with_n_kv_heads_equal_n_heads_is_mha_and_groups_share_kv():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_heads=4)
    ref = MultiHeadAttention(16, 4)
    ref.load_state_dict(mha.state_dict())
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(mha(x)[0], ref(x)[0])
    gqa = MultiHeadAttention(16, 4, n_kv_heads=2, impl="math")
    _, w = gqa(x, need_weights=True)
    # query heads 0,1 share KV head 0, heads 2,3 share KV head 1: same keys, different queries
    assert gqa.k_proj.out_features == 2 * gqa.head_dim
    assert w.shape == (2, 4, 5, 5)


def test_causal_mask_with_offset():
    m = causal_mask(2, offset=3)
    assert m.shape == (1, 1, 2, 5)
    assert m[0, 0].tolist() == [[True] * 4 + [False], [True] * 5]


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_is_causal_equals_the_explicit_causal_mask(impl):
    from attnlab.nn.masks import causal_mask
    q, k, v = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    fast, _ = scaled_dot_product_attention(q, k, v, None, impl=impl, is_causal=True)
    explicit, _ = scaled_dot_product_attention(q, k, v, causal_mask(9), impl="math")
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="either a mask or is_causal"):
        scaled_dot_product_attention(q, k, v, causal_mask(9), impl=impl, is_causal=True)


@pytest.mark.parametrize("n_kv_heads, bias", [(4, True), (2, False), (1, True)])
def test_training_runs_the_three_projections_as_one_product(n_kv_heads, bias, monkeypatch):
    """The stacked product of training (MultiHeadAttention._project_qkv) equals the three separate
    ones: outputs and every parameter's gradient; inference and LoRA keep the three."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, bias=bias)
    x = torch.randn(2, 7, 32)
    stacked = []
    real = layer._project_qkv
    monkeypatch.setattr(layer, "_project_qkv", lambda t: stacked.append(1) or real(t))

    def run(fused: bool):
        layer.zero_grad()
        monkeypatch.setattr(layer, "_fuses_qkv", lambda t: fused)
        out, _ = layer(x, is_causal=True)
        out.square().sum().backward()
        return [out.detach()] + [p.grad.clone() for p in layer.parameters()]

    separate, fused = run(False), run(True)
    assert stacked == [1]
    for a, b in zip(fused, separate):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    monkeypatch.undo()
    assert layer._fuses_qkv(x)
    with torch.no_grad():
        assert not layer._fuses_qkv(x)
    layer.q_proj = LoRALinear(layer.q_proj, 2, 4.0, 0.0, False)
    assert not layer._fuses_qkv(x)
