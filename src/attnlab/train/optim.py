"""Optimiser and learning-rate schedules."""
from __future__ import annotations

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


def build_optimizer(model: nn.Module, lr: float, betas: tuple[float, float], eps: float,
                    weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """Adam (weight_decay 0, the paper's) or AdamW with decay on matrices only, never on biases,
    norms or embeddings (Loshchilov & Hutter 2019)."""
    if weight_decay == 0:
        return torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

