"""safetensors files, read and written in one place (as jsonfile.py for JSON); never a pickle.

Writing (every save of tensors: best weights, checkpoints, snapshots, HF and BERT exports) refuses
a non-finite tensor before a byte is written, and puts a SHA-256 of the tensor data into the
header's metadata ("attnlab.sha256"). Reading validates what it returns: the header parses, the
data matches that checksum when the file has one (damage that still parses: garbled bytes in the
middle), every floating tensor is finite, and, when the caller says what it expects, the names,
shapes and dtypes. Each error is one line naming the file and the tensor.

Model weights are written without tied duplicates (GPT's lm_head.weight when it is
embed_tokens.weight), with safetensors' convention: the metadata maps each left-out name to the
kept one, so safetensors.torch.load_model reads our files too.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save as to_bytes

from attnlab.errors import NonFiniteError, UserError
from attnlab.files import atomic_write, crash_point

CHECKSUM_KEY = "attnlab.sha256"
Expected = Mapping[str, tuple[tuple[int, ...], torch.dtype]]  # name -> (shape, dtype)


def tensor_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of `tensors`, in name order (independent of
    the file layout)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def is_finite(t: torch.Tensor) -> bool:
    """Whether a tensor holds no NaN and no inf: its float64 sum is finite exactly then (float32
    values cannot overflow it), and a sum costs a tenth of an elementwise isfinite."""
    return not t.is_floating_point() or bool(torch.isfinite(t.sum(dtype=torch.float64)))


def check_finite(tensors: Mapping[str, torch.Tensor], where: str | Path) -> None:
    """Raise FloatingPointError naming the first floating tensor that holds NaN or inf; `where` is
    the file that was going to be written."""
    for name, t in tensors.items():
        if not is_finite(t):
            bad = int((~torch.isfinite(t)).sum())
            raise NonFiniteError(f"refusing to write {where}: tensor {name!r} holds {bad} non-finite values "
                                 f"(NaN or inf); nothing was written")


def encode(tensors: Mapping[str, torch.Tensor], where: str | Path, metadata: dict | None = None) -> bytes:
    """The safetensors bytes of finite `tensors` with their checksum in the metadata.

    Raises:
        FloatingPointError: for a non-finite tensor (check_finite).
    """
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    check_finite(tensors, where)
    return to_bytes(tensors, metadata={**(metadata or {}), CHECKSUM_KEY: tensor_digest(tensors)})


def _write(file: Path, data: bytes, target: Path) -> None:
    with open(file, "wb") as f:
        f.write(data[:len(data) // 2])
        f.flush()
        crash_point("partial", target)  # test hook: a torn file (files.py)
        f.write(data[len(data) // 2:])


def write_tensors(path: str | Path, tensors: Mapping[str, torch.Tensor], metadata: dict | None = None) -> int:
    """Write `tensors` to `path` directly (inside a directory that atomic_directory swaps in as a
    whole); returns the bytes written. Raises FloatingPointError for a non-finite tensor."""
    data = encode(tensors, path, metadata)
    _write(Path(path), data, Path(path))
    return len(data)


def save_tensors(path: str | Path, tensors: Mapping[str, torch.Tensor], metadata: dict | None = None) -> None:
    """Create or replace the safetensors file `path` atomically (files.atomic_write).

    Raises:
        FloatingPointError: for a non-finite tensor (nothing is written). files.DiskFullError.
    """
    path = Path(path)
    data = encode(tensors, path, metadata)
    atomic_write(path, lambda tmp: _write(tmp, data, path), need=len(data))


def tied_groups(state: Mapping[str, torch.Tensor]) -> list[list[str]]:
    """Names of a state dict that share one tensor (tied weights), in state-dict order, one list per
    tensor; untied names form groups of one."""
    groups: dict[tuple, list[str]] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride())) \
            if t.numel() else (name,)
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def model_tensors(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(the model's state dict without tied duplicates, metadata mapping each left-out name to the
    kept one)."""
    state = model.state_dict()
    tensors, metadata = {}, {}
    for group in tied_groups(state):
        tensors[group[0]] = state[group[0]]
        metadata.update({name: group[0] for name in group[1:]})
    return tensors, metadata


def expected_of(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{name: (shape, dtype)} of a state dict, for read_tensors."""
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}


def _dtype(t: torch.Tensor | torch.dtype) -> str:
    return str(t if isinstance(t, torch.dtype) else t.dtype).removeprefix("torch.")


def _open(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for a bad header or a short file
        raise UserError(f"{path} is not a readable safetensors file ({e})") from None


def read_tensors(path: str | Path, expected: Expected | None = None,
                 optional: frozenset[str] | set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """All tensors of the safetensors file `path`, validated (module docstring).

    Args:
        expected: {name: (shape, dtype)} the file must hold exactly (None: any names, any dtype).
        optional: names of `expected` that may be missing (tied weights, absent optimizer state).
    Raises:
        FileNotFoundError: naming the path. ValueError: naming the file and the tensor: not
            safetensors, checksum mismatch, non-finite values, a missing / unexpected name, a wrong
            shape or dtype.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no tensors at {path}")
    tensors, metadata = _open(path)
    stored = metadata.get(CHECKSUM_KEY)
    if stored is not None and stored != tensor_digest(tensors):
        raise UserError(f"{path} is damaged: its tensor data does not match the checksum in its header")
    if expected is not None:
        missing = sorted(set(expected) - set(tensors) - set(optional))
        unexpected = sorted(set(tensors) - set(expected))
        if missing or unexpected:
            raise UserError(f"{path}: missing tensors {missing[:5]}, unexpected tensors {unexpected[:5]}")
        for name, t in tensors.items():
            shape, dtype = expected[name]
            if tuple(t.shape) != tuple(shape):
                raise UserError(f"{path}: tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(shape)}")
            if t.dtype != dtype:
                raise UserError(f"{path}: tensor {name!r} is {_dtype(t)}, expected {_dtype(dtype)}")
    for name, t in tensors.items():
        if not is_finite(t):
            raise UserError(f"{path}: tensor {name!r} holds {int((~torch.isfinite(t)).sum())} non-finite values "
                            f"(NaN or inf); the file is damaged")
    return tensors


def load_model_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load the safetensors weights at `path` into `model`: every tensor of its state dict must be
    there (one name per tied group suffices; older names are mapped by the model's load hooks) with
    its shape and dtype, finite.

    Raises:
        FileNotFoundError, ValueError: as read_tensors, naming the file and the tensor.
    """
    state = model.state_dict()
    tensors = read_tensors(path)
    float_dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    for name, t in tensors.items():
        own = state.get(name)
        if own is not None and tuple(t.shape) != tuple(own.shape):
            raise UserError(f"{path} does not match the model's config: tensor {name!r} has shape "
                            f"{tuple(t.shape)}, the model's is {tuple(own.shape)}")
        if (own is not None and t.dtype != own.dtype) or (own is None and t.is_floating_point()
                                                           and t.dtype not in float_dtypes):
            raise UserError(f"{path}: tensor {name!r} is {_dtype(t)}, the model's weights are "
                            f"{_dtype(own if own is not None else next(iter(float_dtypes)))}")
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    except RuntimeError as e:  # a shape mismatch under a name the model's load hooks renamed
        raise UserError(f"{path} does not match the model's config: {' '.join(str(e).split())[:300]}") from None
    loaded = set(state) - set(missing)
    covered = {n for group in tied_groups(state) if loaded & set(group) for n in group}
    missing = sorted(set(missing) - covered)
    if missing or unexpected:
        raise UserError(f"{path}: missing tensors {missing[:5]}, unexpected tensors {sorted(unexpected)[:5]}")
