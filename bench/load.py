"""Benchmark: how long loading SmolLM2-135M takes (what every `attnlab generate` and `attnlab serve`
pays before its first token), ours against llama.cpp, and where our time goes.

For each dtype (--dtypes; "auto" keeps the GGUF's Q4_1 / Q8_0 matrices), --rounds rounds, each in
turn: load_causal_lm (the whole load: reading the file's metadata with gguf-py's GGUFReader, the
tokenizer, building the model, its weights), and llama.cpp's Llama() on the same file (its own
reader, the weights memory-mapped; at its defaults, as _llamacpp.probe_defaults finds them, probed
before the timing; skipped when llama-cpp-python is not installed). Then the
model's construction alone, side by side: GPT(cfg) (parameters randomly initialised) against
GPT.for_loading(cfg) (built on the meta device, what the loaders use), and GGUFReader alone.
Medians and spreads (s); the file is read once before timing, so the page cache holds it.
Prints one JSON line with the host.

    python bench/load.py [--rounds 5] [--dtypes auto fp32] [--threads 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import statistics
import time

import _llamacpp as peer
import torch
from _common import emit, host, spread
from gguf import GGUFReader

from attnlab.load import load_causal_lm
from attnlab.models.gpt import GPT
from attnlab.nn.quant_kernel import kernel
from attnlab.pretrained import resolve


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtypes", nargs="+", default=["auto", "fp32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kernel()  # the C++ extension built and loaded before any timing
    path = str(resolve("smollm2-135m"))
    with open(path, "rb") as f:  # into the page cache
        while f.read(1 << 24):
            pass
    cfg = load_causal_lm(path, "fp32").model.cfg
    settings = peer.probe_defaults(path, args.threads) if peer.version() is not None else None  # before timing
    times: dict[str, list[float]] = {}

    def add(key: str, fn) -> None:
        times.setdefault(key, []).append(timed(fn))

    for _ in range(args.rounds):
        for dtype in args.dtypes:
            add(f"ours_{dtype}", lambda: load_causal_lm(path, dtype))
        if peer.version() is not None:
            add("llama.cpp", lambda: peer.load(path, args.threads, extra_buffer_types=settings["extra_buffer_types"]))
        add("build_GPT(cfg)", lambda: GPT(cfg))
        add("build_GPT.for_loading(cfg)", lambda: GPT.for_loading(cfg))
        add("gguf_reader", lambda: GGUFReader(path, "r"))
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"bench": "load", "model": "smollm2-135m", "file": path, "rounds": args.rounds,
           "seconds": {k: spread(v) for k, v in times.items()},
           "build_for_loading_vs_GPT": round(med["build_GPT.for_loading(cfg)"] / med["build_GPT(cfg)"], 3),
           "llama.cpp": peer.version(), "llama.cpp_settings": settings, "host": host(args.threads)}
    if "llama.cpp" in med:
        out["ours_vs_llama.cpp"] = {d: round(med[f"ours_{d}"] / med["llama.cpp"], 2) for d in args.dtypes}
    emit(out, args.out)


if __name__ == "__main__":
    main()
