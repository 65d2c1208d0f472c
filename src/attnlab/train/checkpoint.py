"""Checkpoints: model weights and the resumable training state. Weights are never pickled; every
write is atomic (files.py) and goes through tensorfile.py, which refuses non-finite tensors; every
read is validated (names, shapes, dtypes, finiteness, checksum; state.json by train/state.py).

A checkpoint directory (out/checkpoint/, replaced as a whole) holds:
    model.safetensors      the weights after `step`
    optimizer.safetensors  Adam's moments and step counts, keyed "<parameter index>.<name>"
    rng.safetensors        torch's RNG state
    best.safetensors       the run's best weights as of this checkpoint (a hard link of the run's
                           model.safetensors: no extra space), when an evaluation has happened
    state.json             step, data position, best metric, end-of-run stage... (train/state.py)
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from attnlab.errors import UserError
from attnlab.files import atomic_directory, link_or_copy, recover_directory
from attnlab.jsonfile import read_json
from attnlab.tensorfile import load_model_weights, model_tensors, read_tensors, save_tensors, write_tensors
from attnlab.train.state import TrainState, check_param_groups, validate_state

BEST_FILE = "best.safetensors"


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Save a model's parameters (tied ones once) to safetensors, atomically.

    Raises:
        FloatingPointError: for non-finite weights (nothing is written). files.DiskFullError.
    """
    tensors, metadata = model_tensors(model)
    save_tensors(path, tensors, metadata)


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load safetensors weights into `model` (never unpickles), validated (tensorfile.py).

    Raises:
        FileNotFoundError: naming the path. ValueError: naming the file and the tensor when it is not
            safetensors, damaged, non-finite, missing, unexpected, mis-shaped or of another dtype.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights at {path}")
    load_model_weights(model, path)


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    sd = optimizer.state_dict()
    tensors = {f"{idx}.{name}": value.contiguous() for idx, state in sd["state"].items()
               for name, value in state.items() if torch.is_tensor(value)}
    return tensors, {"param_groups": sd["param_groups"], "n_states": len(sd["state"])}


def save_training_state(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        state: TrainState, best: Path | None = None) -> None:
    """Write the resumable state into `folder` as a whole, atomically (module docstring).

    Args:
        best: the run's best weights (model.safetensors), kept in the checkpoint as best.safetensors.
    Raises:
        FloatingPointError: for a non-finite weight or optimizer value (nothing is written).
        files.DiskFullError: naming the folder and the space needed (the previous checkpoint intact).
    """
    weights, weights_meta = model_tensors(model)
    moments, meta = _optimizer_tensors(optimizer)
    rng = {"torch": torch.get_rng_state()}
    need = sum(t.numel() * t.element_size() for part in (weights, moments, rng) for t in part.values()) + 65536
    with atomic_directory(folder, need=need) as tmp:
        write_tensors(tmp / "model.safetensors", weights, weights_meta)
        write_tensors(tmp / "optimizer.safetensors", moments)
        write_tensors(tmp / "rng.safetensors", rng)
        if best is not None and best.is_file():
            link_or_copy(best, tmp / BEST_FILE)
        (tmp / "state.json").write_text(json.dumps({**state.to_json(), "optimizer": meta}, indent=2))


def _optimizer_state(path: Path, optimizer: torch.optim.Optimizer, meta: dict, state_path: Path) -> dict:
    """optimizer.safetensors as an optimizer state dict, checked against the optimizer's parameters:
    each parameter has all of Adam's entries (moments of its shape and dtype, a scalar step) or none."""
    params = _params(optimizer)
    names = ("exp_avg", "exp_avg_sq", "step")
    expected = {f"{i}.{name}": ((), torch.float32) if name == "step" else (tuple(p.shape), p.dtype)
                for i, p in enumerate(params) for name in names}
    tensors = read_tensors(path, expected, optional=set(expected))
    per_param: dict[int, dict] = {}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        per_param.setdefault(int(idx), {})[name] = value
    partial = sorted(i for i, entries in per_param.items() if len(entries) != len(names))
    if partial:
        raise UserError(f"{path}: parameter {partial[0]} has only {sorted(per_param[partial[0]])} of {list(names)}")
    if len(per_param) != meta["n_states"]:
        raise UserError(f"{path} holds the state of {len(per_param)} parameters, {state_path} says "
                        f"{meta['n_states']}; the checkpoint is damaged")
    check_param_groups(meta["param_groups"], optimizer.state_dict()["param_groups"], state_path)
    return {"state": per_param, "param_groups": meta["param_groups"]}


def read_state(folder: Path) -> TrainState:
    """The validated state.json of the checkpoint `folder` (train/state.py), read only.

    Raises:
        FileNotFoundError: when there is no checkpoint. ValueError: naming the field.
    """
    path = Path(folder) / "state.json"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint to resume from at {folder}")
    return validate_state(read_json(path), path)


def load_training_state(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainState:
    """Restore model, optimizer and torch RNG from save_training_state's folder (after undoing a
    replacement a crash interrupted); returns the validated state.json (its optimizer settings included).

    Raises:
        FileNotFoundError: when there is no checkpoint to resume from.
        ValueError: naming the file and the field or tensor that is damaged or does not fit the model.
    """
    folder = Path(folder)
    recover_directory(folder)
    state = read_state(folder)
    load_weights(model, folder / "model.safetensors")
    moments = _optimizer_state(folder / "optimizer.safetensors", optimizer, state.optimizer, folder / "state.json")
    optimizer.load_state_dict(moments)
    rng = read_tensors(folder / "rng.safetensors", {"torch": (tuple(torch.get_rng_state().shape), torch.uint8)})
    torch.set_rng_state(rng["torch"])
    return state
