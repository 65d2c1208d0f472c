"""Optimiser and learning-rate schedules."""
from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.errors import UserError


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5).

    Rises linearly for warmup_steps steps, peaks at step = warmup_steps with
    factor · (d_model · warmup_steps)^-0.5, then decays as step^-0.5. Steps count from 1.
    Source: Vaswani et al. 2017, §5.3, equation (3).
    """
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def cosine_lr(step: int, lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """Linear warm-up to `lr`, then a half cosine from `lr` down to `min_lr`, reached one step after
    decay_steps; min_lr from then on. Steps count from 1; with W = warmup_steps, D = decay_steps and
    W1 = max(W, 1) (the step at the peak):

        lr(n) = lr · n / W                                             for n <= W
        lr(n) = min_lr + ½ · (1 + cos(π · (n − W1) / (D − W1 + 1))) · (lr − min_lr)   for W < n <= D
        lr(n) = min_lr                                                 for n > D

    So the warm-up peaks exactly at step W (at step 1 without warm-up), and each of the D steps of a
    D-step budget runs above min_lr (above 0 when min_lr is 0 and lr > 0): the curve ends at min_lr
    after the last step, as in Hugging Face's get_cosine_schedule_with_warmup and nanoGPT's get_lr
    (both evaluate the cosine at 0-based steps and reach min_lr at index D, one past the last step).
    This is exactly Hugging Face's schedule with num_warmup_steps=W, num_training_steps=D + 1 read at
    n (for W >= 1), leaving out its step 0, whose learning rate is 0.

    Args:
        step: the 1-based optimiser step n. lr: the peak learning rate. min_lr: the floor.
        warmup_steps: W >= 0. decay_steps: D >= 1.
    Returns:
        The learning rate of step n.
    Raises:
        ValueError: when step < 1, warmup_steps < 0 or decay_steps < 1.
    Source: Loshchilov & Hutter 2017, "SGDR", equation (5) (one cycle, no restart), with the linear
        warm-up of Goyal et al. 2017; the schedule of GPT-3 and nanoGPT.
    """
    _check_step(step, warmup_steps)
    if decay_steps < 1:
        raise UserError(f"decay_steps must be >= 1, got {decay_steps}")
    if step <= warmup_steps:
        return lr * step / warmup_steps
    if step > decay_steps:
        return min_lr
    peak = max(warmup_steps, 1)
    progress = (step - peak) / (decay_steps - peak + 1)  # in [0, 1): 1 only at step decay_steps + 1
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def _check_step(step: int, warmup_steps: int) -> None:
    if step < 1:
        raise UserError(f"step must be >= 1 (optimiser steps count from 1), got {step}")
    if warmup_steps < 0:
        raise UserError(f"warmup_steps must be >= 0, got {warmup_steps}")


def warmup_steps_for(warmup_steps: int, warmup_ratio: float, total_steps: int) -> int:
    """The warm-up of a run of total_steps steps: warmup_steps, or the fraction warmup_ratio of the
    run (rounded up, at least 1 step) when that is shorter; warmup_ratio 0 keeps warmup_steps.

        W_eff = min(W, max(1, ⌈r · D⌉))   (r > 0),   W_eff = W   (r = 0)

    So a recipe's warm-up, tuned for its full budget, shrinks with a shorter one instead of filling
    it (Hugging Face's warmup_ratio, here capped at warmup_steps rather than replaced by them).

    Raises:
        ValueError: when warmup_ratio is outside [0, 1) or total_steps < 1.
    """
    _check_ratio(warmup_ratio)
    if total_steps < 1:
        raise UserError(f"total_steps must be >= 1, got {total_steps}")
    return min(warmup_steps, max(1, math.ceil(warmup_ratio * total_steps))) if warmup_ratio else warmup_steps


def budget_warmup(step: int, fraction: float, warmup_steps: int, warmup_ratio: float = 0.0) -> float:
    """The linear warm-up factor of step n when f of a time budget is spent: whichever of the two
    warm-ups ends first, warmup_steps steps or the fraction warmup_ratio of the budget,

        w(n, f) = min(1, max(n / W, f / r))   (r > 0),   w(n, f) = min(1, n / W)   (r = 0)

    (1 without warm-up, W = 0). The clock form of warmup_steps_for: at a steady step rate the two agree.

    Raises:
        ValueError: when step < 1, fraction < 0, warmup_steps < 0 or warmup_ratio is outside [0, 1).
    """
    _check_step(step, warmup_steps)
    _check_ratio(warmup_ratio)
    if fraction < 0:
        raise UserError(f"fraction must be >= 0, got {fraction}")
    if not warmup_steps:
        return 1.0
    by_time = fraction / warmup_ratio if warmup_ratio else 0.0
    return min(1.0, max(step / warmup_steps, by_time))


def _check_ratio(warmup_ratio: float) -> None:
    if not 0.0 <= warmup_ratio < 1.0:
        raise UserError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")


def budget_cosine_lr(step: int, fraction: float, lr: float, min_lr: float, warmup_steps: int,
                     warmup_ratio: float = 0.0) -> float:
    """A cosine decay over the fraction of a time budget spent, with a linear warm-up
    (budget_warmup: over warmup_steps steps, or the fraction warmup_ratio of the budget when that
    comes first):

        lr(n, f) = w(n, f) · (min_lr + ½ · (1 + cos(π · min(f, 1))) · (lr − min_lr))

    so the learning rate reaches min_lr when the budget runs out, whatever the number of steps that
    fit in it (a wall-clock budget: the Budgeted Training schedules of Li et al. 2020, §4, and the
    time-based one-cycle schedule of Geiping & Goldstein 2022, "Cramming", §4.3).

    Args:
        step: the 1-based optimiser step n. fraction: f >= 0, the part of the budget spent before
            this step. lr: the peak. min_lr: the floor. warmup_steps: W >= 0.
            warmup_ratio: r in [0, 1), 0 = warm-up over steps only.
    Raises:
        ValueError: when step < 1, fraction < 0, warmup_steps < 0 or warmup_ratio is outside [0, 1).
    """
    warm = budget_warmup(step, fraction, warmup_steps, warmup_ratio)
    return warm * (min_lr + 0.5 * (1.0 + math.cos(math.pi * min(fraction, 1.0))) * (lr - min_lr))


OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")


def build_optimizer(model: nn.Module, lr: float, betas: tuple[float, float], eps: float,
                    weight_decay: float = 0.0, impl: str = "fused") -> torch.optim.Optimizer:
    """Adam (weight_decay 0, the paper's) or AdamW in two groups: decay on every matrix (linear
    weights and embeddings), none on biases, norm gains and parameters marked `_no_weight_decay`
    (Mamba's A_log and D, as its reference code) (Loshchilov & Hutter 2019; the grouping of
    GPT-2/nanoGPT). Only the parameters that require a gradient are optimised (a LoRA model's
    adapters, not its frozen base).

    Args:
        impl: torch's implementation of the update: "for-loop" (one op per parameter: torch's
            default on the CPU), "foreach" (multi-tensor ops: the same numbers, fewer calls) or
            "fused" (one kernel per step: the same maths, rounded differently, ~1 ulp).
    Raises:
        ValueError: for an unknown impl.
    """
    if impl not in OPTIMIZER_IMPLS:
        raise UserError(f"optimizer_impl must be one of {', '.join(OPTIMIZER_IMPLS)}, got {impl!r}", param="impl")
    kind = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
    trained = [p for p in model.parameters() if p.requires_grad]
    if weight_decay == 0:
        return torch.optim.Adam(trained, lr=lr, betas=betas, eps=eps, **kind)
    decay, no_decay = [], []
    for p in trained:
        (decay if p.dim() >= 2 and not getattr(p, "_no_weight_decay", False) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kind)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_normalised_(grads: list[torch.Tensor], scale: float, max_norm: float) -> torch.Tensor:
    """grads ← grads · scale, then clipped to a global L2 norm of at most max_norm, as one multiply:
    the same as `_foreach_mul_(grads, scale)` followed by `clip_grad_norm_(…, max_norm)` (its
    coefficient max_norm / (norm + 1e-6), at most 1), up to fp32 rounding, with one pass over the
    gradients fewer. One process's unsharded gradients only (torch's clipping handles the others).

    Args:
        grads: the gradients, modified in place. scale: the loss normalisation (1 / the token count).
        max_norm: > 0.
    Returns:
        the norm of the scaled gradients before clipping (a 0-d tensor; non-finite where a gradient is).
    Source: Pascanu et al. 2013, §3.2 (clipping the gradient's norm).
    """
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads, foreach=True) * scale
    torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0) * scale)
    return norm
