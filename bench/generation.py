"""Benchmark: decoding speed with and without the KV cache, and KV-cache memory for MHA, GQA and MQA.

Speed: a GPT-2-style model (randomly initialised: speed does not depend on the weights) generates
from a 16-token prompt until the sequence holds N tokens (N = 256, 512, 1,024), greedily, batch 1,
with the KV cache and with full recomputation at every step; decode tokens/s and the ratio.
Memory: the bytes the caches hold for a 1,024-token sequence with n_kv_heads = H (MHA), H/4 (GQA)
and 1 (MQA); the MHA/GQA ratio must be n_heads / n_kv_heads. Prints one JSON line.

    python bench/generation.py [--lengths 256 512 1024] [--d-model 256] [--layers 6] [--heads 8]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from attnlab.models.gpt import GPTConfig
from attnlab.generate import generate
from attnlab.models.gpt import GPT

PROMPT = 16


def decode_rate(model: GPT, total: int, use_cache: bool) -> float:
    """Generated tokens per second to grow a PROMPT-token prompt to `total` tokens."""
    prompt = [list(range(1, PROMPT + 1))]
    new = total - PROMPT
    t0 = time.perf_counter()
    out = generate(model, prompt, new, temperature=0.0, stop_tokens=[], use_cache=use_cache)
    assert len(out[0]) == new
    return new / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    args = ap.parse_args()
    max_len = max(args.lengths)
    sizes = dict(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                 max_seq_len=max_len)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("gpt2", **sizes)).eval()
    decode_rate(model, PROMPT + 8, True)  # warm-up
    speed = []
    for n in args.lengths:
        cached, uncached = decode_rate(model, n, True), decode_rate(model, n, False)
        speed.append({"tokens": n, "cached_tok_s": round(cached, 1), "uncached_tok_s": round(uncached, 1),
                      "ratio_cached_vs_uncached": round(cached / uncached, 2)})
    memory = []
    for label, kv in (("MHA", args.heads), ("GQA", max(1, args.heads // 4)), ("MQA", 1)):
        m = GPT(GPTConfig.from_name("llama", **sizes, n_kv_heads=kv)).eval()
        m.setup_kv_cache(1, max_len)
        nbytes = m.kv_cache_bytes()
        m.clear_kv_cache()
        memory.append({"attention": label, "n_heads": args.heads, "n_kv_heads": kv, "kv_cache_bytes": nbytes,
                       "cached_tok_s": round(decode_rate(m, max_len, True), 1)})
    mha = memory[0]["kv_cache_bytes"]
    for row in memory:
        row["ratio_mha_vs_this"] = round(mha / row["kv_cache_bytes"], 3)
        row["expected_ratio_n_heads_over_n_kv_heads"] = args.heads / row["n_kv_heads"]
    print(json.dumps({"bench": "generation", "model": {**sizes, "parameters": model.num_parameters()},
                      "prompt_tokens": PROMPT, "batch": 1, "dtype": "float32", "threads": torch.get_num_threads(),
                      "speed": speed, "kv_cache_memory_seq_len": max_len, "kv_cache_memory": memory}))


if __name__ == "__main__":
    main()
