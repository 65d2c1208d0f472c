"""Benchmark: candidate kernels for a product over every SmolLM2-135M weight matrix, side by side.

One "pass" multiplies every weight matrix of SmolLM2-135M (30 layers of q/k/v/o/gate/up/down and the
49152 × 576 output projection; random values, the speed does not depend on them) by R activation rows:
R = 1 is what decoding one token must do, R = 64 what a 64-token prefill does. Candidates:
    fp32 F.linear, fp32 attnlab linear (nn/linear.py row blocks), bf16 F.linear,
    torch._weight_int8pack_mm (int8 weights, per-row scales) with fp32 and bf16 activations,
    torch._int_mm (int8 × int8, per-row scales; needs R > 16 on CPU, so it is timed with R padded to 17),
    attnlab quant_matmul q8_0 / q4_0 / q4_1: the C++ AVX512-VNNI kernel and the PyTorch fallback.
Reports ms per pass (best of --repeats), the weight bytes one pass reads, GB/s and, for R = 1, the
tokens/s ceiling 1 / pass time. Also times dequantizing every matrix of the SmolLM2 GGUF to fp32
(what loading at fp32 does) with our numpy dequantizer (interop/gguf_quants.py) and with gguf-py's
gguf.quants.dequantize, checking they agree bit for bit. Prints one JSON line.

    python bench/quant_kernels.py [--rows 1 64] [--repeats 5] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from attnlab.nn.linear import linear
from attnlab.nn.quant import quantize
from attnlab.nn.quant_kernel import kernel, matmul_reference, quant_matmul

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30 \
    + [(49152, 576)]


def timed(fn, mats, inputs, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for w in mats:
            fn(inputs[w[1]], w[0])
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-fallback", action="store_true", help="leave out the slow PyTorch fallback")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    fp32 = [(torch.randn(o, i) * 0.02, i) for o, i in SHAPES]
    cands: dict[str, tuple] = {
        "fp32 F.linear": (F.linear, fp32),
        "fp32 attnlab linear": (linear, fp32),
        "bf16 F.linear": (lambda x, w: F.linear(x.bfloat16(), w), [(w.bfloat16(), i) for w, i in fp32]),
    }
    int8 = [((w / (w.abs().amax(1, keepdim=True) / 127)).round().to(torch.int8), i) for w, i in fp32]
    scales = {id(q): torch.rand(q.shape[0]) for q, _ in int8}
    cands["int8 _weight_int8pack_mm fp32 x"] = (lambda x, q: torch._weight_int8pack_mm(x, q, scales[id(q)]), int8)
    bscales = {id(q): s.bfloat16() for q, s in ((q, scales[id(q)]) for q, _ in int8)}
    cands["int8 _weight_int8pack_mm bf16 x"] = (
        lambda x, q: torch._weight_int8pack_mm(x.bfloat16(), q, bscales[id(q)]), int8)
    int8t = [(q.t().contiguous().t(), i) for q, i in int8]  # _int_mm wants the (I, O) operand column-major

    def int_mm(x, q):
        r = max(x.shape[0], 17)
        s = x.abs().amax(-1, keepdim=True) / 127
        xq = torch.zeros(r, x.shape[1], dtype=torch.int8)
        xq[:x.shape[0]] = (x / s).round().to(torch.int8)
        return torch._int_mm(xq, q.t())[:x.shape[0]].float() * s
    cands["int8 _int_mm (per-row x quant)"] = (int_mm, int8t)
    for scheme in ("q8_0", "q4_0", "q4_1"):
        qws = [(quantize(w, scheme), i) for w, i in fp32]
        if kernel() == "cpp":
            cands[f"{scheme} attnlab C++ VNNI"] = (lambda x, q: quant_matmul(x, q, "cpp"), qws)
        if not args.skip_fallback:
            cands[f"{scheme} attnlab PyTorch fallback"] = (matmul_reference, qws)
    out = {"bench": "quant_kernels", "threads": torch.get_num_threads(), "kernel": kernel(), "results": {}}
    with torch.inference_mode():
        for rows in args.rows:
            inputs = {i: torch.randn(rows, i) for i in (576, 1536)}
            res = {}
            for name, (fn, mats) in cands.items():
                nbytes = sum(w.nbytes() if hasattr(w, "nbytes") and callable(w.nbytes)
                             else w.numel() * w.element_size() for w, _ in mats)
                t = timed(fn, mats, inputs, args.repeats)
                res[name] = {"ms": round(t * 1e3, 2), "weight_mb": round(nbytes / 1e6, 1),
                             "gb_s": round(nbytes / t / 1e9, 1)}
                if rows == 1:
                    res[name]["tok_s_ceiling"] = round(1 / t, 1)
                else:
                    res[name]["tok_s"] = round(rows / t, 1)
            out["results"][f"rows={rows}"] = res
    out["dequantize_smollm2_matrices_s"] = dequantize_file()
    print(json.dumps(out))


def dequantize_file() -> dict:
    import gguf  # optional (the hf extra)
    import numpy as np
    from attnlab.interop.gguf_quants import dequantize
    from attnlab.pretrained import resolve
    tensors = [t for t in gguf.GGUFReader(str(resolve("smollm2-135m"))).tensors if len(t.shape) == 2]
    shape = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in tensors}
    res, outs = {}, {}
    for name, fn in (("attnlab gguf_quants", lambda t: dequantize(t.data, t.tensor_type, shape[t.name])),
                     ("gguf.quants", lambda t: gguf.quants.dequantize(t.data, t.tensor_type))):
        t0 = time.perf_counter()
        outs[name] = [fn(t) for t in tensors]
        res[name] = round(time.perf_counter() - t0, 2)
    res["bit_identical"] = all(np.array_equal(a, b) for a, b in zip(*outs.values()))
    return res


if __name__ == "__main__":
    main()
