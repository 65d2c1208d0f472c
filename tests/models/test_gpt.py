import math

import pytest
import torch
import torch.nn.functional as F

from attnlab import sampling
from attnlab.models.gpt import GPTConfig
from attnlab.generate import generate
from attnlab.models.gpt import GPT
from attnlab.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from attnlab.nn.masks import causal_mask

V = 50
PRESETS = ["gpt2", "llama", "mistral", "mixtral"]


def tiny(preset, **kw):
    base = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=32, d_ff=48)
    if preset == "mixtral":
        base["n_experts"] = 4
    return GPTConfig.from_name(preset, **{**base, **kw})


def model_for(preset, seed=0, **kw):
    """A random tiny model with larger-than-init matrices, so logits are distinct and tokens varied."""
    torch.manual_seed(seed)
    model = GPT(tiny(preset, **kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    return model


def ids(*shape, seed=1):
    return torch.randint(V, shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- causality
@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("preset", PRESETS)
def test_changing_a_token_changes_no_earlier_logits(preset, impl):
    model = model_for(preset, attention_impl=impl, sliding_window=3) if preset in ("mistral", "mixtral") \
        else model_for(preset, attention_impl=impl)
    x = ids(2, 16)
    base = model(x).logits
    for t in (0, 5, 11):
        y = x.clone()
        y[:, t] = (y[:, t] + 1) % V
        out = model(y).logits
        # 1e-5, not 0: a MoE expert's rows are multiplied together, and which rows an expert gets
        # depends on later tokens too, which changes the fp32 rounding (≈ 1e-6), not the value.
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-5, rtol=0)
        assert not torch.allclose(out[:, t], base[:, t], atol=1e-4)
        if preset in ("mistral", "mixtral"):  # receptive field of 2 layers with window 3: t .. t + 2·(3 − 1)
            torch.testing.assert_close(out[:, t + 5:], base[:, t + 5:], atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- grouped-query attention
@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("h,k", [(4, 2), (6, 2), (6, 3), (4, 1)])
def test_gqa_query_head_uses_kv_head_h_div_group(h, k, impl):
    torch.manual_seed(0)
    b, t, s, dh = 2, 5, 7, 8
    q, kk, vv = torch.randn(b, h, t, dh), torch.randn(b, k, s, dh), torch.randn(b, k, s, dh)
    for mask in (None, causal_mask(t, offset=s - t)):
        out, _ = scaled_dot_product_attention(q, kk, vv, mask, impl=impl)
        assert out.shape == (b, h, t, dh)
        for head in range(h):
            g = head // (h // k)
            ref, _ = scaled_dot_product_attention(q[:, head:head + 1], kk[:, g:g + 1], vv[:, g:g + 1], mask, impl="math")
            torch.testing.assert_close(out[:, head:head + 1], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_gqa_module_equals_per_head_reference(impl):
    torch.manual_seed(0)
    h, k, dh = 4, 2, 4
    mha = MultiHeadAttention(16, h, n_kv_heads=k, impl=impl)
    x = torch.randn(2, 5, 16)
    mask = causal_mask(5)
    q_all, k_all, v_all = mha.q_proj(x), mha.k_proj(x), mha.v_proj(x)
    outs = []
    for head in range(h):
        g = head // (h // k)
        q, kk, vv = q_all[..., head * dh:(head + 1) * dh], k_all[..., g * dh:(g + 1) * dh], v_all[..., g * dh:(g + 1) * dh]
        scores = (q @ kk.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~mask[0, 0], float("-inf"))
        outs.append(scores.softmax(-1) @ vv)
    torch.testing.assert_close(mha(x, mask=mask)[0], mha.out_proj(torch.cat(outs, -1)), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- sliding window and weights
@pytest.mark.parametrize("preset", ["mistral", "mixtral"])
def test_sliding_window_weights_are_zero_outside_window(preset):
    model = model_for(preset, sliding_window=3)
    out = model(ids(2, 10), need_weights=True)
    allowed = causal_mask(10, window=3)[0, 0]
    assert len(out.attentions) == 2
    for w in out.attentions:
        assert w.shape == (2, 4, 10, 10)
        assert (w[..., ~allowed] == 0).all() and (w[..., allowed] > 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 10))


@pytest.mark.parametrize("preset", PRESETS)
def test_need_weights_shapes_and_math_equals_sdpa(preset):
    math_model, sdpa_model = model_for(preset, attention_impl="math"), model_for(preset, attention_impl="sdpa")
    sdpa_model.load_state_dict(math_model.state_dict())
    x = ids(2, 9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :4] = False  # left padding
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    for m, p in ((None, None), (mask, pos)):
        a, b = math_model(x, m, p), sdpa_model(x, m, p)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
        assert a.attentions is None
    out = sdpa_model(x, need_weights=True)  # need_weights forces the math path whatever the impl
    assert [w.shape for w in out.attentions] == [(2, 4, 9, 9)] * 2
    torch.testing.assert_close(out.logits, math_model(x).logits, atol=1e-5, rtol=1e-5)
    # with a KV cache: one new token attends to all held positions
    sdpa_model.setup_kv_cache(2, 12)
    assert sdpa_model(x[:, :5], need_weights=True).attentions[0].shape == (2, 4, 5, 5)
    step = sdpa_model(x[:, 5:6], need_weights=True).attentions
    sdpa_model.clear_kv_cache()
    assert step[1].shape == (2, 4, 1, 6)
    torch.testing.assert_close(step[1].sum(-1), torch.ones(2, 4, 1))


@pytest.mark.parametrize("preset", ["gpt2", "llama"])
def test_logits_to_keep_gives_the_last_positions_logits(preset):
    model = model_for(preset)
    x = ids(2, 9)
    full = model(x).logits
    for n in (1, 3, 9):
        torch.testing.assert_close(model(x, logits_to_keep=n).logits, full[:, -n:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="logits_to_keep must be >= 0"):
        model(x, logits_to_keep=-1)


# ----------------------------------------------------------------------------- KV cache
def run_generate(model, prompts, n, use_cache, monkeypatch):
    """generate()'s tokens and the (steps, B, V) logits it sampled from."""
    seen, real = [], sampling.sample_next

    def record(logits, *args, **kwargs):
        seen.append(logits.clone())
        return real(logits, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(sampling, "sample_next", record)
        out = generate(model, prompts, n, use_cache=use_cache)
    return out, torch.stack(seen)


ROLLING = dict(sliding_window=4, max_seq_len=16)  # cache capacity 8, prefill chunks of 5


@pytest.mark.parametrize("preset", PRESETS)
def test_cached_equals_uncached_step_by_step(preset, monkeypatch):
    model = model_for(preset, **(ROLLING if preset in ("mistral", "mixtral") else {}))
    prompt = ids(11).tolist()
    n = 20  # 31 positions: past max_seq_len=16 for the rolling rope+window models
    cached, lc = run_generate(model, [prompt], n, True, monkeypatch)
    plain, lp = run_generate(model, [prompt], n, False, monkeypatch)
    assert cached == plain and len(cached[0]) == n and len(set(cached[0])) > 1
    torch.testing.assert_close(lc, lp, atol=1e-5, rtol=0)
    # the uncached logits are the model's own on the whole sequence
    full = model(torch.tensor([prompt + cached[0][:-1]])).logits[0, len(prompt) - 1:]
    torch.testing.assert_close(lp[:, 0], full, atol=1e-5, rtol=0)
    assert model.caches is None  # generate frees its cache


@pytest.mark.parametrize("preset", PRESETS)
def test_left_padded_batch_equals_each_prompt_alone(preset, monkeypatch):
    model = model_for(preset, **(ROLLING if preset in ("mistral", "mixtral") else {}))
    prompts = [ids(3, seed=2).tolist(), ids(7, seed=3).tolist()]
    for use_cache in (True, False):
        batch, lb = run_generate(model, prompts, 12, use_cache, monkeypatch)
        for i, p in enumerate(prompts):
            alone, la = run_generate(model, [p], 12, use_cache, monkeypatch)
            assert batch[i] == alone[0]
            torch.testing.assert_close(lb[:, i], la[:, 0], atol=1e-5, rtol=0)


def test_rolling_cache_memory_is_bounded():
    model = model_for("mistral", **ROLLING)
    model.setup_kv_cache(1, 1000)
    # 2 layers × (k, v) × B 1 × K 2 × capacity 2·W = 8 × Dh 8 × 4 bytes
    assert model.kv_cache_bytes() == 2 * 2 * 1 * 2 * 8 * 8 * 4 and model.max_chunk == 5
    model.clear_kv_cache()
    assert model.kv_cache_bytes() == 0


# ----------------------------------------------------------------------------- learning
@pytest.mark.parametrize("preset", ["gpt2", "llama"])
def test_tiny_model_overfits_a_sentence(preset):
    text = "to be or not to be, that is the question. " * 2
    chars = sorted(set(text))
    data = torch.tensor([[chars.index(c) for c in text]])
    torch.manual_seed(0)
    model = GPT(tiny(preset, vocab_size=len(chars), max_seq_len=96))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(200):
        logits = model(data[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), data[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1
    model.eval()
    out = generate(model, [data[0, :4].tolist()], len(text) - 4)
    assert "".join(chars[i] for i in out[0]) == text[4:]


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs,field", [
    (dict(d_model=32, n_heads=4, n_kv_heads=3), "n_kv_heads"),
    (dict(n_experts=2, moe_top_k=3), "moe_top_k"),
    (dict(d_model=30, n_heads=4), "d_model"),
    (dict(d_model=12, n_heads=4, positions="rope"), "n_heads"),
    (dict(positions="alibi"), "positions"),
    (dict(norm="batchnorm"), "norm"),
    (dict(activation="tanh"), "activation"),
    (dict(attention_impl="flash"), "attention_impl"),
    (dict(init_std=0.0), "init_std"),
    (dict(norm_position="middle"), "norm_position"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(vocab_size=50, eos_id=50), "eos_id"),
])
def test_invalid_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError) as e:
        GPTConfig(**kwargs)
    assert field in str(e.value)


def test_odd_head_dim_with_rope_and_presets():
    with pytest.raises(ValueError, match="RoPE"):
        GPTConfig.from_name("llama", d_model=12, n_heads=4)
    GPTConfig.from_name("gpt2", d_model=12, n_heads=4)  # learned positions: odd head dim is fine
    with pytest.raises(ValueError) as e:
        GPTConfig.from_name("gpt5")
    assert "gpt5" in str(e.value) and all(p in str(e.value) for p in PRESETS)
    llama = GPTConfig.from_name("llama", d_model=32, n_heads=4)
    assert (llama.positions, llama.norm, llama.activation, llama.n_kv_heads, llama.bias) == \
        ("rope", "rmsnorm", "swiglu", 2, False)
    assert GPTConfig.from_name("mistral", max_seq_len=64).sliding_window == 32
    mixtral = GPTConfig.from_name("mixtral")
    assert (mixtral.n_experts, mixtral.moe_top_k, mixtral.sliding_window) == (8, 2, 512)
    assert GPTConfig.from_name("gpt2").kv_heads == 12


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_absolute_positions_past_max_seq_len_raise(positions):
    model = model_for("gpt2", max_seq_len=8, positions=positions)
    model(ids(1, 8))  # exactly max_seq_len is fine
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model(ids(1, 9))
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model(ids(1, 1), position_ids=torch.tensor([[8]]))


def test_init_std_sets_the_initial_weights_scale():
    """Every matrix is drawn from N(0, init_std²), the residual projections from N(0, (init_std/√(2L))²)."""
    torch.manual_seed(0)
    cfg = GPTConfig.from_name("gpt2", vocab_size=512, d_model=64, n_heads=4, n_layers=2, max_seq_len=32,
                              init_std=0.1)
    model = GPT(cfg)
    assert abs(model.embed_tokens.weight.std().item() - 0.1) < 0.005
    assert abs(model.layers[0].ffn.up_proj.weight.std().item() - 0.1) < 0.005
    assert abs(model.layers[1].self_attn.out_proj.weight.std().item() - 0.1 / 2) < 0.005  # 1/√(2·2)
    assert GPTConfig().init_std == 0.02  # GPT-2's
