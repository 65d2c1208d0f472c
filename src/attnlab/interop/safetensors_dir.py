"""Reading the weights of a model directory: model.safetensors or a sharded index, never a pickle."""
from __future__ import annotations

import json
from pathlib import Path

import torch

PICKLE_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth", "model.ckpt")


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of `path`/model.safetensors, or of the shards listed in model.safetensors.index.json.

    Raises:
        ValueError: when the directory holds only pickled weights (refused: unpickling runs code).
        FileNotFoundError: when it holds no weights at all, or a shard is missing.
    """
    from safetensors.torch import load_file

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            if not (path / shard).is_file():
                raise FileNotFoundError(f"{path}: shard {shard} listed in {index.name} is missing")
            tensors.update(load_file(str(path / shard)))
        return tensors
    if (path / "model.safetensors").is_file():
        return load_file(str(path / "model.safetensors"))
    pickles = [n for n in PICKLE_NAMES if (path / n).exists()]
    if pickles:
        raise ValueError(f"{path} holds only pickled weights ({', '.join(pickles)}); they are refused because "
                         f"unpickling runs code. Convert them to safetensors first")
    raise FileNotFoundError(f"{path} has no model.safetensors or model.safetensors.index.json")
