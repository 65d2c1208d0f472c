"""Benchmark: SmolLM2-135M decoding beside other busy processes (a shared machine), 1 and 2 threads.

A developer's 2-core box or a shared VM rarely has its cores to itself: a build, a test run or a
second model may hold one. This bench decodes the same 64-token prompt (Tiny Shakespeare) for
--tokens greedy tokens with generate() (the engine `attnlab generate` picks) while --busy N other
processes spin (pure Python loops, each one core's worth of demand), for each N, dtype and thread
count, --rounds times interleaved; prints one JSON line with each case's decode tok/s (median, min,
max) and its ratio to the same dtype and threads with nothing beside it, and the host.

    python bench/contention.py [--dtypes fp32 q8_0] [--busy 0 1 2] [--threads 1 2] [--tokens 64]
                               [--rounds 3] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from _common import host, spread
from inference import ours_once, prompt_ids

from attnlab.engines import engine_name
from attnlab.jsonfile import write_json_atomic
from attnlab.load import load_causal_lm

BUSY = "while True: pass"


def busy_processes(n: int) -> list[subprocess.Popen]:
    """n processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "q8_0"])
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    models = {d: load_causal_lm("smollm2-135m", d) for d in args.dtypes}
    ids = prompt_ids(next(iter(models.values())).tokenizer, 64)
    rates: dict[tuple, list[float]] = {}
    for _ in range(args.rounds):
        for busy in args.busy:
            others = busy_processes(busy)
            try:
                time.sleep(0.5)  # let them start spinning
                for dtype, loaded in models.items():
                    for threads in args.threads:
                        torch.set_num_threads(threads)
                        ours_once(loaded.model, [ids], 4)  # warm-up (the engine's plan, the caches)
                        r = ours_once(loaded.model, [ids], args.tokens)["decode_tok_s"]
                        rates.setdefault((dtype, threads, busy), []).append(r)
            finally:
                for p in others:
                    p.kill()
                    p.wait()
    cases = {}
    for (dtype, threads, busy), values in rates.items():
        alone = statistics.median(rates[dtype, threads, 0]) if (dtype, threads, 0) in rates else None
        cases[f"{dtype} threads={threads} busy={busy}"] = {
            "decode_tok_s": spread(values),
            "vs_nothing_beside": round(statistics.median(values) / alone, 3) if alone else None}
    result = {"bench": "contention", "date": time.strftime("%Y-%m-%d"), "host": host(max(args.threads)),
              "command": " ".join(["python"] + sys.argv), "tokens": args.tokens, "rounds": args.rounds,
              "engines": {d: engine_name(m.model) for d, m in models.items()}, "cases": cases}
    if args.out:
        write_json_atomic(args.out, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
