"""The llama.cpp peer (llama-cpp-python, the optional `bench` extra), as ../shared/peers/decode_llamacpp.py
drives it: re-quantize a GGUF with llama_model_quantize, time prefill + greedy decode of given token
ids, return greedy tokens and per-token log-likelihoods. Token ids are fed directly, so both engines
see exactly the same input. Every function returns None when llama_cpp is not installed.
"""
from __future__ import annotations

import ctypes
import math
import os
import time

try:  # optional: pip install 'attnlab[bench]' (builds llama.cpp from source)
    import llama_cpp
    from llama_cpp import Llama
    _default_params = llama_cpp.llama_cpp.llama_model_default_params
except ImportError:
    llama_cpp = None

FTYPES = {"F32": "LLAMA_FTYPE_ALL_F32", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
          "Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def version() -> str | None:
    return None if llama_cpp is None else llama_cpp.__version__


def requantize(src: str, kind: str, out: str, threads: int) -> str:
    """Write `src` re-quantized to `kind` (F32, Q8_0, Q4_0, Q4_1, Q4_K_M) at `out` with llama.cpp itself."""
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, FTYPES[kind])
    p.allow_requantize = True
    p.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {kind} failed ({rc})")
    return out


def _no_extra_buffer_types():
    """Model parameters with use_extra_bufts = False. llama.cpp built with GGML_NATIVE on this
    Sapphire Rapids VM compiles its AMX int8 kernels (an "extra buffer type"), whose tile
    instructions raise SIGILL here (the VM does not enable AMX tile state); without extra buffer
    types llama.cpp multiplies with its AVX512-VNNI vec_dot kernels (and does not repack weights)."""
    params = _default_params()
    params.use_extra_bufts = False
    return params


def load(path: str, threads: int, n_ctx: int = 512, logits_all: bool = False):
    llama_cpp.llama_cpp.llama_model_default_params = _no_extra_buffer_types
    return Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_batch=n_ctx,
                 verbose=False, logits_all=logits_all)


def greedy(llm, ids: list[int], new: int) -> list[int]:
    """`new` greedy tokens after `ids` (end-of-text ignored)."""
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(new):
        tok = llm.sample(temp=0.0)
        out.append(int(tok))
        llm.eval([tok])
    return out


def speed(llm, ids: list[int], new: int, repeats: int) -> dict:
    """Best of `repeats` (after one warm-up): prefill tok/s over ids, decode tok/s over `new` greedy tokens."""
    best = None
    for r in range(repeats + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(new):
            llm.eval([llm.sample(temp=0.0)])
        t2 = time.perf_counter()
        rec = {"prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": new / (t2 - t1)}
        if r and (best is None or rec["decode_tok_s"] > best["decode_tok_s"]):
            best = rec
    return {k: round(v, 1) for k, v in best.items()}


def nll(llm, ids: list[int], window: int) -> tuple[float, int]:
    """Summed negative log-likelihood (nats) of ids[1:] scored in consecutive windows, and the count."""
    import numpy as np  # numpy comes with llama_cpp
    total, count = 0.0, 0
    for s in range(0, len(ids) - 1, window):
        chunk = ids[s:s + window + 1]
        llm.reset()
        llm.eval(chunk[:-1])
        logits = np.asarray(llm.scores[:len(chunk) - 1], dtype=np.float64)
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        total += float((logz - logits[np.arange(len(chunk) - 1), chunk[1:]]).sum())
        count += len(chunk) - 1
    return total, count


def file_bytes(path: str) -> int:
    return os.path.getsize(path)


def perplexity(total: float, count: int) -> float:
    return math.exp(total / count)
