"""Benchmark: attention against the Mamba scan as the sequence grows — prefill time and peak extra
memory against T, and per-token decode time and cache/state bytes against position.

One layer of each at the same d_model, batch 1, fp32, no gradients: causal self-attention
(nn.attention.MultiHeadAttention, the explicit math path and torch's SDPA) and the Mamba block
(nn.mamba_block.MambaBlock: projections, convolution and the selective scan; expand 2, d_state 16).
Prefill: one forward over T tokens. Decode: one new token at position p, attention reading a KV
cache of p positions, Mamba updating its constant-size state. Each point runs in a fresh subprocess;
peak memory is the rise of the process's peak resident set (ru_maxrss) over the inputs. A point
that would exceed --max-seconds (extrapolated from the previous length, at the fitted slope of 2 for
attention and 1 for Mamba) or the math path's --max-scores-mib is skipped and reported as such.

Prints one JSON line: the rows, the log–log slopes fitted over the measured points (time ∝ T^slope),
and the first measured T at which the Mamba block's prefill is faster than SDPA (the crossing on this
machine); --plot draws the four panels (log–log).

    python bench/complexity.py [--d-model 256] [--heads 4] [--lengths 256 ... 65536]
                               [--positions 256 ... 16384] [--threads 1] [--plot FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

from _common import save_figure

CHILD = r"""
import json, math, resource, sys, time
import torch
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.mamba_block import MambaBlock, MambaState
kind, mode, t, d, heads, reps, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
torch.set_num_threads(threads)
torch.manual_seed(0)
if kind == "mamba":
    layer = MambaBlock(d_model=d, d_state=16, d_conv=4, expand=2, dt_rank=math.ceil(d / 16)).eval()
else:
    layer = MultiHeadAttention(d, heads, bias=False, impl=kind).eval()
x = torch.randn(1, 1 if mode == "decode" else t, d)
with torch.no_grad():
    layer(x[:, :1]) if kind == "mamba" else layer(x[:, :1], is_causal=True)  # warm-up
    state = None
    if mode == "decode":
        if kind == "mamba":
            state = MambaState(1, 2 * d, 4, 16)
        else:
            state = KVCache(1, heads, t + reps + 1, d // heads)
            state.k[:, :, :t].normal_(); state.v[:, :, :t].normal_(); state.length = t
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        if kind == "mamba":
            layer(x, state=state)
        elif mode == "decode":
            layer(x, cache=state)
        else:
            layer(x, is_causal=True)
        times.append(time.perf_counter() - t0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = {"ms": round(min(times) * 1e3, 3), "peak_extra_mib": round((peak - base) / 1024, 1)}
if state is not None:
    out["state_bytes"] = state.memory_bytes() if kind == "mamba" else 2 * t * d * 4  # K and V of t positions
print(json.dumps(out))
"""
KINDS = ("math", "sdpa", "mamba")
COLORS = {"math": "tab:blue", "sdpa": "tab:orange", "mamba": "tab:green"}
DECODE_REPS = 20  # at least this many single-token runs per decode point (they take ~1 ms)
SLOPE = {"math": 2.0, "sdpa": 2.0, "mamba": 1.0}  # expected growth of prefill time, for skipping


def measure(kind: str, mode: str, t: int, args) -> dict:
    reps = max(args.reps, DECODE_REPS) if mode == "decode" else args.reps
    out = subprocess.run([sys.executable, "-c", CHILD, kind, mode, str(t), str(args.d_model), str(args.heads),
                          str(reps), str(args.threads)], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def fit_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y against log x (None with fewer than two points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y and y > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / var, 2) if var else None


def prefill_rows(args) -> list[dict]:
    rows, last = [], {}
    for t in args.lengths:
        row = {"seq_len": t}
        for kind in KINDS:
            scores_mib = args.heads * t * t * 4 / 2**20
            prev = last.get(kind)
            guess = prev[1] * (t / prev[0]) ** SLOPE[kind] / 1e3 if prev else 0.0
            if kind == "math" and scores_mib > args.max_scores_mib:
                row[kind] = {"skipped": f"scores {scores_mib:.0f} MiB > --max-scores-mib"}
            elif guess * args.reps > args.max_seconds:
                row[kind] = {"skipped": f"~{guess:.0f} s per run > --max-seconds / reps"}
            else:
                row[kind] = measure(kind, "prefill", t, args)
                last[kind] = (t, row[kind]["ms"])
        rows.append(row)
        print(json.dumps({"prefill": row}), file=sys.stderr)
    return rows


def decode_rows(args) -> list[dict]:
    rows = []
    for p in args.positions:
        row = {"position": p, **{kind: measure(kind, "decode", p, args) for kind in ("sdpa", "mamba")}}
        rows.append(row)
        print(json.dumps({"decode": row}), file=sys.stderr)
    return rows


def summary(pre: list[dict], dec: list[dict]) -> dict:
    def series(rows, key, kind, field):
        pts = [(r[key], r[kind][field]) for r in rows if field in r[kind]]
        return [p[0] for p in pts], [p[1] for p in pts]
    slopes = {f"prefill_{k}_{f}": fit_slope(*series(pre, "seq_len", k, f)) for k in KINDS for f in ("ms", "peak_extra_mib")}
    slopes.update({f"decode_{k}_ms": fit_slope(*series(dec, "position", k, "ms")) for k in ("sdpa", "mamba")})
    return {"slopes": slopes, "prefill_mamba_faster_than_sdpa_from_T": crossing(pre, "seq_len"),
            "decode_mamba_faster_than_sdpa_from_position": crossing(dec, "position")}


def crossing(rows: list[dict], key: str) -> int | None:
    """The smallest measured length from which Mamba is faster than SDPA at every longer one measured
    for both (one noisy early win does not count)."""
    both = [(r[key], r["mamba"]["ms"] < r["sdpa"]["ms"]) for r in rows if "ms" in r["mamba"] and "ms" in r["sdpa"]]
    first = None
    for length, mamba_faster in both:
        first = (first or length) if mamba_faster else None
    return first


def plot(pre: list[dict], dec: list[dict], args) -> None:
    import matplotlib  # optional heavy dependency: only with --plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = ((pre, "seq_len", "ms", KINDS, "prefill time", "ms"),
              (pre, "seq_len", "peak_extra_mib", KINDS, "prefill peak extra memory", "MiB"),
              (dec, "position", "ms", ("sdpa", "mamba"), "decode time per token", "ms"),
              (dec, "position", "state_bytes", ("sdpa", "mamba"), "KV cache / state bytes", "bytes"))
    for ax, (rows, key, field, kinds, title, unit) in zip(axes.flat, panels):
        for kind in kinds:
            pts = [(r[key], max(r[kind][field], 1e-3)) for r in rows if field in r[kind]]
            if pts:
                slope = fit_slope(*zip(*pts))
                ax.plot(*zip(*pts), "o-", color=COLORS[kind], label=f"{'Mamba' if kind == 'mamba' else 'attention ' + kind}"
                        + (f" (slope {slope})" if slope is not None else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T" if key == "seq_len" else "position")
        ax.set_ylabel(unit)
        ax.set_title(f"{title}, one layer, d_model {args.d_model}")
        ax.legend(fontsize=8)
    save_figure(fig, args.plot)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2 ** k for k in range(8, 17)])
    ap.add_argument("--positions", type=int, nargs="+", default=[2 ** k for k in range(8, 15)])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=60.0, help="skip a prefill point expected to take longer")
    ap.add_argument("--max-scores-mib", type=float, default=2048.0, help="skip the math path above this score size")
    ap.add_argument("--plot")
    args = ap.parse_args()
    pre, dec = prefill_rows(args), decode_rows(args)
    print(json.dumps({"bench": "complexity", "batch": 1, "d_model": args.d_model, "heads": args.heads,
                      "mamba": {"expand": 2, "d_state": 16, "d_conv": 4}, "dtype": "float32", "threads": args.threads,
                      "prefill": pre, "decode": dec, **summary(pre, dec)}))
    if args.plot:
        plot(pre, dec, args)


if __name__ == "__main__":
    main()
