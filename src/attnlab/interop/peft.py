"""PEFT's LoRA adapter format, in and out: adapter_config.json + adapter_model.safetensors.

Shape legend: r rank, I in_features, O out_features of an adapted layer.

An adapter directory as `peft` writes it (PeftModel.save_pretrained) holds
    adapter_config.json        LoraConfig.to_dict(): peft_type "LORA", r, lora_alpha, lora_dropout,
                               target_modules, use_rslora, base_model_name_or_path, ...
    adapter_model.safetensors  base_model.model.<transformers module name>.lora_A.weight (r, I) and
                               .lora_B.weight (O, r) per adapted layer (no adapter name in the keys)
The module names are transformers' LLaMA-family names (model.layers.N.self_attn.q_proj, ...
mlp.down_proj: interop/hf_weights.py), so an adapter written here loads into transformers + peft on
the Hugging Face export of the same base (interop/hf.py) and one trained with peft loads here.
Which layers an adapter covers follows PEFT's rule (tuners_utils.check_target_module_exists): a
list of names matches a module named exactly so or ending in "." + name, a string is a regular
expression the whole name must match, "all-linear" is every linear layer but the output projection.
Options that change the computation and that attnlab does not implement (DoRA, biases, layer
subsets, modules_to_save, fan_in_fan_out, trainable tokens, per-layer alphas by pattern ...) are
refused by name. Weights are read and written as validated safetensors (tensorfile.py), never pickles.
Source: huggingface/peft, src/peft/tuners/lora/config.py, utils/save_and_load.py (0.21).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnlab import jsonfile
from attnlab.errors import UserError
from attnlab.files import atomic_directory
from attnlab.interop.hf_config import GPT2, MIXTRAL, architecture_for
from attnlab.interop.hf_weights import hf_name
from attnlab.nn.lora import adapt, linear_layers, lora_layers
from attnlab.tensorfile import read_tensors, save_tensors, write_tensors

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
# LoraConfig fields that change the computation, with the only values attnlab implements.
_DEFAULTS = {"bias": "none", "fan_in_fan_out": False, "use_dora": False, "modules_to_save": None,
             "layers_to_transform": None, "layers_pattern": None, "lora_bias": False, "target_parameters": None,
             "trainable_token_indices": None, "exclude_modules": None, "layer_replication": None,
             "alpha_pattern": {}, "use_qalora": False}


@dataclass
class AdapterSettings:
    """What a LoRA adapter's computation depends on (a PEFT LoraConfig's relevant fields)."""

    rank: int                                    # r
    alpha: float                                 # lora_alpha
    target_modules: list[str] | str              # PEFT names (or a regular expression)
    dropout: float = 0.0                         # lora_dropout (training only)
    use_rslora: bool = False                     # scale alpha / sqrt(r) instead of alpha / r
    base: str | None = None                      # base_model_name_or_path
    rank_pattern: dict = field(default_factory=dict)  # {pattern: r} of layers with another rank


def adapter_config(settings: AdapterSettings) -> dict:
    """adapter_config.json as PEFT writes it (the fields it needs to load the adapter)."""
    targets = settings.target_modules
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": settings.base,
            "r": settings.rank, "lora_alpha": settings.alpha, "lora_dropout": settings.dropout,
            "target_modules": targets if isinstance(targets, str) else list(targets),
            "use_rslora": settings.use_rslora, "init_lora_weights": True, "inference_mode": True,
            "rank_pattern": dict(settings.rank_pattern), "revision": None, **_DEFAULTS}


def read_adapter_config(path: str | Path) -> AdapterSettings:
    """The settings of a PEFT adapter_config.json, checked.

    Raises:
        FileNotFoundError: no such file. UserError: naming the file and the field: not a LoRA
            adapter, a missing or invalid r / lora_alpha / target_modules, or an option attnlab does
            not implement (with its value).
    """
    path = Path(path)
    cfg = jsonfile.read_json(path)
    if cfg.get("peft_type") != "LORA":
        raise UserError(f"{path}: peft_type is {cfg.get('peft_type')!r}; attnlab loads LoRA adapters ('LORA') only")
    for key, allowed in _DEFAULTS.items():
        value = cfg.get(key)
        if not (value is None or value == allowed or (isinstance(value, (dict, list)) and not value)):
            raise UserError(f"{path}: {key}={value!r} is not supported (attnlab implements {key}={allowed!r})")
    rank, alpha, targets = cfg.get("r"), cfg.get("lora_alpha"), cfg.get("target_modules")
    if not (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1):
        raise UserError(f"{path}: r must be an integer >= 1, got {rank!r}")
    if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha > 0):
        raise UserError(f"{path}: lora_alpha must be a number > 0, got {alpha!r}")
    if not (isinstance(targets, str) or (isinstance(targets, list) and targets
                                         and all(isinstance(t, str) for t in targets))):
        raise UserError(f"{path}: target_modules must be a list of module names or a regular expression, "
                         f"got {targets!r}")
    pattern = cfg.get("rank_pattern") or {}
    if not (isinstance(pattern, dict) and all(isinstance(v, int) and v >= 1 for v in pattern.values())):
        raise UserError(f"{path}: rank_pattern must map module patterns to ranks >= 1, got {pattern!r}")
    dropout = cfg.get("lora_dropout") or 0.0
    return AdapterSettings(rank, float(alpha), targets, float(dropout), bool(cfg.get("use_rslora", False)),
                           cfg.get("base_model_name_or_path"), pattern)


def hf_module_name(model, name: str) -> str:
    """transformers' name of one of our GPT's linear layers (layers.0.self_attn.out_proj ->
    model.layers.0.self_attn.o_proj).

    Raises:
        UserError: for a model with no LLaMA-family Hugging Face form (PEFT's names would differ).
    """
    arch = architecture_for(model.cfg)
    if arch in (GPT2, MIXTRAL):
        raise UserError(f"LoRA adapters in PEFT's format are written for LLaMA-family models (Llama, Mistral, "
                         f"Qwen2); this model's Hugging Face form is {arch}")
    return hf_name(arch, f"{name}.weight")[0].removesuffix(".weight")


def _matches(targets: list[str] | str, key: str) -> bool:
    """PEFT's check_target_module_exists for a module named `key` (transformers' name)."""
    if isinstance(targets, str):
        return bool(re.fullmatch(targets, key))
    return key in targets or any(key.endswith("." + t) for t in targets)


def matched_layers(model, settings: AdapterSettings) -> list[str]:
    """Our names of the linear layers an adapter with `settings` covers (PEFT's rule, module doc).

    Raises:
        UserError: when it covers none.
    """
    names = [n for n in linear_layers(model) if n != "lm_head"]
    if settings.target_modules == "all-linear":
        found = names
    else:
        found = [n for n in names if _matches(settings.target_modules, hf_module_name(model, n))]
    if not found:
        raise UserError(f"target_modules {settings.target_modules!r} match no linear layer of the base model")
    return found


def _ranks(model, names: list[str], settings: AdapterSettings) -> dict[str, tuple[int, float]]:
    """{name: (rank, alpha)} of layers whose rank rank_pattern sets (PEFT: the first pattern the
    module's name ends with)."""
    out = {}
    for name in names:
        key = hf_module_name(model, name)
        for pattern, rank in settings.rank_pattern.items():
            if re.match(rf"(.*\.)?({pattern})$", key):
                out[name] = (rank, settings.alpha)
                break
    return out


def apply_adapter_settings(model, settings: AdapterSettings) -> list[str]:
    """Wrap the layers `settings` covers in fresh adapters (nn.lora.adapt); returns their names."""
    names = matched_layers(model, settings)
    return adapt(model, names, settings.rank, settings.alpha, settings.dropout, settings.use_rslora,
                 _ranks(model, names, settings))


def adapter_tensors(model) -> dict[str, torch.Tensor]:
    """{PEFT key: tensor} of a model's adapters (module doc)."""
    out = {}
    for name, layer in lora_layers(model).items():
        key = PREFIX + hf_module_name(model, name)
        out[f"{key}.lora_A.weight"] = layer.lora_A.weight.detach()
        out[f"{key}.lora_B.weight"] = layer.lora_B.weight.detach()
    return out


def save_adapter_weights(model, path: str | Path) -> None:
    """Write the model's adapters as adapter_model.safetensors at `path`, atomically.

    Raises:
        FloatingPointError: for a non-finite value (nothing is written). files.DiskFullError.
    """
    save_tensors(path, adapter_tensors(model), {"format": "pt"})


def load_adapter_weights(model, path: str | Path) -> None:
    """Load adapter_model.safetensors at `path` into the model's adapters (cast to their dtype).

    Raises:
        FileNotFoundError: no such file. UserError: naming the file and the tensor: damaged,
            non-finite, missing, unexpected or mis-shaped (the adapter is for another base or rank).
    """
    path = Path(path)
    tensors = read_tensors(path)
    own = {}
    for name, layer in lora_layers(model).items():
        key = PREFIX + hf_module_name(model, name)
        own[f"{key}.lora_A.weight"], own[f"{key}.lora_B.weight"] = layer.lora_A.weight, layer.lora_B.weight
    missing, unexpected = sorted(own.keys() - tensors.keys()), sorted(tensors.keys() - own.keys())
    if missing or unexpected:
        raise UserError(f"{path} does not match the adapters its config describes on this base: missing tensors "
                         f"{missing[:3]}, unexpected tensors {unexpected[:3]}")
    for key, param in own.items():
        t = tensors[key]
        if tuple(t.shape) != tuple(param.shape) or not t.is_floating_point():
            raise UserError(f"{path}: tensor {key!r} is {t.dtype} {tuple(t.shape)}, the adapter needs "
                             f"{tuple(param.shape)} floats")
    with torch.no_grad():
        for key, param in own.items():
            param.copy_(tensors[key])


def save_adapter(model, out_dir: str | Path, settings: AdapterSettings) -> None:
    """Write a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) for the
    model's adapters, as a whole (files.atomic_directory)."""
    tensors = adapter_tensors(model)
    with atomic_directory(Path(out_dir), need=sum(t.numel() * t.element_size() for t in tensors.values())) as tmp:
        write_tensors(tmp / ADAPTER_WEIGHTS, tensors, {"format": "pt"})
        jsonfile.write_json_atomic(tmp / ADAPTER_CONFIG, adapter_config(settings))


def load_adapter(model, folder: str | Path) -> AdapterSettings:
    """Put the PEFT adapter in `folder` on `model` (the base: fp32, bf16 or quantized, in place):
    adapters wrapped per its config, its weights loaded. Returns its settings.

    Raises:
        FileNotFoundError, UserError: as read_adapter_config and load_adapter_weights; an adapter
            saved only as a pickle (adapter_model.bin) is refused before anything is read.
    """
    folder = Path(folder)
    if not (folder / ADAPTER_WEIGHTS).is_file() and (folder / "adapter_model.bin").is_file():
        raise UserError(f"{folder} holds a pickled adapter (adapter_model.bin) and no {ADAPTER_WEIGHTS}; attnlab "
                         f"never unpickles weights: save it with safe_serialization=True")
    settings = read_adapter_config(folder / ADAPTER_CONFIG)
    apply_adapter_settings(model, settings)
    load_adapter_weights(model, folder / ADAPTER_WEIGHTS)
    return settings


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "AdapterSettings", "adapter_config", "read_adapter_config",
           "matched_layers", "apply_adapter_settings", "adapter_tensors", "save_adapter_weights",
           "load_adapter_weights", "save_adapter", "load_adapter", "hf_module_name"]
