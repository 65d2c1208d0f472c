"""schedule: a recipe's learning rate over its steps, and the label-smoothed target distribution.

The learning rates come from the training loop's own schedule (train/loop.learning_rate, which calls
train/optim.py's noam_lr or cosine_lr) with the recipe's settings; the smoothed target is read off
nn/cross_entropy.py's label_smoothed_cross_entropy itself: for logits z, ∂loss/∂z = softmax(z) − q, so
q = softmax(z) − ∂loss/∂z.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.nn.cross_entropy import label_smoothed_cross_entropy
from attnlab.train.loop import decays_over_minutes, learning_rate, warms_up_over_minutes
from attnlab.viz.figure import finish, new_figure
from attnlab.viz.sources import get_recipe

RECIPES = ("multi30k-en-de", "shakespeare-char")


@dataclass
class LRCurve:
    recipe: str
    schedule: str            # "noam", "cosine" or "constant"
    steps: np.ndarray        # (N,) 1-based optimizer steps
    lr: np.ndarray           # (N,) learning rate at each step
    warmup_steps: int
    settings: dict           # the recipe's schedule settings, as drawn in the legend

    @property
    def peak(self) -> tuple[int, float]:
        i = int(np.argmax(self.lr))
        return int(self.steps[i]), float(self.lr[i])


@dataclass
class ScheduleResult:
    curves: list[LRCurve]
    epsilon: float
    target: int              # the reference token's id in the small vocabulary drawn
    pad_id: int
    one_hot: np.ndarray      # (V,)
    smoothed: np.ndarray     # (V,) the distribution the loss trains towards

    @property
    def caption(self) -> str:
        parts = [f"{c.recipe}: {c.schedule}, peak {c.peak[1]:.2e} at step {c.peak[0]}" for c in self.curves]
        return (f"Learning rate per step from each recipe's own settings ({'; '.join(parts)}); the shaded "
                f"span is the warm-up. Right: label smoothing ε = {self.epsilon:g} spreads {self.epsilon:g} of the "
                f"probability evenly over the non-padding tokens, so the reference keeps "
                f"{self.smoothed[self.target]:.3f} and the model is never pushed to full certainty.")


def lr_curve(recipe_name: str, steps: int | None = None) -> LRCurve:
    """The learning rate of every step of a recipe (steps: default its step budget or decay end, else
    8 × warm-up). A schedule that decays over a minutes budget (train/loop.decays_over_minutes) is
    drawn as if the budget held `steps` steps of equal duration (default 8 × warm-up)."""
    recipe = get_recipe(recipe_name)
    cfg = recipe.train
    total = steps or cfg.max_steps or cfg.lr_decay_steps or 8 * cfg.warmup_steps
    d_model = recipe.model.d_model
    grid = np.arange(1, total + 1)
    by_time = decays_over_minutes(cfg) or warms_up_over_minutes(cfg)
    lr = np.array([learning_rate(cfg, int(s), d_model, (s - 1) / total if by_time else None) for s in grid])
    if cfg.lr_schedule == "noam":
        settings = {"d_model": d_model, "warmup_steps": cfg.warmup_steps, "lr_factor": cfg.lr_factor}
    else:
        settings = {"lr": cfg.lr, "min_lr": cfg.min_lr, "warmup_steps": cfg.warmup_steps,
                    "decay_steps": f"{cfg.minutes:g} min" if decays_over_minutes(cfg) else cfg.lr_decay_steps or cfg.max_steps}
        if cfg.warmup_ratio:
            settings["warmup_ratio"] = cfg.warmup_ratio
    return LRCurve(recipe.name, cfg.lr_schedule, grid, lr, cfg.warmup_steps, settings)


def smoothed_target(epsilon: float, vocab: int = 10, target: int = 3, pad_id: int = 0) -> np.ndarray:
    """(vocab,) the target distribution q of label_smoothed_cross_entropy for one position."""
    logits = torch.zeros(1, vocab, requires_grad=True)
    loss = label_smoothed_cross_entropy(logits, torch.tensor([target]), epsilon, pad_id=pad_id)
    (grad,) = torch.autograd.grad(loss, logits)
    return (logits.softmax(-1) - grad)[0].detach().numpy()


def schedule_figure_data(recipes: tuple[str, ...] = RECIPES, steps: int | None = None,
                         epsilon: float | None = None) -> ScheduleResult:
    """Learning-rate curves of `recipes` and the smoothed target (ε: default the first recipe's
    label_smoothing, or 0.1 when it has none)."""
    curves = [lr_curve(name, steps) for name in recipes]
    if epsilon is None:
        epsilon = getattr(get_recipe(recipes[0]).data, "label_smoothing", 0.0) or 0.1
    if not 0 <= epsilon < 1:
        raise UserError(f"--epsilon must be in [0, 1), got {epsilon}")
    one_hot = np.zeros(10)
    one_hot[3] = 1.0
    return ScheduleResult(curves, epsilon, 3, 0, one_hot, smoothed_target(epsilon))


def draw_schedule(r: ScheduleResult, out) -> None:
    fig = new_figure(5.0 * (len(r.curves) + 1), 4.2)
    axes = fig.subplots(1, len(r.curves) + 1)
    for ax, c in zip(axes, r.curves):
        ax.plot(c.steps, c.lr, color="#264653")
        ax.axvspan(0, c.warmup_steps, color="#f4a261", alpha=0.25, label=f"warm-up ({c.warmup_steps} steps)")
        step, peak = c.peak
        ax.annotate(f"peak {peak:.2e}\nat step {step}", (step, peak), xytext=(12, -28), textcoords="offset points",
                    fontsize=8, arrowprops={"arrowstyle": "->", "lw": 0.6})
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("learning rate")
        formula = "noam: d^-0.5·min(s^-0.5, s·w^-1.5)" if c.schedule == "noam" else f"{c.schedule}"
        ax.set_title(f"{c.recipe} ({formula})", fontsize=9)
        ax.legend(fontsize=7, title=", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}"
                                              for k, v in c.settings.items()), title_fontsize=7)
        ax.grid(alpha=0.3)
    ax = axes[-1]
    x = np.arange(len(r.one_hot))
    ax.bar(x - 0.2, r.one_hot, 0.4, color="#adb5bd", label="one-hot target")
    ax.bar(x + 0.2, r.smoothed, 0.4, color="#2a9d8f", label=f"label-smoothed, ε = {r.epsilon:g}")
    for xi, v in zip(x, r.smoothed):
        ax.text(xi + 0.2, v + 0.02, f"{abs(v):.3f}", ha="center", fontsize=6, rotation=90)
    ax.set_xticks(x, ["pad" if i == r.pad_id else ("y" if i == r.target else str(i)) for i in x])
    ax.set_xlabel("token id (a 10-token vocabulary; y = the reference token)")
    ax.set_ylabel("target probability")
    ax.set_ylim(0, 1.15)
    ax.set_title("label smoothing (from the loss's gradient)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    finish(fig, "Learning-rate schedules and label smoothing", r.caption, out)
