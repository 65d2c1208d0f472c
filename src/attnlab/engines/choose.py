"""Which decode engine runs a model: the one rule generate() and the server share.

Rule ("auto"): the fused C++ engine where it applies (engines/fused.py: a LLaMA-style GPT on the
CPU with fp32 or block-quantized weights and the C++ extension built), else the reference engine
(the model's own forward: every model, device and dtype). Asking for "fused-cpp" by name where it
does not apply is an error that says why; "reference" always runs. The KV cache dtype (kv_dtype) is
the fused engine's choice (engines/fused.py cache_dtype); the reference engine keeps the model's.
"""
from __future__ import annotations

from attnlab.errors import UserError
from attnlab.engines.base import DecodeEngine
from attnlab.engines.fused import FusedEngine, cache_dtype
from attnlab.engines.reference import ReferenceEngine

ENGINES = ("auto", FusedEngine.name, ReferenceEngine.name)


def engine_name(model, engine: str = "auto", kv_dtype: str = "auto") -> str:
    """The name of the engine `choose_engine` gives `model` (module doc), without building it.

    Raises:
        ValueError: an unknown engine name (listing ENGINES), "fused-cpp" for a model it does
            not run (saying why), or a kv_dtype that engine does not take (choose_engine).
    """
    if engine not in ENGINES:
        raise UserError(f"engine={engine!r} is not one of {', '.join(ENGINES)}", param="engine")
    fused = False
    if engine != ReferenceEngine.name:
        reason = FusedEngine.unsupported(model)
        if reason is not None and engine == FusedEngine.name:
            raise UserError(f"engine='fused-cpp' does not run this model: {reason}", param="engine")
        fused = reason is None
    if fused:
        cache_dtype(model, kv_dtype)  # raises for a kv_dtype the fused engine does not take here
        return FusedEngine.name
    if kv_dtype != "auto":
        raise UserError(f"kv_dtype={kv_dtype!r} needs the fused engine (this model runs on the reference engine, "
                        "whose caches are the model's dtype)", param="kv_dtype")
    return ReferenceEngine.name


def choose_engine(model, max_batch: int, max_len: int, engine: str = "auto", kv_dtype: str = "auto") -> DecodeEngine:
    """A decode engine for `model` with `max_batch` slots of `max_len` positions (module doc); kv_dtype:
    the fused engine's cache dtype (engines/fused.py cache_dtype; the reference engine's caches are
    the model's dtype, and it takes only "auto").

    Raises:
        ValueError: as engine_name, or the engine's own (max_batch, max_len, kv_dtype).
    """
    if engine_name(model, engine, kv_dtype) == FusedEngine.name:
        return FusedEngine(model, max_batch, max_len, kv_dtype)
    return ReferenceEngine(model, max_batch, max_len)
