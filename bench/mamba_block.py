"""Benchmark: one Mamba layer's forward + backward at a training shape, with each of its two kernels
in PyTorch or C++, side by side.

The layer of shakespeare-char-mamba (d_model 128, d_state 16, d_conv 4, expand 2) on a batch of
12 × 64 tokens. Candidates (nn/ssm.py's and nn/causal_conv.py's impl):
    torch      the causal convolution by F.conv1d + F.silu, the scan by the PyTorch loop, Δ's softplus
               and the gate as PyTorch ops: the block as it was before the kernels
    cpp_scan   the C++ scan (with Δ's softplus, D and the gate fused), the convolution by F.conv1d
    cpp        both kernels (the default where the extension builds)
The candidates take turns (--rounds rounds of --steps steps each, the order rotating); each is
checked against `torch` first (output and input gradient). Prints one JSON line: median ms per
forward + backward, the ratio of `torch` to each, the largest difference, and the host.

    python bench/mamba_block.py [--batch 12] [--length 64] [--threads 1] [--steps 5] [--rounds 6]
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch
from _common import host

from attnlab.nn import causal_conv, mamba_block, quant_kernel, ssm
from attnlab.nn.mamba_block import MambaLayer

CANDIDATES = {"torch": ("torch", "torch"), "cpp_scan": ("cpp", "torch"), "cpp": ("cpp", "cpp")}  # (scan, conv)


def use(scan: str, conv: str) -> None:
    """Route mamba_block's calls of the scan and the convolution to these implementations."""
    mamba_block.selective_scan = functools.partial(ssm.selective_scan, impl=scan)
    mamba_block.causal_conv1d_silu = functools.partial(causal_conv.causal_conv1d_silu, impl=conv)


def run(layer: MambaLayer, u: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    u = u.clone().requires_grad_()
    layer.zero_grad(set_to_none=True)
    out = layer(u)
    out.backward(g)
    return out.detach(), u.grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if quant_kernel.kernel() != "cpp":
        raise SystemExit("bench/mamba_block.py compares against the C++ kernels, which do not build here")
    torch.manual_seed(0)
    layer = MambaLayer(d_model=args.d_model, d_state=16, d_conv=4, expand=2, dt_rank=-(-args.d_model // 16))
    u, g = torch.randn(args.batch, args.length, args.d_model), torch.randn(args.batch, args.length, args.d_model)
    use(*CANDIDATES["torch"])
    ref = run(layer, u, g)
    diffs, times = {}, {c: [] for c in CANDIDATES}
    for c, impls in CANDIDATES.items():
        use(*impls)
        got = run(layer, u, g)
        diffs[c] = max((a - b).abs().max().item() for a, b in zip(got, ref))
    names = list(CANDIDATES)
    for r in range(args.rounds):
        for c in names[r % len(names):] + names[:r % len(names)]:
            use(*CANDIDATES[c])
            for _ in range(args.steps):
                start = time.perf_counter()
                run(layer, u, g)
                times[c].append(time.perf_counter() - start)
    ms = {c: round(statistics.median(t) * 1e3, 3) for c, t in times.items()}
    print(json.dumps({"bench": "mamba_block", "host": host(args.threads), "batch": args.batch, "length": args.length,
                      "d_model": args.d_model, "ms_forward_backward": ms,
                      "speedup_vs_torch": {c: round(ms["torch"] / v, 2) for c, v in ms.items()},
                      "max_abs_diff_vs_torch": diffs}))


if __name__ == "__main__":
    main()
