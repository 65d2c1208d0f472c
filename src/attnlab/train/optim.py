"""Optimiser and learning-rate schedules."""
from __future__ import annotations

import math

import torch
from torch import nn


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5).

    Rises linearly for warmup_steps steps, peaks at step = warmup_steps with
    factor · (d_model · warmup_steps)^-0.5, then decays as step^-0.5. Steps count from 1.
    Source: Vaswani et al. 2017, §5.3, equation (3).
    """
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def cosine_lr(step: int, lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """Linear warm-up to `lr` over warmup_steps, then cosine decay to `min_lr` at decay_steps, then min_lr.

    Steps count from 1. Source: Loshchilov & Hutter 2017, "SGDR", equation (5) (one cycle, no
    restart), with the linear warm-up of Goyal et al. 2017; the schedule of GPT-3 and nanoGPT.
    """
    if step <= warmup_steps:
        return lr * step / warmup_steps
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def build_optimizer(model: nn.Module, lr: float, betas: tuple[float, float], eps: float,
                    weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """Adam (weight_decay 0, the paper's) or AdamW in two groups: decay on every matrix (linear
    weights and embeddings), none on biases and norm gains (Loshchilov & Hutter 2019; the grouping
    of GPT-2/nanoGPT)."""
    if weight_decay == 0:
        return torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps)
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

