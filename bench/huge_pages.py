"""Benchmark: the fused decode step with its weights on 2 MiB pages or on 4 KiB ones, side by side.

nn/huge_pages.h moves the weights the fused plan streams onto transparent huge pages when the plan
is built (Tuning.huge_pages, nn/cpu_tuning.py). Pages cannot be split back inside a process, so for
each precision the model is loaded twice: one copy's plan built with huge_pages 0, the other's with
1; then the two decode in turns (--rounds rounds; greedy, one sequence, --new-tokens tokens after a
--prompt-tokens prompt). Prints one JSON line: per precision the decode tok/s of each (median, min,
max), the per-round ratio huge / 4 KiB (median and spread), the bytes each plan has on huge pages,
and the seconds the first plan build took (the collapse's one-time cost); with the host (CPU, flags,
threads, bandwidth, GFLOP/s).

    python bench/huge_pages.py [--precisions fp32 q8_0 q4_0] [--rounds 8] [--new-tokens 64]
                               [--threads 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from _common import SHARED, host, spread

from attnlab.engines import FusedEngine
from attnlab.jsonfile import write_json_atomic
from attnlab.load import load_causal_lm
from attnlab.nn import cpu_tuning
from attnlab.nn.quant_kernel import get_tuning, kernel, set_tuning


def build(model, huge: int, max_len: int) -> tuple[FusedEngine, float]:
    """A fused engine over `model` with Tuning.huge_pages = huge, and the seconds its build took."""
    kept = get_tuning()
    set_tuning(huge_pages=huge)
    try:
        t0 = time.perf_counter()
        engine = FusedEngine(model, 1, max_len)
        return engine, time.perf_counter() - t0
    finally:
        set_tuning(**kept)


@torch.no_grad()
def decode_rate(engine: FusedEngine, ids: list[int], new: int) -> float:
    """Greedy decode tok/s of `new` steps after prefilling `ids` into slot 0 (released after)."""
    token = int(engine.prefill([0], [ids])[0].argmax())
    t0 = time.perf_counter()
    for _ in range(new):
        token = int(engine.step([0], [token])[0].argmax())
    seconds = time.perf_counter() - t0
    engine.release(0)
    return new / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "q8_0", "q4_0"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if kernel() != "cpp":
        sys.exit("bench/huge_pages.py: the C++ extension is not available here")
    result = {"bench": "huge_pages", "date": time.strftime("%Y-%m-%d"), "host": host(args.threads),
              "tuning": cpu_tuning.chosen(True), "command": " ".join(["python"] + sys.argv),
              "rounds": args.rounds, "new_tokens": args.new_tokens, "precisions": {}}
    text = (SHARED / "data" / "tinyshakespeare" / "input.txt").read_text()[:4000]
    for name in args.precisions:
        copies = [load_causal_lm("smollm2-135m", name) for _ in range(2)]
        ids = copies[0].tokenizer.encode(text)[:args.prompt_tokens]
        engines, seconds = zip(*(build(c.model, huge, len(ids) + args.new_tokens + 1)
                                 for c, huge in zip(copies, (0, 1))))
        for e in engines:
            decode_rate(e, ids, 4)  # warm-up
        rates: tuple[list[float], list[float]] = ([], [])
        for r in range(args.rounds):
            for i in (0, 1) if r % 2 == 0 else (1, 0):  # the order alternates
                rates[i].append(decode_rate(engines[i], ids, args.new_tokens))
        result["precisions"][name] = {
            "decode_tok_s": {"4k_pages": spread(rates[0]), "huge_pages": spread(rates[1])},
            "ratio_huge_vs_4k": spread([b / a for a, b in zip(*rates)]),
            "huge_page_bytes": {"4k_pages": engines[0].decoder.plan.huge_page_bytes(),
                                "huge_pages": engines[1].decoder.plan.huge_page_bytes()},
            "first_build_s": {"4k_pages": round(seconds[0], 3), "huge_pages": round(seconds[1], 3)}}
        del engines, copies
        if args.out:
            write_json_atomic(args.out, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
