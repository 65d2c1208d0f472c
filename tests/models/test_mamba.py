"""The Mamba language model: causal, recurrent decoding equals the full forward, a state that does not
grow, generate() cached == uncached and padded == alone, initialisation as the reference, bad config
values named."""
from __future__ import annotations

import pytest
import torch

from attnlab.generate import generate
from attnlab.nn import mamba_block
from attnlab.models.mamba import Mamba, MambaConfig

V = 50


def tiny(**kw) -> MambaConfig:
    return MambaConfig(**{**dict(vocab_size=V, d_model=32, n_layers=2, d_state=8, max_seq_len=64), **kw})


def model_for(seed=0, **kw) -> Mamba:
    """A random tiny model with larger-than-init matrices, so logits are distinct and tokens varied."""
    torch.manual_seed(seed)
    model = Mamba(tiny(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "A_log" not in name:
                p.normal_(0, 0.3)
    return model


def ids(*shape, seed=1):
    return torch.randint(V, shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- causality
def test_changing_a_token_changes_no_earlier_logits():
    model = model_for()
    x = ids(2, 16)
    with torch.no_grad():
        base = model(x).logits
        for t in (0, 5, 15):
            y = x.clone()
            y[:, t] = (y[:, t] + 1) % V
            out = model(y).logits
            assert torch.equal(out[:, :t], base[:, :t])
            assert not torch.allclose(out[:, t], base[:, t], atol=1e-4)


# ----------------------------------------------------------------------------- recurrent decoding
@pytest.mark.parametrize("pieces", [[1] * 14, [3] + [1] * 11, [10, 1, 1, 1, 1], [2, 5, 1, 6]])
def test_recurrent_decoding_equals_the_full_forward(pieces):
    """A prompt at once, then one token at a time (or several prefill pieces) == one forward."""
    model = model_for(bias=True)
    x = ids(3, 14)
    with torch.no_grad():
        full = model(x).logits
        model.setup_kv_cache(3, 14)
        starts = [sum(pieces[:i]) for i in range(len(pieces))]
        parts = [model(x[:, s:s + n]).logits for s, n in zip(starts, pieces)]
        model.clear_kv_cache()
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_state_bytes_are_constant_in_position():
    model = model_for()
    cfg = model.cfg
    with torch.no_grad():
        model.setup_kv_cache(2, 10_000)
        expected = cfg.n_layers * 2 * cfg.d_inner * (cfg.d_conv + cfg.d_state) * 4
        sizes = [model.kv_cache_bytes()]
        model(ids(2, 20))
        sizes.append(model.kv_cache_bytes())
        for i in range(30):
            model(ids(2, 1, seed=i))
        sizes.append(model.kv_cache_bytes())
        model.clear_kv_cache()
    assert sizes == [expected] * 3
    assert model.kv_cache_bytes() == 0 and model.max_chunk is None


# ----------------------------------------------------------------------------- generate
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.9, top_k=10, top_p=0.9, seed=3)])
def test_generate_cached_equals_uncached(sampling):
    model = model_for()
    prompts = [ids(5).tolist(), ids(9, seed=2).tolist()]
    cached = generate(model, prompts, max_new_tokens=12, use_cache=True, **sampling)
    uncached = generate(model, prompts, max_new_tokens=12, use_cache=False, **sampling)
    assert cached == uncached
    assert all(len(c) == 12 for c in cached)


@pytest.mark.parametrize("bias", [False, True])
def test_left_padded_batch_equals_each_prompt_alone(bias):
    model = model_for(bias=bias)
    prompts = [ids(3).tolist(), ids(11, seed=2).tolist(), ids(6, seed=3).tolist()]
    batch = generate(model, prompts, max_new_tokens=10)
    alone = [generate(model, [p], max_new_tokens=10)[0] for p in prompts]
    assert batch == alone


def test_generation_is_not_limited_by_max_seq_len():
    model = model_for(max_seq_len=8)
    out = generate(model, [ids(6).tolist()], max_new_tokens=20)
    assert len(out[0]) == 20


def test_padded_positions_leave_the_state_unchanged():
    """A masked prefix computes the same logits for the real tokens as no prefix at all."""
    model = model_for()
    x = ids(1, 9)
    pad = torch.cat([torch.full((1, 4), 7), x], 1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.bool), torch.ones(1, 9, dtype=torch.bool)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(pad, mask).logits[:, 4:], model(x).logits, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- interface
def test_output_fields_and_need_weights_refused():
    model = model_for()
    out = model(ids(2, 5), logits_to_keep=1)
    assert out.logits.shape == (2, 1, V) and out.attentions is None
    assert out.aux_loss.shape == () and out.aux_loss.item() == 0.0
    with pytest.raises(ValueError, match="no attention weights"):
        model(ids(2, 5), need_weights=True)


def test_gradients_reach_every_parameter_and_tied_head():
    model = model_for()
    model.train()
    x = ids(2, 12)
    logits = model(x[:, :-1]).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert model.lm_head.weight is model.embed_tokens.weight
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())


def test_initialisation_follows_the_reference():
    cfg = tiny(d_model=64, dt_min=0.01, dt_max=0.05)
    torch.manual_seed(0)
    block = Mamba(cfg).layers[0].mixer
    assert cfg.delta_rank == 4 and cfg.d_inner == 128
    torch.testing.assert_close(block.A_log.exp(), torch.arange(1, 9.0).expand(128, 8))
    assert torch.equal(block.D.data, torch.ones(128))
    dt = torch.nn.functional.softplus(block.dt_proj.bias)
    assert dt.min() >= 0.01 - 1e-6 and dt.max() <= 0.05 + 1e-6
    assert block.dt_proj.weight.abs().max() <= cfg.delta_rank ** -0.5
    bound = (1 / 128) ** 0.5 / cfg.n_layers ** 0.5  # Kaiming-uniform bound 1/√fan_in, over √n_layers
    assert block.out_proj.weight.abs().max() <= bound + 1e-7


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("field,value", [
    ("d_model", 0), ("n_layers", -1), ("d_state", 0), ("d_conv", 0), ("expand", 1.5), ("dt_rank", 0),
    ("dt_rank", "full"), ("dt_min", 0.0), ("dt_max", 0.0001), ("dt_scale", 0), ("norm_eps", 0),
    ("dt_init", "uniform"), ("eos_id", V), ("vocab_size", True),
])
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        tiny(**{field: value})


def test_config_round_trips_through_json():
    cfg = tiny(dt_rank=3, bias=True)
    assert MambaConfig.from_dict(cfg.to_dict()) == cfg
    assert tiny().delta_rank == 2 and tiny().dt_rank == "auto"  # "auto" = ceil(32 / 16)


def test_a_bf16_autocast_step_keeps_the_scan_and_the_gradients_fp32():
    """Under bf16 autocast (the recipe's step on bf16 CPUs) in_proj and out_proj multiply in bf16 and
    x_proj, dt_proj, the convolution and scan compute in fp32: the logits are the fp32 model's to bf16
    rounding, and every gradient is fp32, finite and close to the fp32 step's."""
    x = ids(2, 16)
    grads = {}
    for kind in ("fp32", "bf16"):
        model = model_for().train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "bf16"):
            logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x.flatten())
        loss.backward()
        grads[kind] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        if kind == "fp32":
            want = logits.detach()
        else:
            assert logits.dtype == torch.bfloat16
            assert (logits.float() - want).abs().max() <= 0.05 * want.abs().max()
    for name, g in grads["bf16"].items():
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), name
        ref = grads["fp32"][name]
        assert (g - ref).norm() <= 0.1 * ref.norm() + 1e-6, name


def test_under_cpu_autocast_only_in_proj_and_out_proj_multiply_in_bf16(monkeypatch):
    """The Δ, B, C projections are an fp32 island (nn/cpu_autocast.py): their outputs feed the fp32
    scan, so bf16 there would only add casts; the scan gets x, Δ, B, C and z in fp32."""
    model = model_for().train()
    dtypes = {}
    def record(name):
        def hook(module, args, out):
            dtypes.setdefault(name, out.dtype)
        return hook

    for name in ("in_proj", "x_proj", "out_proj"):
        getattr(model.layers[0].mixer, name).register_forward_hook(record(name))
    scan = mamba_block.selective_scan

    def recording_scan(x, delta, A, B, C, D, h0, z, **maps):
        dtypes.setdefault("scan inputs", {v.dtype for v in (x, delta, B, C, z)})
        return scan(x, delta, A, B, C, D, h0, z=z, **maps)

    monkeypatch.setattr(mamba_block, "selective_scan", recording_scan)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids(2, 16))
    assert dtypes == {"in_proj": torch.bfloat16, "x_proj": torch.float32, "out_proj": torch.bfloat16,
                      "scan inputs": {torch.float32}}
