"""complexity: measured time and peak extra memory of causal attention against sequence length.

The explicit math path builds the T × T score matrix (quadratic time and memory); SDPA's causal
kernel never materialises it (still quadratic time, linear extra memory). Log–log slopes are fitted
over the longer lengths. Attention against the linear-time Mamba scan: bench/complexity.py.
Shape legend: H heads, T tokens, Dh head dim.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.viz import peak_memory
from attnlab.viz.figure import finish, new_figure

IMPLS = ("math", "sdpa")
LENGTHS = (128, 256, 512, 1024, 2048, 4096)


@dataclass
class ComplexityResult:
    heads: int
    head_dim: int
    lengths: list[int]
    seconds: dict[str, list[float]]           # impl -> median seconds per call, per length
    memory: dict[str, list[float]] | None     # impl -> peak extra bytes per length (None: not measurable here)

    def slope(self, values: list[float], points: int = 3) -> float:
        """The log–log slope fitted over the `points` longest lengths."""
        x, y = np.log(self.lengths[-points:]), np.log(np.maximum(values[-points:], 1e-12))
        return float(np.polyfit(x, y, 1)[0])

    @property
    def ratio_1k_to_128k(self) -> int:
        return (128 * 1024 // 1024) ** 2

    @property
    def caption(self) -> str:
        t = {i: self.slope(self.seconds[i]) for i in IMPLS}
        text = (f"Time grows as T^{t['math']:.2f} (math) and T^{t['sdpa']:.2f} (SDPA) over the longest lengths")
        if self.memory:
            m = {i: self.slope(self.memory[i]) for i in IMPLS}
            text += (f"; extra memory as T^{m['math']:.2f} for the math path, which stores the T × T scores, "
                     f"and T^{m['sdpa']:.2f} for SDPA, which never builds them")
        return (text + f". From 1K to 128K tokens the attention matrix grows (128)² = {self.ratio_1k_to_128k:,}×: "
                f"{self.scores_gib(128 * 1024):,.0f} GiB of fp32 scores per layer at {self.heads} heads.")

    def scores_gib(self, t: int) -> float:
        """Bytes of one layer's fp32 T × T score matrices, in GiB."""
        return self.heads * t * t * 4 / 2 ** 30


def time_attention(impl: str, heads: int, head_dim: int, t: int, repeats: int = 3) -> float:
    """Median seconds of one causal attention call over T tokens (batch 1, fp32), after a warm-up."""
    q, k, v = (torch.randn(1, heads, t, head_dim) for _ in range(3))  # (B, H, T, Dh)
    times = []
    with torch.no_grad():
        scaled_dot_product_attention(q, k, v, impl=impl, is_causal=True)
        for _ in range(repeats):
            start = time.perf_counter()
            scaled_dot_product_attention(q, k, v, impl=impl, is_causal=True)
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_memory(heads: int, head_dim: int, lengths: list[int]) -> dict[str, list[float]] | None:
    """{impl: peak extra bytes per length} of both paths, measured in a child process (see
    peak_memory); None where the system cannot measure it."""
    if not peak_memory.supported():
        return None
    cmd = [sys.executable, "-m", "attnlab.viz.peak_memory", str(heads), str(head_dim), *map(str, lengths)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return None
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {impl: [float(result[impl][str(t)]) for t in lengths] for impl in IMPLS}


def complexity(lengths: tuple[int, ...] = LENGTHS, heads: int = 4, head_dim: int = 64, repeats: int = 3,
               memory: bool = True) -> ComplexityResult:
    """Measure both attention paths at every length.

    Raises:
        ValueError: fewer than 3 lengths, or a length < 2.
    """
    lengths = sorted(set(lengths))
    if len(lengths) < 3 or lengths[0] < 2:
        raise UserError(f"--lengths needs at least 3 distinct lengths >= 2, got {lengths}")
    seconds = {i: [time_attention(i, heads, head_dim, t, repeats) for t in lengths] for i in IMPLS}
    return ComplexityResult(heads, head_dim, lengths, seconds, measure_memory(heads, head_dim, lengths) if memory
                            else None)


def draw_complexity(r: ComplexityResult, out) -> None:
    panels = [("seconds per call", r.seconds, "time")]
    if r.memory:
        panels.append(("peak extra bytes", r.memory, "memory"))
    fig = new_figure(6.0 * len(panels), 4.6)
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    x = np.array(r.lengths, float)
    for ax, (label, values, name) in zip(axes, panels):
        for impl, color in zip(IMPLS, ("#e76f51", "#264653")):
            ax.loglog(x, values[impl], "o-", color=color, label=f"{impl}: slope {r.slope(values[impl]):.2f}")
        top = values["math"][-1]
        ax.loglog(x, top * (x / x[-1]) ** 2, ":", color="#888888", label="T² (quadratic law)")
        ax.loglog(x, top * (x / x[-1]), "--", color="#bbbbbb", label="T (linear)")
        ax.minorticks_off()
        ax.set_xticks(x, [str(int(t)) for t in x])
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_ylabel(label)
        ax.set_title(f"{name} of causal attention, {r.heads} heads × {r.head_dim} dims, batch 1, fp32", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    axes[-1].text(0.02, 0.98, f"1K → 128K tokens: (128)² = {r.ratio_1k_to_128k:,}× the attention matrix\n"
                  f"{r.scores_gib(1024) * 1024:.0f} MiB → {r.scores_gib(128 * 1024):,.0f} GiB of scores per layer",
                  transform=axes[-1].transAxes, va="top", fontsize=8,
                  bbox={"facecolor": "white", "edgecolor": "#cccccc"})
    finish(fig, "Attention cost against sequence length (measured)", r.caption, out)
