"""Hugging Face model directories in and out for decoder-only models: config.json + safetensors.

Shape legend: V vocab, D model dim (tensor layouts are in hf_weights.py).

load_hf() reads a directory written by transformers' save_pretrained (one model.safetensors, or
shards listed in model.safetensors.index.json) of a LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM, MixtralForCausalLM or GPT2LMHeadModel into attnlab's GPT; save_hf() writes a GPT as
the matching architecture, so that transformers' AutoModelForCausalLM loads it with the same outputs.
The config mapping is in hf_config.py, the tensor mapping in hf_weights.py.

Weights are never unpickled: a directory that only holds pytorch_model.bin (or any other pickle) is
refused before anything is read. Writes are atomic (files.atomic_directory), as every save.
Transformers itself is not needed (only the parity tests use it).
"""
from __future__ import annotations

from pathlib import Path

import torch

from attnlab import jsonfile
from attnlab.errors import UserError
from attnlab.files import atomic_directory
from attnlab.interop.hf_config import gpt_config_from_hf, hf_config_for
from attnlab.interop.hf_weights import check_tensors, from_hf, normalize, to_hf
from attnlab.interop.safetensors_dir import INDEX, SINGLE, read_tensors, weight_files
from attnlab.models.gpt import GPT
from attnlab.tensorfile import write_tensors

# What save_hf writes; an existing out_dir holding anything else is not replaced.
_HF_FILES = {"config.json", SINGLE, INDEX, "tokenizer.json", "tokenizer_config.json", "generation_config.json"}


def load_hf(path, dtype: torch.dtype = torch.float32) -> tuple[GPT, dict]:
    """Load a Hugging Face decoder-only model directory into attnlab's GPT.

    Args:
        path: a directory with config.json and model.safetensors (or model.safetensors.index.json and
            its shards), as transformers' save_pretrained writes it.
        dtype: the parameters' dtype after loading (the checkpoint's own dtype is converted).
    Returns:
        (model in eval mode, the config.json dict). The model's logits equal transformers' for the
        same input_ids, attention_mask and position_ids (within float rounding).
    Raises:
        FileNotFoundError: no directory, config.json or weights.
        ValueError: pickled weights only (before reading any), an unsupported architecture or a
            config field that would change the computation (named), or tensors missing, unexpected
            or mis-shaped (listed with their shapes).
    Source: transformers 5.24, models/{llama,mistral,qwen2,mixtral,gpt2}.
    """
    folder = Path(path)
    files = weight_files(folder)
    hf = jsonfile.read_json(folder / "config.json")
    arch, cfg = gpt_config_from_hf(hf)
    tensors = normalize(arch, read_tensors(files), cfg.tie_embeddings)
    model = GPT.for_loading(cfg)
    state = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in to_hf(arch, state, cfg.tie_embeddings).items()}
    where = files[0] if len(files) == 1 else folder / INDEX
    check_tensors(expected, {k: tuple(v.shape) for k, v in tensors.items()}, str(where))
    with torch.no_grad():
        model.load_state_dict(from_hf(arch, tensors, state.keys(), cfg.tie_embeddings))
    return model.to(dtype).eval(), hf


def check_replaceable(out: Path) -> None:
    """Refuse to replace `out` unless it is new, or a directory holding only what an export writes."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory")
    if out.is_dir():
        others = sorted(p.name for p in out.iterdir()
                        if p.name not in _HF_FILES and not (p.name.startswith("model-") and p.suffix == ".safetensors"))
        if others:
            raise UserError(f"{out} holds files save_hf does not write ({', '.join(others[:5])}); refusing to "
                            f"replace it: choose an empty or new directory")


def tokenizer_config(tokenizer, cfg) -> dict:
    """tokenizer_config.json of an exported model: transformers' AutoTokenizer then reads
    tokenizer.json as it is."""
    out = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_seq_len}
    for key, token_id in (("bos_token", cfg.bos_id), ("eos_token", cfg.eos_id)):
        if token_id is not None and token_id in tokenizer.special_tokens.values():
            out[key] = tokenizer.id_to_token(token_id)
    return out


def _with_zero_biases(model: GPT, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` plus a zero bias for every bias-free linear layer (but the output projection) and
    LayerNorm: GPT-2's form of a model trained with bias=False, computing exactly the same."""
    state = dict(state)
    for name, module in model.named_modules():
        if name == "lm_head":
            continue
        if isinstance(module, torch.nn.Linear) and module.bias is None:
            state[f"{name}.bias"] = torch.zeros(module.out_features, dtype=module.weight.dtype)
        elif isinstance(module, torch.nn.LayerNorm) and module.bias is None:
            state[f"{name}.bias"] = torch.zeros(module.normalized_shape, dtype=module.weight.dtype)
    return state


def save_hf(model: GPT, out_dir, tokenizer=None) -> None:
    """Write a GPT as a Hugging Face model directory: config.json and model.safetensors (plus
    tokenizer.json and tokenizer_config.json when a tokenizer is given), atomically.

    The architecture follows the config: learned positions + LayerNorm + ReLU/GELU -> GPT2LMHeadModel;
    RoPE + RMSNorm + SwiGLU -> MixtralForCausalLM with experts, Qwen2ForCausalLM with q/k/v biases
    alone, MistralForCausalLM with a sliding window, else LlamaForCausalLM.

    Args:
        model: the GPT. out_dir: a new or empty directory, or an earlier save_hf output (replaced).
        tokenizer: a ByteLevelBPE (or anything with save(path), vocab_size, special_tokens and
            id_to_token), saved as tokenizer.json.
    Raises:
        TypeError: model is not a GPT.
        ValueError: an option with no Hugging Face equivalent (named), a tokenizer larger than the
            model's vocabulary, or an out_dir holding other files.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"save_hf takes an attnlab GPT, got {type(model).__name__}")
    cfg = model.cfg
    hf = hf_config_for(cfg, model.embed_tokens.weight.dtype)
    if tokenizer is not None and tokenizer.vocab_size > cfg.vocab_size:
        raise UserError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is "
                        f"{cfg.vocab_size}")
    state = model.state_dict()
    if hf["architectures"][0] == "GPT2LMHeadModel" and not cfg.bias:
        state = _with_zero_biases(model, state)
    tensors = {k: v.cpu() for k, v in to_hf(hf["architectures"][0], state, cfg.tie_embeddings).items()}
    out = Path(out_dir)
    check_replaceable(out)
    with atomic_directory(out, need=sum(t.numel() * t.element_size() for t in tensors.values())) as tmp:
        write_tensors(tmp / SINGLE, tensors, {"format": "pt"})
        jsonfile.write_json_atomic(tmp / "config.json", hf)
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer.json")
            jsonfile.write_json_atomic(tmp / "tokenizer_config.json", tokenizer_config(tokenizer, cfg))
