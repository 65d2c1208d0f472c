"""Benchmark: ways to run Mamba's selective scan on CPU, forward + backward, side by side.

The shapes of one Mamba layer at d_model D (Di = 2·D, N = 16) on a training batch B × T. Candidates:
  autograd_loop    nn.ssm.selective_scan_ref: the recurrence step by step, autograd backward
  stacked_states   Ā and B̄x precomputed as (B, T, Di, N) tensors, a loop over time, the states
                   stacked and contracted with C at once; autograd backward
  chunked_cumsum   sequential across chunks of L = 16 steps, parallel within a chunk:
                   h_t = e^{S_t} (h_0 + Σ_{s≤t} e^{−S_s} B̄_s x_s), S the cumsum of log Ā over the chunk
                   (e^{−S} overflows fp32 once a chunk decays by more than e^{-88}: a trained model's
                   large Δ·|A| would need shorter chunks); autograd backward
  log_depth        the parallel (Hillis–Steele) scan over all T: log2 T rounds of
                   (a, b)_t ∘ (a, b)_{t−k} = (a_t a_{t−k}, a_t b_{t−k} + b_t) on (B, T, Di, N) tensors,
                   exact and stable (products of Ā ≤ 1, no exponent of a sum); autograd backward
  torch_loop       nn.ssm.selective_scan impl "torch": the loop on (B, N, Di) step tensors with a
                   hand-written adjoint backward (the fallback without the C++ extension)
  cpp              nn.ssm.selective_scan impl "cpp": the C++ kernels (ssm_scan.cpp), states in
                   registers, recomputed in the backward pass (the default where the extension builds)
Each is timed (best of --repeats) on the same inputs, after checking it equals the reference on a
small problem. Prints one JSON line: ms per candidate and per T, the ratio of each to cpp, the host.

    python bench/ssm_scan.py [--batch 12] [--d-model 128] [--lengths 64 256] [--threads 1] [--repeats 3]
                             [--skip-slow-above 256]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from _common import host

from attnlab.nn import quant_kernel
from attnlab.nn.ssm import selective_scan, selective_scan_ref


def stacked_states(x, delta, A, B, C, D):
    decay = torch.exp(delta.unsqueeze(-1) * A)                     # Ā (B, T, Di, N)
    drive = (delta * x).unsqueeze(-1) * B.unsqueeze(2)             # B̄x (B, T, Di, N)
    h = x.new_zeros(x.shape[0], x.shape[2], A.shape[1])           # (B, Di, N)
    states = []
    for t in range(x.shape[1]):
        h = torch.addcmul(drive[:, t], decay[:, t], h)
        states.append(h)
    hs = torch.stack(states, 1)                                    # (B, T, Di, N)
    return (hs @ C.unsqueeze(-1)).squeeze(-1) + D * x, h


def chunked_cumsum(x, delta, A, B, C, D, chunk=16):
    h = x.new_zeros(x.shape[0], x.shape[2], A.shape[1])           # (B, Di, N)
    ys = []
    for s in range(0, x.shape[1], chunk):
        dt, xc, Bc, Cc = delta[:, s:s + chunk], x[:, s:s + chunk], B[:, s:s + chunk], C[:, s:s + chunk]
        S = (dt.unsqueeze(-1) * A).cumsum(1)                       # Σ log Ā over the chunk (B, L, Di, N)
        drive = (dt * xc).unsqueeze(-1) * Bc.unsqueeze(2)          # B̄x (B, L, Di, N)
        hs = torch.exp(S) * (h.unsqueeze(1) + (drive * torch.exp(-S)).cumsum(1))
        ys.append((hs @ Cc.unsqueeze(-1)).squeeze(-1))             # (B, L, Di)
        h = hs[:, -1]
    return torch.cat(ys, 1) + D * x, h


def log_depth(x, delta, A, B, C, D):
    a = torch.exp(delta.unsqueeze(-1) * A)                         # Ā (B, T, Di, N)
    b = (delta * x).unsqueeze(-1) * B.unsqueeze(2)                 # B̄x (B, T, Di, N)
    k = 1
    while k < x.shape[1]:                                          # after the round of k: spans of 2k steps
        b = torch.cat([b[:, :k], torch.addcmul(b[:, k:], a[:, k:], b[:, :-k])], 1)
        if 2 * k < x.shape[1]:
            a = torch.cat([a[:, :k], a[:, k:] * a[:, :-k]], 1)
        k *= 2
    return (b @ C.unsqueeze(-1)).squeeze(-1) + D * x, b[:, -1]     # b_t is now h_t


CANDIDATES = {"autograd_loop": selective_scan_ref, "stacked_states": stacked_states,
              "chunked_cumsum": chunked_cumsum, "log_depth": log_depth,
              "torch_loop": lambda *a: selective_scan(*a, impl="torch"),
              "cpp": lambda *a: selective_scan(*a, impl="cpp")}
SLOW = ("autograd_loop", "stacked_states", "log_depth")


def inputs(b: int, t: int, di: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, di, generator=g)
    delta = F.softplus(torch.randn(b, t, di, generator=g) - 3)
    A = -torch.arange(1, n + 1, dtype=torch.float32).expand(di, n).contiguous()
    B, C = torch.randn(b, t, n, generator=g), torch.randn(b, t, n, generator=g)
    return [v.requires_grad_() for v in (x, delta, A, B, C, torch.ones(di))]


def forward_backward_ms(fn, args, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        for a in args:
            a.grad = None
        start = time.perf_counter()
        y, h = fn(*args)
        (y.square().sum() + h.sum()).backward()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def check(fn) -> float:
    args = inputs(2, 37, 8, 4)
    y0, h0 = selective_scan_ref(*args)
    y, h = fn(*args)
    return max((y - y0).abs().max().item(), (h - h0).abs().max().item())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--d-state", type=int, default=16)
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-slow-above", type=int, default=256,
                    help="skip the slow autograd candidates (O(T²) or O(T log T) backward) above this T")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if quant_kernel.kernel() != "cpp":
        raise SystemExit("bench/ssm_scan.py compares against the C++ kernels, which do not build here")
    di = 2 * args.d_model
    out = {"bench": "ssm_scan", "host": host(args.threads), "batch": args.batch, "d_model": args.d_model,
           "d_inner": di, "d_state": args.d_state, "threads": args.threads, "max_abs_diff_vs_reference": {k: check(fn) for k, fn in CANDIDATES.items()},
           "ms_forward_backward": {}, "ratio_to_cpp": {}}
    for t in args.lengths:
        data = inputs(args.batch, t, di, args.d_state)
        row = {}
        for name, fn in CANDIDATES.items():
            if t > args.skip_slow_above and name in SLOW:
                continue
            row[name] = round(forward_backward_ms(fn, data, args.repeats), 1)
        out["ms_forward_backward"][str(t)] = row
        out["ratio_to_cpp"][str(t)] = {k: round(v / row["cpp"], 2) for k, v in row.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
