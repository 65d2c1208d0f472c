"""Checkpoints: model directories (config.json + model.safetensors + tokenizer.json) and the
resumable training state. Weights are never pickled; every write is atomic (files.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from attnlab.files import atomic_directory, atomic_write, recover_directory
from attnlab.jsonfile import read_json


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Save a model's parameters (tied ones once) to safetensors, atomically."""
    atomic_write(path, lambda tmp: save_model(model, str(tmp)))


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load safetensors weights into `model` (never unpickles).

    Raises:
        FileNotFoundError: naming the path. ValueError: naming the file when it is not safetensors,
            or listing the missing, unexpected and mis-shaped tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights at {path}")
    try:
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises its own error type for a bad header
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from None
    own = model.state_dict()
    shaped = [f"{k} {tuple(v.shape)} != {tuple(own[k].shape)}" for k, v in tensors.items()
              if k in own and v.shape != own[k].shape]
    if shaped:
        raise ValueError(f"{path} does not match the model's config: " + "; ".join(shaped[:5]))
    missing, unexpected = load_model(model, str(path), strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: missing tensors {sorted(missing)}, unexpected tensors {sorted(unexpected)}")


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    sd = optimizer.state_dict()
    tensors = {f"{idx}.{name}": value.contiguous() for idx, state in sd["state"].items()
               for name, value in state.items() if torch.is_tensor(value)}
    return tensors, {"param_groups": sd["param_groups"], "n_states": len(sd["state"])}


def save_training_state(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        state: dict) -> None:
    """Write the resumable state into `folder` as a whole, atomically (temp dir + rename).

    Holds model.safetensors, optimizer.safetensors (Adam moments), rng.safetensors (torch RNG) and
    state.json (step, epoch, position, elapsed time, best metric, optimizer groups).
    """
    with atomic_directory(folder) as tmp:
        save_model(model, str(tmp / "model.safetensors"))
        tensors, meta = _optimizer_tensors(optimizer)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        (tmp / "state.json").write_text(json.dumps({**state, "optimizer": meta}, indent=2))


def load_training_state(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore model, optimizer and torch RNG from save_training_state's folder; returns state.json.

    Raises:
        FileNotFoundError: when there is no checkpoint to resume from.
    """
    folder = Path(folder)
    recover_directory(folder)
    if not (folder / "state.json").is_file():
        raise FileNotFoundError(f"no checkpoint to resume from at {folder}")
    state = read_json(folder / "state.json")
    load_weights(model, folder / "model.safetensors")
    tensors = _read_safetensors(folder / "optimizer.safetensors")
    per_param: dict[int, dict] = {}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        per_param.setdefault(int(idx), {})[name] = value
    optimizer.load_state_dict({"state": per_param, "param_groups": state["optimizer"]["param_groups"]})
    torch.set_rng_state(_read_safetensors(folder / "rng.safetensors")["torch"])
    return state


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint file; a missing or damaged one is named in a ValueError."""
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error type for a damaged header
        raise ValueError(f"{path} is not a readable safetensors file ({e}); the checkpoint is damaged") from None
