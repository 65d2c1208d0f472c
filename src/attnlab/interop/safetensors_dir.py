"""Reading the weights of a model directory: model.safetensors or a sharded index, never a pickle."""
from __future__ import annotations

from pathlib import Path

import torch


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of `path`/model.safetensors, or of the shards listed in model.safetensors.index.json.

    Raises:
        ValueError: when the directory holds only pickled weights (refused: unpickling runs code), or
            a file is not valid safetensors.
        FileNotFoundError: when it holds no weights at all, or a shard is missing.
    """
    from attnlab.interop.hf import read_tensors, weight_files

    return read_tensors(weight_files(Path(path)))
