"""Which decode engine runs a model: the one rule generate() and the server share.

Rule ("auto"): the fused C++ engine where it applies (engines/fused.py: a LLaMA-style GPT on the
CPU with fp32 or block-quantized weights and the C++ extension built), else the reference engine
(the model's own forward: every model, device and dtype). Asking for "fused-cpp" by name where it
does not apply is an error that says why; "reference" always runs.
"""
from __future__ import annotations

from attnlab.errors import UserError
from attnlab.engines.base import DecodeEngine
from attnlab.engines.fused import FusedEngine
from attnlab.engines.reference import ReferenceEngine

ENGINES = ("auto", FusedEngine.name, ReferenceEngine.name)


def engine_name(model, engine: str = "auto") -> str:
    """The name of the engine `choose_engine` gives `model` (module doc), without building it.

    Raises:
        ValueError: an unknown engine name (listing ENGINES), or "fused-cpp" for a model it does
            not run (saying why).
    """
    if engine not in ENGINES:
        raise UserError(f"engine={engine!r} is not one of {', '.join(ENGINES)}", param="engine")
    if engine == ReferenceEngine.name:
        return engine
    reason = FusedEngine.unsupported(model)
    if reason is not None and engine == FusedEngine.name:
        raise UserError(f"engine='fused-cpp' does not run this model: {reason}", param="engine")
    return ReferenceEngine.name if reason is not None else FusedEngine.name


def choose_engine(model, max_batch: int, max_len: int, engine: str = "auto") -> DecodeEngine:
    """A decode engine for `model` with `max_batch` slots of `max_len` positions (module doc).

    Raises:
        ValueError: as engine_name, or the engine's own (max_batch, max_len).
    """
    cls = FusedEngine if engine_name(model, engine) == FusedEngine.name else ReferenceEngine
    return cls(model, max_batch, max_len)
