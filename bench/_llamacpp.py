"""The llama.cpp peer (llama-cpp-python, the optional `bench` extra), as ../shared/peers/decode_llamacpp.py
drives it: re-quantize a GGUF with llama_model_quantize, time prefill + greedy decode of given token
ids, return greedy tokens and per-token log-likelihoods. Token ids are fed directly, so both engines
see exactly the same input. Every function returns None when llama_cpp is not installed.

llama.cpp runs at its default settings (Llama()'s defaults; only the threads, the context and the
batch are set) wherever they work. Its "extra buffer types" (weights repacked for the CPU's best
kernels: AMX tiles, AVX512 interleaved blocks) are on by default; on a host where the default
settings crash (the Intel Sapphire Rapids VM of issue 17: AMX tile instructions raise SIGILL, the VM
does not enable AMX tile state), `probe_defaults` finds it in a subprocess and the bench loads with
use_extra_bufts = False instead, saying so in its JSON.
"""
from __future__ import annotations

import ctypes
import math
import os
import signal
import subprocess
import sys
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
    """Model parameters with use_extra_bufts = False: llama.cpp multiplies with its AVX512-VNNI
    vec_dot kernels and does not repack weights (module doc)."""
    params = _default_params()
    params.use_extra_bufts = False
    return params


_PROBE = ("import sys, llama_cpp\n"
          "llm = llama_cpp.Llama(model_path=sys.argv[1], n_threads=int(sys.argv[2]), n_threads_batch=int(sys.argv[2]),"
          " n_ctx=64, n_batch=64, verbose=False)\n"
          "llm.eval(list(range(1, 40)))\nllm.eval([7])\n")


_probed: dict = {}


def probe_defaults(path: str, threads: int) -> dict:
    """Load `path` at llama.cpp's default settings and evaluate a prompt and one token in a subprocess.

    Returns:
        {"extra_buffer_types": True, "probe": "ok"} when they work, else {"extra_buffer_types": False,
        "probe": what happened (the signal that killed it, or its exit code and last stderr line)}.
    """
    if (path, threads) in _probed:
        return _probed[path, threads]
    run = subprocess.run([sys.executable, "-c", _PROBE, path, str(threads)], capture_output=True, text=True)
    if run.returncode == 0:
        found = {"extra_buffer_types": True, "probe": "ok"}
    elif run.returncode < 0:
        found = {"extra_buffer_types": False,
                 "probe": f"killed by {signal.Signals(-run.returncode).name} at the default settings"}
    else:
        found = {"extra_buffer_types": False,
                 "probe": f"exit code {run.returncode}: {(run.stderr.strip().splitlines() or [''])[-1][:200]}"}
    _probed[path, threads] = found
    return found


def load(path: str, threads: int, n_ctx: int = 512, logits_all: bool = False, extra_buffer_types: bool | None = None):
    """Llama at its defaults but for threads, n_ctx (= n_batch) and, where the host needs it, extra
    buffer types off (None: as probe_defaults finds for this file)."""
    if extra_buffer_types is None:
        extra_buffer_types = probe_defaults(path, threads)["extra_buffer_types"]
    llama_cpp.llama_cpp.llama_model_default_params = _default_params if extra_buffer_types else _no_extra_buffer_types
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
