import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.mlp import FeedForward, SwiGLU, gated_silu, make_ffn
from attnlab.nn.moe import MixtureOfExperts, load_balancing_loss
from attnlab.nn.norm import RMSNorm, make_norm

D, FF = 32, 48


# ----------------------------------------------------------------------------- RMSNorm
def test_rmsnorm_equals_formula_with_gain():
    norm = RMSNorm(D, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(D))
    x = torch.randn(2, 5, D) * 3
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected, atol=1e-6, rtol=1e-5)


def test_rmsnorm_known_answer():
    norm = RMSNorm(4, eps=0.0)
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # mean square 7.5
    expected = [v / 7.5 ** 0.5 for v in (1.0, 2.0, 3.0, 4.0)]
    assert norm(x)[0].tolist() == pytest.approx(expected, abs=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 0.0, -1.0, 1.0]))
    assert norm(x)[0].tolist() == pytest.approx([2 * expected[0], 0.0, -expected[2], expected[3]], abs=1e-6)
    # not centred: a constant vector normalises to all ones (LayerNorm would give zeros)
    assert RMSNorm(4, eps=0.0)(torch.full((1, 4), -5.0))[0].tolist() == pytest.approx([-1.0] * 4)


def test_rmsnorm_is_fp32_inside_for_bf16_and_fp16_input():
    torch.manual_seed(0)
    norm = RMSNorm(D)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(D) + 0.5)
    x = torch.randn(3, 7, D) * 4
    ref = norm(x)  # fp32 all the way
    low = norm.to(torch.bfloat16)
    out = low(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    # the mean square is exactly the fp32 one: equals normalising the bf16 input in fp32, then casting
    xb = x.to(torch.bfloat16)
    h = (xb.float() * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + norm.eps)).to(torch.bfloat16)
    assert torch.equal(out, low.weight * h)
    # values whose squares overflow fp16 (> 65504) still normalise (fp32 sum of squares)
    big = torch.full((1, 1, D), 1000.0, dtype=torch.float16)
    out16 = RMSNorm(D).to(torch.float16)(big)
    assert torch.isfinite(out16).all() and out16.float().sub(1.0).abs().max() < 1e-3


def test_make_norm_kinds_and_unknown():
    assert isinstance(make_norm("rmsnorm", D), RMSNorm)
    ln = make_norm("layernorm", D, bias=False)
    assert isinstance(ln, nn.LayerNorm) and ln.bias is None
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("batchnorm", D)


# ----------------------------------------------------------------------------- FFNs
def test_swiglu_equals_formula():
    torch.manual_seed(0)
    ffn = SwiGLU(D, FF)
    x = torch.randn(2, 3, D)
    expected = ffn.down_proj(F.silu(ffn.gate_proj(x)) * ffn.up_proj(x))
    torch.testing.assert_close(ffn(x), expected, atol=0, rtol=0)
    # explicitly with the matrices: W_down (silu(W_gate x) ⊙ W_up x), no biases by default
    assert ffn.gate_proj.bias is None and ffn.down_proj.bias is None
    manual = (F.silu(x @ ffn.gate_proj.weight.T) * (x @ ffn.up_proj.weight.T)) @ ffn.down_proj.weight.T
    torch.testing.assert_close(ffn(x), manual, atol=1e-6, rtol=1e-5)


def test_make_ffn_kinds_and_unknown_activation():
    assert isinstance(make_ffn(D, FF, "swiglu"), SwiGLU)
    assert isinstance(make_ffn(D, FF, "gelu"), FeedForward)
    with pytest.raises(ValueError, match="swiglu"):
        make_ffn(D, FF, "tanh")


# ----------------------------------------------------------------------------- mixture of experts
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("bias", [False, True])
def test_single_expert_moe_equals_dense_ffn(activation, bias):
    torch.manual_seed(0)
    moe = MixtureOfExperts(D, FF, n_experts=1, top_k=1, activation=activation, bias=bias)
    dense = make_ffn(D, FF, activation, bias=bias)
    assert type(dense) is type(moe.experts[0])
    dense.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(2, 5, D)
    y, aux = moe(x)
    torch.testing.assert_close(y, dense(x), atol=1e-6, rtol=1e-5)
    assert aux.item() == 1.0


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_all_experts_moe_equals_router_weighted_sum(activation):
    torch.manual_seed(1)
    e = 4
    moe = MixtureOfExperts(D, FF, n_experts=e, top_k=e, activation=activation)
    x = torch.randn(2, 5, D)
    y, _ = moe(x)
    probs = moe.router(x).softmax(-1)  # (B, T, E)
    expected = sum(probs[..., i:i + 1] * moe.experts[i](x) for i in range(e))
    torch.testing.assert_close(y, expected, atol=1e-6, rtol=1e-5)


def test_top2_moe_equals_renormalised_top2_reference():
    torch.manual_seed(2)
    moe = MixtureOfExperts(D, FF, n_experts=4, top_k=2)
    x = torch.randn(1, 6, D)
    y, _ = moe(x)
    probs = moe.router(x[0]).softmax(-1)
    for t in range(6):
        w, idx = probs[t].topk(2)
        w = w / w.sum()
        expected = sum(w[j] * moe.experts[int(idx[j])](x[0, t:t + 1]) for j in range(2))
        torch.testing.assert_close(y[0, t:t + 1], expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("e,k", [(4, 1), (4, 2), (8, 2), (3, 3)])
def test_load_balancing_loss_equals_top_k_when_uniform(e, k):
    n = 2 * e
    probs = torch.full((n, e), 1.0 / e)
    index = torch.tensor([[(i + j) % e for j in range(k)] for i in range(n)])  # every slot spreads evenly
    assert load_balancing_loss(probs, index, e).item() == pytest.approx(k, abs=1e-6)


def test_load_balancing_loss_grows_when_skewed():
    e, k, n = 4, 2, 8
    uniform = load_balancing_loss(torch.full((n, e), 0.25), torch.tensor([[i % e, (i + 1) % e] for i in range(n)]), e)
    skew_probs = torch.tensor([[0.7, 0.2, 0.05, 0.05]]).expand(n, e)
    skew_index = torch.tensor([[0, 1]]).expand(n, k)
    skewed = load_balancing_loss(skew_probs, skew_index, e)
    assert skewed.item() > uniform.item() + 0.5
    # known value: E · Σ_j Σ_i f_ji P_i = 4 · (1 · 0.7 + 1 · 0.2) = 3.6
    assert skewed.item() == pytest.approx(3.6, abs=1e-6)
    # fully collapsed top-1 routing reaches E
    collapsed = load_balancing_loss(torch.tensor([[1.0, 0, 0, 0]]).expand(n, e), torch.zeros(n, 1, dtype=torch.long), e)
    assert collapsed.item() == pytest.approx(e)


def test_load_balancing_loss_gradient_flows_through_probs_only():
    logits = torch.randn(6, 4, requires_grad=True)
    probs = logits.softmax(-1)
    loss = load_balancing_loss(probs, probs.topk(2, dim=-1).indices, 4)
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("k", [0, 5])
def test_bad_top_k_raises(k):
    with pytest.raises(ValueError, match="moe_top_k"):
        MixtureOfExperts(D, FF, n_experts=4, top_k=k)


# ----------------------------------------------------------------------------- padding (issue 12 item 2)
REAL_PROBS = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0.5, 0.2, 0.2, 0.1]])  # 3 real tokens
PAD_PROBS = torch.tensor([[0.05, 0.05, 0.05, 0.85]]).expand(2, 4)  # 2 padding positions, all on expert 3


@pytest.mark.parametrize("real_index,pad_index,expected", [
    # top-1: f = (2/3, 1/3, 0, 0), P = (1.3, 0.9, 0.5, 0.3) / 3: 4 · (2.6 + 0.9) / 9 = 14/9
    ([[0], [1], [0]], [[3], [3]], 14 / 9),
    # top-2: f = (2/3, 1, 1/3, 0): 4 · (2.6 + 2.7 + 0.5) / 9 = 23.2/9
    ([[0, 1], [1, 2], [0, 1]], [[3, 0], [3, 0]], 23.2 / 9),
])
def test_load_balancing_loss_leaves_padding_out(real_index, pad_index, expected):
    """Issue 12 item 2: padding counted in f_i and P_i; with a token mask only the real tokens do,
    wherever the padding sits (left, right, between rows)."""
    real_index, pad_index = torch.tensor(real_index), torch.tensor(pad_index)
    alone = load_balancing_loss(REAL_PROBS, real_index, 4)
    assert alone.item() == pytest.approx(expected, abs=1e-6)
    for order in ([3, 4, 0, 1, 2], [0, 1, 2, 3, 4], [0, 3, 1, 4, 2]):  # left pads, right pads, mixed
        probs = torch.cat([REAL_PROBS, PAD_PROBS])[order]
        index = torch.cat([real_index, pad_index])[order]
        mask = torch.tensor([True, True, True, False, False])[order]
        assert load_balancing_loss(probs, index, 4, mask).item() == pytest.approx(expected, abs=1e-6)
        assert load_balancing_loss(probs, index, 4).item() != pytest.approx(expected, abs=1e-2)  # unmasked: off


def test_load_balancing_loss_of_only_padding_is_zero_and_bad_mask_raises():
    probs, index = PAD_PROBS, torch.tensor([[3], [3]])
    assert load_balancing_loss(probs, index, 4, torch.zeros(2, dtype=torch.bool)).item() == 0.0
    with pytest.raises(ValueError, match="token_mask"):
        load_balancing_loss(probs, index, 4, torch.ones(3, dtype=torch.bool))


@pytest.mark.parametrize("k", [1, 2])
def test_moe_forward_token_mask_gives_the_loss_of_the_real_tokens(k):
    torch.manual_seed(0)
    moe = MixtureOfExperts(D, FF, n_experts=4, top_k=k)
    with torch.no_grad():
        moe.router.weight.normal_(0, 1.0)  # a skewed router: padding would move the loss
    real = torch.randn(1, 3, D)
    pads = torch.randn(1, 2, D)
    y_alone, alone = moe(real)
    for x, mask in ((torch.cat([pads, real], 1), [0, 0, 1, 1, 1]), (torch.cat([real, pads], 1), [1, 1, 1, 0, 0])):
        mask = torch.tensor([mask], dtype=torch.bool)
        y, aux = moe(x, mask)
        torch.testing.assert_close(aux, alone, atol=1e-6, rtol=0)
        torch.testing.assert_close(y[mask], y_alone[0], atol=1e-6, rtol=1e-5)  # outputs are per token
    with pytest.raises(ValueError, match="token_mask"):
        moe(real, torch.ones(1, 4, dtype=torch.bool))


@pytest.mark.parametrize("k", [1, 2])
def test_load_balancing_loss_with_padding_equals_hugging_face_mixtral(k):
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
    torch.manual_seed(0)
    logits = torch.randn(2 * 5, 4) * 2  # (B·T, E) router logits of one layer
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])  # (B, T) 1 = real token
    expected = mixtral.load_balancing_loss_func((logits,), 4, k, mask)
    probs = logits.softmax(-1)
    ours = load_balancing_loss(probs, probs.topk(k, dim=-1).indices, 4, mask.reshape(-1).bool())
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)


def test_gated_silu_gradients_equal_autograds_and_it_keeps_only_its_inputs():
    gate = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(gated_silu, (gate, up))
    g32, u32 = gate.detach().float().requires_grad_(), up.detach().float().requires_grad_()
    weights = torch.linspace(-1, 1, g32.numel()).view_as(g32)
    (gated_silu(g32, u32) * weights).sum().backward()
    g_ref, u_ref = gate.detach().float().requires_grad_(), up.detach().float().requires_grad_()
    (torch.nn.functional.silu(g_ref) * u_ref * weights).sum().backward()
    assert torch.equal(g32.grad, g_ref.grad) and torch.equal(u32.grad, u_ref.grad)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        gated_silu(g32, u32)
    assert len(saved) == 2 and saved[0] is g32 and saved[1] is u32  # no SiLU(gate) kept
