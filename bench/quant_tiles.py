"""Benchmark: the quantized weights' kernel layouts (nn/quant.py QuantWeight.tile: 0 = ggml's rows in
4-row tiles, 8 / 16 = the kernel's 8- / 16-row tiles, nn/quant_tiles.h) side by side, one fused decode
step (engines/fused.py) of SmolLM2-135M at B = 1, 8, 16 sequences.

--configs: TILE or TILE:PREFETCH_Q (a layout, and optionally the kernel's prefetch_q for it instead of
this machine's, nn/cpu_tuning.py). For each precision the model is loaded once per layout
(ATTNLAB_QUANT_TILE, read when the weights are prepared); the configs alternate within each round
(--rounds), each round times --steps steps per B after a warm-up; the JSON has the median step time
and tok/s per (config, B), B's speed-up over B = 1, and each config's ratio to layout 0. The evidence
for nn/cpu_tuning.py's per-format tile choice.
Prints one JSON line with the host (lscpu model name, flags, threads, bandwidth, GFLOP/s).

    python bench/quant_tiles.py [--precisions q8_0 q4_0 q4_1] [--configs 0 8 16 16:0] [--batches 1 8 16] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from _common import host

from attnlab.engines.fused import FusedEngine
from attnlab.jsonfile import write_json_atomic
from attnlab.load import load_causal_lm
from attnlab.nn import cpu_tuning
from attnlab.nn.quant_kernel import SCHEME_ID, get_tuning, kernel, set_tuning
from attnlab.nn.quant_linear import QuantEmbedding, QuantLinear

PRECISIONS = {"q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "auto"}  # ours dtype (q4_1: the file as stored)


def load(precision: str, tile: int):
    os.environ[cpu_tuning.TILE_ENV] = str(tile)
    try:
        return load_causal_lm("smollm2-135m", PRECISIONS[precision]).model
    finally:
        del os.environ[cpu_tuning.TILE_ENV]


def step_ms(engine: FusedEngine, b: int, steps: int, prefetch_q: int | None) -> float:
    """Median ms of one step of b sequences (prompts of 64, 60, ... tokens), after 3 warm-up steps."""
    machine = get_tuning()
    if prefetch_q is not None:
        set_tuning(prefetch_q=prefetch_q)
    try:
        return _step_ms(engine, b, steps)
    finally:
        set_tuning(**machine)


def _step_ms(engine: FusedEngine, b: int, steps: int) -> float:
    slots = list(range(b))
    engine.prefill(slots, [[1 + i] * (64 - 4 * i) for i in range(b)])
    tokens = [5] * b
    for _ in range(3):
        engine.step(slots, tokens)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step(slots, tokens)
        times.append(time.perf_counter() - t0)
    for s in slots:
        engine.release(s)
    return statistics.median(times) * 1e3


def dequantize_ms(model) -> float:
    """ms to dequantize every quantized matrix of `model` (shared ones once) to bf16, in its layout."""
    seen, layers = set(), []
    for m in model.modules():
        if isinstance(m, (QuantLinear, QuantEmbedding)) and m.qs.data_ptr() not in seen:
            seen.add(m.qs.data_ptr())
            layers.append(m)
    op = torch.ops.attnlab_quant.dequantize_bf16
    t0 = time.perf_counter()
    for m in layers:
        op(m.qs, m.d, m.m, SCHEME_ID[m.scheme], m.tile)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    ap.add_argument("--configs", nargs="+", default=["0", "8", "16"], help="TILE or TILE:PREFETCH_Q")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if kernel() != "cpp":
        sys.exit("bench/quant_tiles.py: the C++ kernel is not built here (nn/quant_kernel.py)")
    result = {"bench": "quant_tiles", "date": time.strftime("%Y-%m-%d"), "host": host(args.threads),
              "tuning": cpu_tuning.chosen(True), "threads": args.threads,
              "command": " ".join(["python"] + sys.argv), "precisions": {}}
    configs = {c: (int(c.split(":")[0]), int(c.split(":")[1]) if ":" in c else None) for c in args.configs}
    for tile, _ in configs.values():
        if tile not in cpu_tuning.TILES:
            sys.exit(f"bench/quant_tiles.py: tile {tile} is not one of {cpu_tuning.TILES}")
    for name in args.precisions:
        models = {t: load(name, t) for t in {t for t, _ in configs.values()}}
        engines = {t: FusedEngine(m, max(args.batches), 256) for t, m in models.items()}
        times = {c: {b: [] for b in args.batches} for c in configs}
        dq = {c: [] for c in configs}
        for _ in range(args.rounds):
            for c, (tile, prefetch_q) in configs.items():
                for b in args.batches:
                    times[c][b].append(step_ms(engines[tile], b, args.steps, prefetch_q))
                dequantize_ms(models[tile])  # warm-up
                dq[c].append(dequantize_ms(models[tile]))
        out = {}
        for c in configs:
            ms = {b: statistics.median(v) for b, v in times[c].items()}
            out[c] = {str(b): {"step_ms": round(ms[b], 3), "tok_s": round(b * 1e3 / ms[b], 1),
                               "vs_B1": round(b * ms[args.batches[0]] / ms[b] / args.batches[0], 2)}
                      for b in args.batches}
            out[c]["dequantize_bf16_ms"] = round(statistics.median(dq[c]), 2)
        if "0" in configs:
            for c in configs:
                for b in args.batches:
                    out[c][str(b)]["vs_tile0"] = round(out[c][str(b)]["tok_s"] / out["0"][str(b)]["tok_s"], 3)
                out[c]["dequantize_vs_tile0"] = round(out["0"]["dequantize_bf16_ms"] / out[c]["dequantize_bf16_ms"], 3)
        result["precisions"][name] = out
        del engines, models
        if args.out:
            write_json_atomic(args.out, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
