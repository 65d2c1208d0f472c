"""Benchmark: the per-machine settings of the decode products (nn/cpu_tuning.py), swept on SmolLM2.

For each candidate setting, with everything else as chosen: one 1-row (and 8-row) product over every
matrix a decoded token reads (the model's own QuantLinear / fp32 weights, through the kernel's ops:
what the fused step runs), as GB/s; and the fused engine's step (B = 1 and 8), as ms per step (median
of --steps); every candidate once per round, --rounds rounds, medians reported.
Also the fork/join cost of one parallel product (a tiny matrix split over the threads, against the
same on one thread) and nn/linear.py's forms ("cpp", "bmm", "blas") over the fp32 matrices.
Settings change speed only: every product gives the same bits whatever they are.
Prints one JSON line (with this machine's CPU, flags, bandwidth and GFLOP/s).

    python bench/decode_tuning.py [--threads 2] [--steps 10] [--rounds 3] [--dtypes fp32 q8_0 auto]
                                  [--candidates '' prefetch_q=0 prefetch_spread=1,prefetch_q=8192] [--context 64]
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from _common import host

from attnlab.engines import FusedEngine
from attnlab.load import load_causal_lm
from attnlab.nn import cpu_tuning
from attnlab.nn import linear as linear_mod
from attnlab.nn.quant_kernel import SCHEME_ID, get_tuning, kernel, set_tuning
from attnlab.nn.quant_linear import QuantLinear

# candidate settings per kind of weight, each tried in every round (interleaved: the machine drifts)
CANDIDATES = {
    "quantized": [{}, {"prefetch_q": 0}, {"prefetch_l2": 0}, {"prefetch_l2": 0, "prefetch_q": 1536},
                  {"prefetch_q": 2048}, {"prefetch_q": 8192}, {"prefetch_q": 16384}, {"prefetch_spread": 1},
                  {"prefetch_spread": 1, "prefetch_q": 8192}, {"prefetch_spread": 1, "prefetch_l2": 0},
                  {"parallel_bytes": 1 << 14}, {"parallel_bytes": 1 << 16}, {"one_region": 0}],
    "fp32": [{}, {"prefetch_l2": 0, "prefetch_f32": 0}, {"prefetch_f32": 8192}, {"prefetch_f32": 32768},
             {"prefetch_f32": 65536}, {"parallel_bytes": 1 << 16}, {"parallel_bytes": 1 << 17}, {"one_region": 0}],
}


def products(model, rows: int = 1) -> list:
    """(fn, bytes) per matrix a decoded token reads: a `rows`-row product through the kernel's ops."""
    out = []
    for module in model.modules():
        if isinstance(module, QuantLinear):
            qw = module.qweight
            x = torch.randn(rows, qw.shape[1])
            out.append((lambda x=x, qw=qw: torch.ops.attnlab_quant.linear(x, qw.qs, qw.d, qw.m, SCHEME_ID[qw.scheme],
                                                                          qw.tile), qw.nbytes()))
        elif isinstance(module, torch.nn.Linear):
            w = module.weight.detach()
            x = torch.randn(rows, w.shape[1])
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


_engines: dict = {}


def step_ms(model, batch: int, steps: int, context: int = 64) -> float:
    """Median ms of `steps` fused steps of `batch` sequences (one engine per model and batch, prefilled once
    with prompts of `context`, `context` − 1, ... tokens)."""
    key = (id(model), batch)
    if key not in _engines:
        engine = FusedEngine(model, batch, context + 1200)
        engine.prefill(range(batch), [[100 + i % 1000 for i in range(context - b)] for b in range(batch)])
        _engines[key] = engine
    engine, times = _engines[key], []
    for _ in range(steps):
        t = time.perf_counter()
        engine.step(range(batch), [7] * batch)
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 3)


def fork_join_us() -> float:
    """µs one product split over the threads costs beyond the same product on one thread."""
    w, x = torch.randn(64, 64), torch.randn(1, 64)
    keep = get_tuning()
    set_tuning(parallel_bytes=1 << 40)
    serial = best(lambda: [torch.ops.attnlab_quant.linear_f32(x, w) for _ in range(1000)])
    set_tuning(parallel_bytes=1)
    split = best(lambda: [torch.ops.attnlab_quant.linear_f32(x, w) for _ in range(1000)])
    set_tuning(**keep)
    return round((split - serial) / 1000 * 1e6, 2)


def parse_candidate(text: str) -> dict:
    """'key=value,key=value' (fields of nn/quant_kernel.py TUNING_FIELDS; '' = as chosen) -> a candidate."""
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in get_tuning() or not value.lstrip("-").isdigit():
            raise SystemExit(f"bench/decode_tuning.py: --candidates {text!r}: want key=int pairs of "
                             f"{', '.join(get_tuning())}")
        out[key] = int(value)
    return out


def sweep(model, quantized: bool, rounds: int, steps: int, candidates: list[dict] | None = None,
          context: int = 64) -> list[dict]:
    """Each candidate's median over `rounds` interleaved rounds: stream GB/s (1 and 8 rows), step ms (B = 1, 8)."""
    chosen, prods, prods8 = get_tuning(), products(model), products(model, 8)
    candidates = candidates or CANDIDATES["quantized" if quantized else "fp32"]
    seen = [{"stream_gb_s": [], "stream8_gb_s": [], "step_ms_b1": [], "step_ms_b8": []} for _ in candidates]
    for r in range(rounds):  # the contexts grow by `steps` per measurement: every other round in reverse
        order = list(zip(candidates, seen))
        for cand, rec in (order if r % 2 == 0 else order[::-1]):
            set_tuning(**{**chosen, **cand})
            rec["stream_gb_s"].append(stream_gbs(prods))
            rec["stream8_gb_s"].append(stream_gbs(prods8))
            rec["step_ms_b1"].append(step_ms(model, 1, steps, context))
            rec["step_ms_b8"].append(step_ms(model, 8, steps, context))
    set_tuning(**chosen)
    return [{"setting": cand or "chosen", **{k: round(statistics.median(v), 3) for k, v in rec.items()}}
            for cand, rec in zip(candidates, seen)]


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
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "q8_0", "auto"])
    ap.add_argument("--candidates", nargs="+", metavar="K=V[,K=V]",
                    help="settings to sweep instead of CANDIDATES ('' = as chosen), for every dtype")
    ap.add_argument("--context", type=int, default=64, help="prompt tokens before the timed steps (B = 1 and 8)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert kernel() == "cpp", "needs the C++ extension"
    result = {"bench": "decode_tuning", "command": shlex.join(["python"] + sys.argv), "context": args.context,
              "host": host(args.threads), "chosen": cpu_tuning.chosen(True),
              "fork_join_us": fork_join_us(), "sweeps": {}, "one_thread_stream_gb_s": {}}
    for dtype in args.dtypes:
        model = load_causal_lm("smollm2-135m", dtype).model
        picked = [parse_candidate(c) for c in args.candidates] if args.candidates else None
        result["sweeps"][dtype] = sweep(model, dtype != "fp32", args.rounds, args.steps, picked, args.context)
        torch.set_num_threads(1)
        result["one_thread_stream_gb_s"][dtype] = {r: stream_gbs(products(model, r)) for r in (1, 4, 8)}
        torch.set_num_threads(args.threads)
        if dtype == "fp32":
            result["linear_forms_fp32"] = linear_forms(model)
        _engines.clear()
        del model
    print(json.dumps(result))


if __name__ == "__main__":
    main()
