"""Hugging Face interop: tiny random transformers models load into GPT with the same logits, our GPTs
export to models transformers loads with the same logits, round trips, sharded checkpoints, and
bad input refused with the names and shapes in the message."""
from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from attnlab.models.gpt import GPTConfig  # noqa: E402
from attnlab.interop.hf import load_hf, save_hf  # noqa: E402
from attnlab.models.gpt import GPT  # noqa: E402

TOL = 1e-5
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, vocab_size=100, bos_token_id=1, eos_token_id=2, max_position_embeddings=64)
GPT2_SIZES = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64, bos_token_id=1, eos_token_id=2)
HF_CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", SIZES),
    "llama_bias_tied": ("LlamaConfig", "LlamaForCausalLM",
                        {**SIZES, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**SIZES, "sliding_window": 4}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", SIZES),
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM",
                     {**SIZES, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**SIZES, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", GPT2_SIZES),
    "gpt2_exact_gelu": ("GPT2Config", "GPT2LMHeadModel", {**GPT2_SIZES, "activation_function": "gelu"}),
}
TINY = dict(vocab_size=100, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=64, bos_id=1, eos_id=2)
EXPORT_CASES = {  # our config -> the architecture save_hf must choose
    "gpt2": (GPTConfig.from_name("gpt2", **TINY), "GPT2LMHeadModel"),
    "gpt2_relu_untied": (GPTConfig.from_name("gpt2", **TINY, activation="relu", tie_embeddings=False),
                         "GPT2LMHeadModel"),
    "llama": (GPTConfig.from_name("llama", **TINY), "LlamaForCausalLM"),
    "llama_bias_untied": (GPTConfig.from_name("llama", **TINY, bias=True, tie_embeddings=False), "LlamaForCausalLM"),
    "mistral": (GPTConfig.from_name("mistral", **TINY, sliding_window=4), "MistralForCausalLM"),
    "mixtral": (GPTConfig.from_name("mixtral", **TINY, n_experts=4, sliding_window=4), "MixtralForCausalLM"),
    "qwen2": (GPTConfig.from_name("llama", **TINY, qkv_bias=True, tie_embeddings=False), "Qwen2ForCausalLM"),
    "qwen2_window": (GPTConfig.from_name("llama", **TINY, qkv_bias=True, sliding_window=4), "Qwen2ForCausalLM"),
    "gpt2_gelu_tanh": (GPTConfig.from_name("gpt2", **TINY, activation="gelu_tanh"), "GPT2LMHeadModel"),
}


def _perturb(module: torch.nn.Module, seed: int = 0) -> None:
    """Random noise on every parameter, so zero biases and unit norm gains are mapped visibly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _batch():
    """Two rows of 12 tokens, the second left-padded by 3; positions count real tokens only."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _max_diff(ours: GPT, hf_model) -> float:
    ids, mask, pos = _batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, position_ids=pos).logits
        b = hf_model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    real = mask.bool()
    return (a[real] - b[real]).abs().max().item()


def _hf_model(case: str):
    config_cls, model_cls, kwargs = HF_CASES[case]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs))
    _perturb(model)
    return model.eval()


@pytest.mark.parametrize("case", list(HF_CASES))
def test_load_hf_matches_transformers(case, tmp_path):
    hf_model = _hf_model(case)
    hf_model.save_pretrained(tmp_path)
    model, hf_config = load_hf(tmp_path)
    assert hf_config["architectures"] == [HF_CASES[case][1]]
    assert not model.training
    assert _max_diff(model, hf_model) <= TOL


def test_load_hf_sharded(tmp_path):
    hf_model = _hf_model("llama")
    hf_model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    model, _ = load_hf(tmp_path)
    assert _max_diff(model, hf_model) <= TOL


def test_load_hf_reads_fused_mixtral_experts(tmp_path):
    """transformers 5 holds Mixtral's experts fused (gate_up_proj (E, 2F, D)); such files load too."""
    hf_model = _hf_model("mixtral")
    hf_model.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model, _ = load_hf(tmp_path)
    assert _max_diff(model, hf_model) <= TOL


@pytest.mark.parametrize("case", list(EXPORT_CASES))
def test_save_hf_loads_in_transformers_and_round_trips(case, tmp_path):
    cfg, arch = EXPORT_CASES[case]
    torch.manual_seed(0)
    ours = GPT(cfg).eval()
    _perturb(ours)
    save_hf(ours, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["architectures"] == [arch] and saved["initializer_range"] == cfg.init_std
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(hf_model).__name__ == arch
    assert _max_diff(ours, hf_model) <= TOL
    back, _ = load_hf(tmp_path / "out")
    assert back.cfg.to_dict() == {**cfg.to_dict(), "dropout": 0.0, "attention_dropout": 0.0}
    for name, tensor in ours.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_save_hf_with_tokenizer_and_replace(tmp_path):
    from attnlab.tokenizers import ByteLevelBPE

    tok = ByteLevelBPE.train(["the cat sat on the mat"] * 5, vocab_size=270, special_tokens=["<pad>", "<bos>", "<eos>"])
    ours = GPT(GPTConfig.from_name("llama", **{**TINY, "vocab_size": 300}))
    save_hf(ours, tmp_path / "out", tokenizer=tok)
    save_hf(ours, tmp_path / "out", tokenizer=tok)  # an earlier export is replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "the cat sat on a mat"
    assert hf_tok(text)["input_ids"] == tok.encode(text)
    assert hf_tok.bos_token == "<bos>" and hf_tok.eos_token == "<eos>"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="metrics.jsonl"):
        save_hf(ours, tmp_path / "run")


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("overrides, match", [
    (dict(positions="sinusoidal"), "positions='sinusoidal'"),
    (dict(norm_position="post"), "norm_position='post'"),
    (dict(positions="rope", norm="layernorm", activation="gelu"), "norm='layernorm'"),
    (dict(n_kv_heads=2), "n_kv_heads=2"),
])
def test_save_hf_refuses_options_without_hf_equivalent(overrides, match, tmp_path):
    model = GPT(GPTConfig.from_name("gpt2", **TINY, **overrides))
    with pytest.raises(ValueError, match=match):
        save_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _saved_llama(tmp_path):
    _hf_model("llama").save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


@pytest.mark.parametrize("change, match", [
    (dict(architectures=["FalconForCausalLM"]), "FalconForCausalLM"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}), "rope_type='llama3'"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling"),
    (dict(head_dim=16), "head_dim=16"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(architectures=["GPT2LMHeadModel"], activation_function="quick_gelu", n_embd=32, n_layer=2, n_head=4),
     "activation_function='quick_gelu'"),
])
def test_load_hf_refuses_unsupported_config(change, match, tmp_path):
    hf = _saved_llama(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**hf, **change}))
    with pytest.raises(ValueError, match=match):
        load_hf(tmp_path)


def test_load_hf_refuses_per_layer_sliding_windows(tmp_path):
    """Qwen2 slides only on layers >= max_window_layers; GPT has one window for every layer."""
    _hf_model("qwen2").save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    hf.update(use_sliding_window=True, sliding_window=4, max_window_layers=1, layer_types=None)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="max_window_layers=1"):
        load_hf(tmp_path)


def test_load_hf_refuses_pickles_before_reading(tmp_path, monkeypatch):
    hf = _saved_llama(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps({"not": "read"}))

    def forbidden(*args, **kwargs):
        raise AssertionError("a pickle was read")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    with pytest.raises(ValueError, match="pytorch_model.bin"):
        load_hf(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "pytorch_model-00001-of-00001.bin"}}))
    with pytest.raises(ValueError, match="pytorch_model-00001-of-00001.bin"):
        load_hf(tmp_path)
    assert hf["architectures"] == ["LlamaForCausalLM"]


def test_load_hf_lists_missing_and_misshaped_tensors(tmp_path):
    _saved_llama(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, 32)
    tensors["model.layers.0.extra.weight"] = torch.zeros(3)
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError) as err:
        load_hf(tmp_path)
    message = str(err.value)
    assert "missing tensors: model.layers.1.mlp.up_proj.weight (64, 32)" in message
    assert "model.layers.0.self_attn.k_proj.weight is (8, 32), config.json needs (16, 32)" in message
    assert "unexpected tensors: model.layers.0.extra.weight (3,)" in message


def test_a_bias_free_gpt2_style_model_exports_with_zero_biases(tmp_path):
    """Regression: nanoGPT-style runs (bias=False) were refused by convert; GPT-2 has every bias, and
    zero biases compute exactly the same."""
    transformers = pytest.importorskip("transformers")
    from attnlab.models.gpt import GPTConfig
    from attnlab.interop.hf import save_hf
    from attnlab.models.gpt import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("gpt2", vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_seq_len=16,
                                    bias=False)).eval()
    save_hf(model, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        assert (hf(ids).logits - model(ids).logits).abs().max() < 1e-5
