"""The end of a training run, as stages recorded in the checkpoint (state.end), so that a kill at any
instant resumes at the stage it interrupted and ends with exactly the uninterrupted result:

    1. final evaluation (unless the last step was just evaluated), then a checkpoint with its
       snapshot (TrainConfig.average_last)                                        -> end "evaluated"
    2. the average of the listed snapshots, evaluated; the trained weights restored; a checkpoint
                                                                                  -> end "done"

A kill inside a stage leaves the checkpoint of the stage before: the resume puts the run directory
back as that checkpoint describes (best weights, metrics, snapshots) and redoes the stage, which is
deterministic. A resumed "done" run with no budget left only reports its record.
"""
from __future__ import annotations

import signal
from pathlib import Path

import torch

from attnlab.train.checkpoint import load_weights
from attnlab.train.guards import TrainingInterrupted
from attnlab.train.run_dir import snapshot_path


def average_snapshots(model: torch.nn.Module, paths: list[Path]) -> None:
    """Set model's parameters to the mean of the safetensors weights at `paths` (Vaswani et al. 2017,
    §6.1: the base model averages the last 5 checkpoints)."""
    total = None
    for p in paths:
        load_weights(model, p)
        sd = {k: v.detach().clone().double() for k, v in model.state_dict().items()}
        total = sd if total is None else {k: total[k] + sd[k] for k in total}
    model.load_state_dict({k: (v / len(paths)).float() for k, v in total.items()})


def evaluate_average(trainer) -> dict | None:
    """Evaluate the average of the trainer's listed snapshots (kept as the best weights when it is
    better), then put the trained weights back; None with fewer than two snapshots."""
    steps = trainer.state.snapshots if trainer.cfg.average_last else []
    if len(steps) < 2:
        return None
    if trainer.main:  # the one process that evaluates (several processes: train/loop.py)
        trained = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        average_snapshots(trainer.model, [snapshot_path(trainer.out, s) for s in steps])
    record = trainer._evaluate(averaged=[snapshot_path(trainer.out, s).stem for s in steps])
    if trainer.main:
        trainer.model.load_state_dict(trained)
    return record


def finish(trainer) -> dict:
    """Run the end-of-run stages the trainer's state has not recorded yet (module docstring).

    Args:
        trainer: the train/loop.py Trainer whose budget has run out.
    Returns:
        the final record (the average's evaluation when there is one), with "best" and "best_step".
    Raises:
        guards.TrainingInterrupted: when a stop signal arrived (after the stage's checkpoint).
    """
    s = trainer.state
    if s.end is None:
        if s.last_eval is None or s.last_eval["step"] != s.step:
            trainer._evaluate()
        s.end = "evaluated"
        trainer._save(snapshot=bool(trainer.cfg.average_last))
        if trainer.stop_requested():
            raise TrainingInterrupted(trainer.signals.signum or signal.SIGTERM)
    if s.end == "evaluated":
        evaluate_average(trainer)
        s.end = "done"
        trainer._save()
    return {**s.last_eval, "best": s.best, "best_step": s.best_step}
