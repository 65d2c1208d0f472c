"""Shared by the training-step benches (train_step.py, lm_step_ratio.py): a recipe's prepared run,
its first batches grouped as one optimizer step each, and Trainers on it (train/loop.py), built as
`attnlab train` builds them but without a run directory of their own beyond `root`."""
from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.tasks.base import RunSpec
from attnlab.tasks.registry import task_of_recipe
from attnlab.train.loop import Trainer


def add_heap_argument(ap: argparse.ArgumentParser) -> None:
    """--malloc-mmap-threshold, for train/host_memory.py heap_setup (the process as `attnlab train` sets it up)."""
    ap.add_argument("--malloc-mmap-threshold", type=int,
                    help="bytes, fixed before building a model (default: as attnlab train, a kept heap here; "
                    "0 = glibc's dynamic threshold)")


def prepare(recipe, root: Path):
    """(task, prepared): the recipe's task and its prepared run (tasks.base.Prepared) under root/prepare."""
    task = task_of_recipe(recipe)
    spec = RunSpec(root / "prepare", False, recipe.name, recipe.model, recipe.data, recipe.train, None)
    return task, task.prepare(spec)


def windows(recipe, prepared, n: int) -> list[list]:
    """The first n optimizer steps' batches of epoch 0 (grad_accum_steps batches each)."""
    group = recipe.train.grad_accum_steps
    batches = prepared.objective.batches(0)
    return [batches[i:i + group] for i in range(0, group * n, group)]


def build_trainer(task, prepared, train_cfg, out: Path, state: dict | None = None) -> Trainer:
    """A Trainer of a freshly built model (weights from `state` when given) with train_cfg, writing to out."""
    model = task.build_model(prepared.model_cfg)
    if state is not None:
        model.load_state_dict(state)
    return Trainer(model, prepared.objective, train_cfg, out, getattr(prepared.model_cfg, "d_model", 1))
