"""Hugging Face model directories in and out for decoder-only models: config.json + safetensors.

Shape legend: V vocab, D model dim (tensor layouts are in hf_weights.py).

load_hf() reads a directory written by transformers' save_pretrained (one model.safetensors, or
shards listed in model.safetensors.index.json) of a LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM, MixtralForCausalLM or GPT2LMHeadModel into attnlab's GPT; save_hf() writes a GPT as
the matching architecture, so that transformers' AutoModelForCausalLM loads it with the same outputs.
The config mapping is in hf_config.py, the tensor mapping in hf_weights.py.

Weights are never unpickled: a directory that only holds pytorch_model.bin (or any other pickle) is
refused before anything is read. Writes are atomic (temp dir + rename), as in train/checkpoint.py.
Transformers itself is not needed (only the parity tests use it).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from attnlab import jsonfile
from attnlab.interop.hf_config import gpt_config_from_hf, hf_config_for
from attnlab.interop.hf_weights import check_tensors, from_hf, normalize, to_hf
from attnlab.models.gpt import GPT

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".bin.index.json")
# What save_hf writes; an existing out_dir holding anything else is not replaced.
_HF_FILES = {"config.json", SINGLE, INDEX, "tokenizer.json", "tokenizer_config.json", "generation_config.json"}


def _refuse_pickles(names: list[str], where: Path) -> None:
    pickles = sorted(n for n in names if n.endswith(_PICKLE_SUFFIXES))
    if pickles:
        raise ValueError(f"{where} holds pickled weights ({', '.join(pickles)}) and no {SINGLE}; attnlab never "
                         f"unpickles weights: convert them to safetensors first (e.g. transformers' "
                         f"save_pretrained(..., safe_serialization=True) where you trust the file)")


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model directory: model.safetensors, or the shards named by
    model.safetensors.index.json. Reads no weights.

    Raises:
        FileNotFoundError: no such directory, or no weights in it.
        ValueError: the directory (or the index) has pickled weights only, or the index is malformed
            or names a file outside the directory.
    """
    folder = Path(folder)
    if folder.is_file():
        _refuse_pickles([folder.name], folder.parent)
        raise ValueError(f"{folder} is a file; load_hf takes the model directory that holds config.json")
    if not folder.is_dir():
        raise FileNotFoundError(f"no model directory at {folder}")
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    if not (folder / INDEX).is_file():
        _refuse_pickles([p.name for p in folder.iterdir()], folder)
        raise FileNotFoundError(f"no {SINGLE} or {INDEX} in {folder}")
    weight_map = jsonfile.read_json(folder / INDEX).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{folder / INDEX} has no weight_map")
    names = sorted(set(map(str, weight_map.values())))
    _refuse_pickles(names, folder / INDEX)
    bad = [n for n in names if not n.endswith(".safetensors") or Path(n).name != n]
    if bad:
        raise ValueError(f"{folder / INDEX} names files that are not safetensors shards in {folder}: {bad}")
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder / INDEX} names missing shard(s) {missing}")
    return [folder / n for n in names]


def read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of one or more safetensors files (CPU).

    Raises:
        ValueError: naming a file that is not readable safetensors, or a tensor held by two shards.
    """
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            part = load_file(str(path))
        except Exception as e:  # safetensors raises its own error types for a bad header
            raise ValueError(f"{path} is not a readable safetensors file ({e})") from None
        twice = sorted(tensors.keys() & part.keys())
        if twice:
            raise ValueError(f"tensor(s) {twice[:5]} appear in more than one shard (again in {path.name})")
        tensors.update(part)
    return tensors


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
    model = GPT(cfg)
    state = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in to_hf(arch, state, cfg.tie_embeddings).items()}
    where = files[0] if len(files) == 1 else folder / INDEX
    check_tensors(expected, {k: tuple(v.shape) for k, v in tensors.items()}, str(where))
    with torch.no_grad():
        model.load_state_dict(from_hf(arch, tensors, state.keys(), cfg.tie_embeddings))
    return model.to(dtype).eval(), hf


def _check_replaceable(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    if out.is_dir():
        others = sorted(p.name for p in out.iterdir()
                        if p.name not in _HF_FILES and not (p.name.startswith("model-") and p.suffix == ".safetensors"))
        if others:
            raise ValueError(f"{out} holds files save_hf does not write ({', '.join(others[:5])}); refusing to "
                             f"replace it: choose an empty or new directory")


def _tokenizer_config(tokenizer, cfg) -> dict:
    """tokenizer_config.json: transformers' AutoTokenizer then reads tokenizer.json as it is."""
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
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is "
                         f"{cfg.vocab_size}")
    state = model.state_dict()
    if hf["architectures"][0] == "GPT2LMHeadModel" and not cfg.bias:
        state = _with_zero_biases(model, state)
    tensors = {k: v.cpu() for k, v in to_hf(hf["architectures"][0], state, cfg.tie_embeddings).items()}
    out = Path(out_dir)
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
    try:
        save_file(tensors, str(tmp / SINGLE), metadata={"format": "pt"})
        os.chmod(tmp / SINGLE, 0o644)
        jsonfile.write_json_atomic(tmp / "config.json", hf)
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer.json")
            jsonfile.write_json_atomic(tmp / "tokenizer_config.json", _tokenizer_config(tokenizer, cfg))
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
