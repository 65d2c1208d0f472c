"""Benchmark: the per-machine settings of the decode products (nn/cpu_tuning.py), swept on SmolLM2.

For each setting, with everything else as chosen: one batch-1 product over every matrix a decoded
token reads (the model's own QuantLinear / fp32 weights, through the kernel's ops: what the fused
step runs), as GB/s; and the fused engine's step (B = 1 and 8), as ms per step (median of --steps).
Also the fork/join cost of one parallel product (a tiny matrix split over the threads, against the
same on one thread) and nn/linear.py's forms ("cpp", "bmm", "blas") over the fp32 matrices.
Settings change speed only: every product gives the same bits whatever they are.
Prints one JSON line (with this machine's CPU, flags, bandwidth and GFLOP/s).

    python bench/decode_tuning.py [--threads 2] [--steps 20] [--dtypes fp32 q8_0 auto]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from _common import host

from attnlab.engines import FusedEngine
from attnlab.load import load_causal_lm
from attnlab.nn import cpu_tuning
from attnlab.nn import linear as linear_mod
from attnlab.nn.quant_kernel import SCHEME_ID, kernel
from attnlab.nn.quant_linear import QuantEmbedding, QuantLinear

PREFETCH = (0, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
PARALLEL = (1 << 13, 1 << 14, 1 << 15, 1 << 16, 1 << 17)


def products(model) -> list:
    """(fn, bytes) per matrix a decoded token reads: a batch-1 product through the kernel's ops."""
    out = []
    for module in model.modules():
        if isinstance(module, (QuantLinear, QuantEmbedding)) and not isinstance(module, QuantEmbedding):
            qw = module.qweight
            x = torch.randn(1, qw.shape[1])
            out.append((lambda x=x, qw=qw: torch.ops.attnlab_quant.linear(x, qw.qs, qw.d, qw.m, SCHEME_ID[qw.scheme]),
                        qw.nbytes()))
        elif isinstance(module, torch.nn.Linear):
            w = module.weight.detach()
            x = torch.randn(1, w.shape[1])
            out.append((lambda x=x, w=w: torch.ops.attnlab_quant.linear_f32(x, w), w.numel() * 4))
    return out


def best(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def stream_gbs(prods) -> float:
    total = sum(b for _, b in prods)
    return round(total / best(lambda: [fn() for fn, _ in prods]) / 1e9, 2)


def step_ms(model, batch: int, steps: int) -> float:
    engine = FusedEngine(model, batch, 64 + steps + 2)
    engine.prefill(range(batch), [list(range(100, 164 - b)) for b in range(batch)])
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.step(range(batch), [7] * batch)
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 3)


def set_tuning(parallel: int, prefetch_q: int, prefetch_f32: int) -> None:
    torch.ops.attnlab_quant.set_tuning(parallel, prefetch_q, prefetch_f32)


def fork_join_us() -> float:
    """µs one product split over the threads costs beyond the same product on one thread."""
    w, x = torch.randn(64, 64), torch.randn(1, 64)
    keep = torch.ops.attnlab_quant.get_tuning()
    set_tuning(1 << 40, 0, 0)
    serial = best(lambda: [torch.ops.attnlab_quant.linear_f32(x, w) for _ in range(1000)])
    set_tuning(1, 0, 0)
    split = best(lambda: [torch.ops.attnlab_quant.linear_f32(x, w) for _ in range(1000)])
    set_tuning(*keep)
    return round((split - serial) / 1000 * 1e6, 2)


def linear_forms(model) -> dict:
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    total = sum(w.numel() * 4 for w in weights)
    out = {}
    for name, fn in (("cpp", lambda x, w: torch.ops.attnlab_quant.linear_f32(x, w)),
                     ("bmm", lambda x, w: linear_mod._bmm(x, w, 1)), ("blas", F.linear)):
        out[name] = round(total / best(lambda: [fn(inputs[w.shape[1]], w) for w in weights], 3) / 1e9, 2)
    return {"gb_s": out, "chosen": linear_mod.form()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "q8_0", "auto"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert kernel() == "cpp", "needs the C++ extension"
    chosen = torch.ops.attnlab_quant.get_tuning()  # [parallel_bytes, prefetch_q, prefetch_f32]
    result = {"bench": "decode_tuning", "host": host(args.threads), "chosen": cpu_tuning.chosen(True),
              "fork_join_us": fork_join_us(), "sweeps": {}}
    for dtype in args.dtypes:
        model = load_causal_lm("smollm2-135m", dtype).model
        prods, quantized = products(model), dtype != "fp32"
        rows = []
        for prefetch in PREFETCH:
            set_tuning(chosen[0], prefetch if quantized else chosen[1], chosen[2] if quantized else prefetch)
            rows.append({"prefetch": prefetch, "stream_gb_s": stream_gbs(prods),
                         "step_ms_b1": step_ms(model, 1, args.steps), "step_ms_b8": step_ms(model, 8, args.steps)})
        for parallel in PARALLEL:
            set_tuning(parallel, chosen[1], chosen[2])
            rows.append({"parallel_bytes": parallel, "stream_gb_s": stream_gbs(prods),
                         "step_ms_b1": step_ms(model, 1, args.steps), "step_ms_b8": step_ms(model, 8, args.steps)})
        set_tuning(*chosen)
        result["sweeps"][dtype] = rows
        if dtype == "fp32":
            result["linear_forms_fp32"] = linear_forms(model)
        del model
    print(json.dumps(result))


if __name__ == "__main__":
    main()
