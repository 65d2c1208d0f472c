"""fp32 islands under CPU autocast: the ops inside run in fp32 although bf16 autocast is on.

Autocast casts every matrix product's inputs to bf16. On a CPU some products gain nothing from it
and lose to the casts around them: the fused attention kernel (its bf16 backward about 4x slower
than its fp32 one on AMD EPYC Zen 4, bench/train_step.py) and the Mamba block's Δ, B, C projections
(x_proj, dt_proj: a few columns wide, read by the fp32 selective scan, so each bf16 product costs
casts of its input, its weight and its outputs, forward and backward, for a product smaller than
the casts). Inside the island those ops compute in fp32 (their precision too); the products
around them stay bf16.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch


@contextlib.contextmanager
def fp32_under_cpu_autocast(t: torch.Tensor) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """With `t` on the CPU under autocast: autocast off for the block, and yields `.float()`, the cast
    to apply to the block's inputs (bf16 ones from the products before it). Elsewhere (no CPU
    autocast, or another device) changes nothing and yields the identity."""
    if t.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        yield lambda v: v
        return
    with torch.autocast("cpu", enabled=False):
        yield lambda v: v.float()
