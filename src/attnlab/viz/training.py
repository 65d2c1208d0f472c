"""training: curves from runs' metrics.jsonl (train loss, validation loss, BLEU or accuracy, learning
rate), several runs overlaid."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.errors import UserError
from attnlab.viz.figure import finish, new_figure

QUALITY = ("val_bleu", "accuracy", "bits_per_byte", "mlm_accuracy")  # first one a run has is drawn


@dataclass
class RunCurves:
    name: str                                   # the run directory's name
    train: dict[str, list] = field(default_factory=dict)   # "step", "loss", "lr", "elapsed_s"
    val: dict[str, list] = field(default_factory=dict)     # "step", "val_loss", quality key, "elapsed_s"
    quality: str | None = None                  # which QUALITY key the run reports
    averaged: list[dict] = field(default_factory=list)     # evaluations of averaged weights


def read_metrics(run_dir: str | Path) -> RunCurves:
    """The log and evaluation records of a run's metrics.jsonl.

    Raises:
        ValueError: the file is missing (naming it), or a line is not a JSON object (naming it).
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path} not found: the training figure reads a run's metrics.jsonl (a run directory "
                        f"made by attnlab train)")
    curves = RunCurves(Path(run_dir).resolve().name)
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if not isinstance(rec, dict):
            raise UserError(f"{path} line {n} is not a JSON object")
        if "averaged" in rec:
            curves.averaged.append(rec)
        elif "loss" in rec:
            for key in ("step", "loss", "lr", "elapsed_s"):
                curves.train.setdefault(key, []).append(rec.get(key))
        elif "val_loss" in rec or any(k in rec for k in QUALITY):
            curves.quality = curves.quality or next((k for k in QUALITY if k in rec), None)
            for key in ("step", "val_loss", "elapsed_s", *QUALITY):
                curves.val.setdefault(key, []).append(rec.get(key))
    return curves


def training_curves(run_dirs: list[str]) -> list[RunCurves]:
    """Curves of every run in `run_dirs`. Raises ValueError as read_metrics, or for no runs."""
    if not run_dirs:
        raise UserError("the training figure needs at least one run directory (--runs DIR ...)")
    return [read_metrics(d) for d in run_dirs]


def caption(runs: list[RunCurves]) -> str:
    parts = []
    for r in runs:
        if r.val.get("val_loss"):
            best = min(v for v in r.val["val_loss"] if v is not None)
            parts.append(f"{r.name}: best validation loss {best:.3f} after {r.val['step'][-1]} steps")
    return ("Training loss (line) and validation loss (dots) fall as the steps go by; the learning rate follows "
            "the schedule. " + "; ".join(parts) + ".")


def draw_training(runs: list[RunCurves], out) -> None:
    qualities = sorted({r.quality for r in runs if r.quality})
    panels = 2 + len(qualities)
    fig = new_figure(4.6 * panels, 4.0)
    axes = fig.subplots(1, panels)
    loss_ax, lr_ax, quality_axes = axes[0], axes[-1], dict(zip(qualities, axes[1:-1]))
    for k, r in enumerate(runs):
        color = f"C{k}"
        if r.train:
            loss_ax.plot(r.train["step"], r.train["loss"], color=color, lw=1, alpha=0.8, label=f"{r.name} train")
            lr_ax.plot(r.train["step"], r.train["lr"], color=color, label=r.name)
        if r.val.get("val_loss"):
            loss_ax.plot(r.val["step"], r.val["val_loss"], "o", color=color, ms=4, label=f"{r.name} validation")
        if r.quality:
            ax = quality_axes[r.quality]
            ax.plot(r.val["step"], r.val[r.quality], "o-", color=color, ms=4, label=r.name)
            averaged = [(rec["step"], rec[r.quality]) for rec in r.averaged if rec.get(r.quality) is not None]
            if averaged:
                ax.plot(*zip(*averaged), "*", color=color, ms=10, label=f"{r.name}, averaged weights")
    loss_ax.set_ylabel("loss (nats per token)")
    loss_ax.set_title("loss", fontsize=9)
    for q, ax in quality_axes.items():
        ax.set_ylabel(q.replace("_", " "))
        ax.set_title(q.replace("_", " "), fontsize=9)
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_title("learning rate", fontsize=9)
    for ax in axes:
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    finish(fig, "Training curves (metrics.jsonl)", caption(runs), out)
