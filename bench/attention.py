"""Benchmark: causal self-attention time and peak memory against sequence length, math path vs SDPA.

The explicit math path materialises the (B, H, T, T) score and weight matrices, so its memory grows
as O(T²); torch's scaled_dot_product_attention with is_causal (the FlashAttention path on this CPU
build, as the GPT uses it for training and prefill) works in tiles and never holds them, so its
extra memory grows as O(T). Both do O(T²) work. Each (impl, T)
point runs in a fresh subprocess; peak memory is the rise of the process's peak resident set
(ru_maxrss) over the inputs. Prints one JSON line; --plot draws both curves (log-log).

    python bench/attention.py [--lengths 256 512 1024 2048 4096] [--heads 8] [--head-dim 64] [--plot FILE]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from _common import save_figure

CHILD = r"""
import json, resource, sys, time
import torch
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.masks import causal_mask
impl, t, h, dh, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
q, k, v = (torch.randn(1, h, t, dh) for _ in range(3))
mask = None if impl == "sdpa" else causal_mask(t)  # SDPA: its is_causal path, as the GPT uses it
scaled_dot_product_attention(q[:, :, :8], k[:, :, :8], v[:, :, :8], None, impl=impl, is_causal=True)  # warm-up
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    with torch.no_grad():
        scaled_dot_product_attention(q, k, v, mask, impl=impl, is_causal=mask is None)
    times.append(time.perf_counter() - t0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"ms": round(min(times) * 1e3, 2), "peak_extra_mib": round((peak - base) / 1024, 1)}))
"""


def measure(impl: str, t: int, heads: int, head_dim: int, reps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, impl, str(t), str(heads), str(head_dim), str(reps)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--plot")
    args = ap.parse_args()
    rows = []
    for t in args.lengths:
        row = {"seq_len": t, "scores_mib": round(args.heads * t * t * 4 / 2**20, 1)}
        for impl in ("math", "sdpa"):
            m = measure(impl, t, args.heads, args.head_dim, args.reps)
            row[f"{impl}_ms"], row[f"{impl}_peak_extra_mib"] = m["ms"], m["peak_extra_mib"]
        row["ratio_time_math_vs_sdpa"] = round(row["math_ms"] / max(row["sdpa_ms"], 1e-9), 2)
        rows.append(row)
    growth = {}
    if len(rows) >= 2:  # exponent p of time ∝ T^p between the two longest lengths
        import math
        a, b = rows[-2], rows[-1]
        for key in ("math_ms", "sdpa_ms", "math_peak_extra_mib", "sdpa_peak_extra_mib"):
            if a[key] > 0 and b[key] > 0:
                growth[key] = round(math.log(b[key] / a[key]) / math.log(b["seq_len"] / a["seq_len"]), 2)
    print(json.dumps({"bench": "attention", "batch": 1, "heads": args.heads, "head_dim": args.head_dim,
                      "causal": True, "dtype": "float32", "rows": rows, "growth_exponent_last_doubling": growth}))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        ts = [r["seq_len"] for r in rows]
        for impl, style in (("math", "o-"), ("sdpa", "s-")):
            ax1.plot(ts, [r[f"{impl}_ms"] for r in rows], style, label=impl)
            ax2.plot(ts, [max(r[f"{impl}_peak_extra_mib"], 0.1) for r in rows], style, label=impl)
        ax2.plot(ts, [r["scores_mib"] for r in rows], "k--", label="one (H, T, T) fp32 score matrix")
        for ax, title, unit in ((ax1, "time", "ms"), (ax2, "peak extra memory", "MiB")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T")
            ax.set_ylabel(unit)
            ax.set_title(f"causal attention {title}, {args.heads} heads × {args.head_dim}")
            ax.legend()
        save_figure(fig, args.plot)


if __name__ == "__main__":
    main()
