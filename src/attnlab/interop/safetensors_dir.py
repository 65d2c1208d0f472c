"""Reading the weights of a model directory: model.safetensors or a sharded index, never a pickle."""
from __future__ import annotations

from pathlib import Path

import torch

from attnlab import jsonfile, tensorfile
from attnlab.errors import UserError

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".bin.index.json")


def _refuse_pickles(names: list[str], where: Path) -> None:
    pickles = sorted(n for n in names if n.endswith(_PICKLE_SUFFIXES))
    if pickles:
        raise UserError(f"{where} holds pickled weights ({', '.join(pickles)}) and no {SINGLE}; attnlab never "
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
        raise UserError(f"{folder} is a file; a model is loaded from the directory that holds config.json")
    if not folder.is_dir():
        raise FileNotFoundError(f"no model directory at {folder}")
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    if not (folder / INDEX).is_file():
        _refuse_pickles([p.name for p in folder.iterdir()], folder)
        raise FileNotFoundError(f"no {SINGLE} or {INDEX} in {folder}")
    weight_map = jsonfile.read_json(folder / INDEX).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{folder / INDEX} has no weight_map")
    names = sorted(set(map(str, weight_map.values())))
    _refuse_pickles(names, folder / INDEX)
    bad = [n for n in names if not n.endswith(".safetensors") or Path(n).name != n]
    if bad:
        raise UserError(f"{folder / INDEX} names files that are not safetensors shards in {folder}: {bad}")
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder / INDEX} names missing shard(s) {missing}")
    return [folder / n for n in names]


def read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of one or more safetensors files (CPU).

    Raises:
        ValueError: naming a file that is not readable safetensors, is damaged (checksum, non-finite
            values: tensorfile.read_tensors), or a tensor held by two shards.
    """
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        part = tensorfile.read_tensors(path)
        twice = sorted(tensors.keys() & part.keys())
        if twice:
            raise UserError(f"tensor(s) {twice[:5]} appear in more than one shard (again in {path.name})")
        tensors.update(part)
    return tensors


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of `path`/model.safetensors, or of the shards listed in model.safetensors.index.json.

    Raises:
        ValueError: when the directory holds only pickled weights (refused: unpickling runs code), or
            a file is not valid safetensors.
        FileNotFoundError: when it holds no weights at all, or a shard is missing.
    """
    return read_tensors(weight_files(Path(path)))
