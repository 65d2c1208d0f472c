"""Benchmark: the two routes of a quantized model's prefill products, side by side on SmolLM2-135M.

A product of many rows with a block-quantized weight (nn/quant_kernel.py) either stays on the int8
kernel (each row's activations quantized per 32-block, as in decoding) or dequantizes the weight for
the call and runs a GEMM (bf16 where the CPU multiplies bf16 natively, fp32 elsewhere:
cpu_tuning.prefill_dtype). Where the switch lies is cpu_tuning.prefill_rows; this bench times the
model's forward over a prompt of each --tokens length with every product on the int8 kernel and
with every product of ≥ 32 rows on the GEMM route, the two alternating (--rounds), and reports
prompt tokens/s (best of each round's --repeats, median over rounds) and the ratio int8 / GEMM.
Prints one JSON line (with this machine's CPU, flags, bandwidth and GFLOP/s).

    python bench/prefill_route.py [--dtypes q8_0 q4_0 q4_1] [--tokens 32 64 128 256] [--rounds 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from _common import host

from attnlab.load import load_causal_lm
from attnlab.nn import cpu_tuning, quant_kernel, quant_linear

ROUTES = {"int8": 10 ** 9, "gemm": 32}  # the rows from which the GEMM route is taken, per candidate


def set_rows(rows: int) -> None:
    quant_kernel.PREFILL_ROWS = quant_linear.PREFILL_ROWS = rows


def tokens_per_s(model, ids: torch.Tensor, repeats: int) -> float:
    with torch.no_grad():
        model(ids)  # warm: the route's first call allocates
        best = min(_timed(model, ids) for _ in range(repeats))
    return ids.shape[1] / best


def _timed(model, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model(ids)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["q8_0", "q4_0", "q4_1"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    chosen = quant_kernel.PREFILL_ROWS
    out = {"bench": "prefill_route", "command": "python bench/prefill_route.py " + " ".join(sys.argv[1:]),
           "host": host(args.threads), "prefill_dtype": cpu_tuning.prefill_dtype(), "prefill_rows": chosen,
           "results": {}}
    gen = torch.Generator().manual_seed(0)
    for dtype in args.dtypes:
        model = load_causal_lm("smollm2-135m", dtype).model
        rows = {}
        for n in args.tokens:
            ids = torch.randint(0, 1000, (1, n), generator=gen)
            runs = {route: [] for route in ROUTES}
            for _ in range(args.rounds):
                for route, switch in ROUTES.items():
                    set_rows(switch)
                    runs[route].append(tokens_per_s(model, ids, args.repeats))
            med = {route: round(statistics.median(v), 1) for route, v in runs.items()}
            rows[str(n)] = {"tok_s": med, "int8_over_gemm": round(med["int8"] / med["gemm"], 3)}
        set_rows(chosen)
        out["results"][dtype] = rows
        del model
    print(json.dumps(out))


if __name__ == "__main__":
    main()
