"""Decode engines: how a causal LM's tokens are computed at inference, below the model.

A model's forward() is the reference; an engine binds a loaded model to a fast path (the fused C++
step, batched per-sequence KV caches) and is tested equal to the reference. generate() and the
server (serve/) choose an engine; the model never decides. base.py states the contract;
slots.py holds the per-slot checks and caches; reference.py runs the model's own forward; fused.py
the fused C++ step (nn/fused_decode.py); choose.py the rule that picks one (choose_engine).
"""
from attnlab.engines.base import DecodeEngine
from attnlab.engines.choose import ENGINES, choose_engine, engine_name
from attnlab.engines.fused import KV_DTYPE_NAMES, FusedEngine
from attnlab.engines.reference import ReferenceEngine
from attnlab.engines.slots import context_limit

__all__ = ["DecodeEngine", "ENGINES", "FusedEngine", "KV_DTYPE_NAMES", "ReferenceEngine", "choose_engine",
           "context_limit", "engine_name"]
