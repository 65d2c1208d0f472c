"""Run directories: what a new run may overwrite, the saved config.json, and the files a trained model
directory must hold. Shared by every task (tasks/base.py) and the loop.

A run directory holds config.json ({"model_type", "recipe", "model", "data", "train", and a task's
own entries}), model.safetensors (best weights), tokenizer.json (tasks with text), metrics.jsonl and
checkpoint/ (for --resume), snapshots/ when the last checkpoints are averaged.
"""
from __future__ import annotations

from pathlib import Path

from attnlab.jsonfile import read_json, write_json_atomic

CHECKPOINT_DIR = "checkpoint"   # resumable state inside a run directory
SNAPSHOT_DIR = "snapshots"      # weights of the last checkpoints, for averaging


def has_run(out: Path) -> bool:
    """Whether `out` holds trained weights or a resumable checkpoint (the things a rerun would lose)."""
    return (out / CHECKPOINT_DIR / "state.json").is_file() or (out / "model.safetensors").is_file()


def check_out_dir(out: Path, resume: bool) -> None:
    """Refuse an `out` that is a file, one that already holds a run (without resume), or a resume
    with nothing to resume.

    Raises:
        FileExistsError, FileNotFoundError: saying what to do instead.
    """
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a run directory")
    if resume and not (out / CHECKPOINT_DIR / "state.json").is_file():
        raise FileNotFoundError(f"nothing to resume: {out / CHECKPOINT_DIR} has no checkpoint")
    if not resume and has_run(out):
        raise FileExistsError(f"{out} already holds a run; pass --resume to continue it or choose another --out")


def check_resume_recipe(saved: dict, recipe_name: str, out: Path) -> None:
    """Refuse to resume a run under a recipe other than the one it was trained with."""
    if saved.get("recipe") not in (None, recipe_name):
        raise ValueError(f"{out} was trained with recipe {saved['recipe']!r}, not {recipe_name!r}; resume it with "
                         f"--recipe {saved['recipe']}")


def read_run_config(path: Path, model_type: str | None = None) -> dict:
    """The config.json of run directory `path`, checked for its sections (and its model_type).

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    saved = read_json(path / "config.json")
    if model_type is not None and saved.get("model_type") != model_type:
        raise ValueError(f"{path / 'config.json'}: model_type is {saved.get('model_type')!r}, expected {model_type!r}")
    missing = [k for k in ("model", "data", "train") if not isinstance(saved.get(k), dict)]
    if missing:
        raise ValueError(f"{path / 'config.json'}: missing section(s) {missing}")
    return saved


def is_run_dir(path: Path) -> bool:
    """Whether `path` is one of our run directories (config.json with a "model" section), as opposed
    to a Hugging Face model directory."""
    if not (path / "config.json").is_file():
        return False
    return isinstance(read_json(path / "config.json").get("model"), dict)


def check_model_dir(path: Path, files: tuple[str, ...] = ("config.json", "model.safetensors", "tokenizer.json")
                    ) -> None:
    """Raise FileNotFoundError naming what is missing unless `path` is a trained model directory
    holding `files`."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory (expected a trained model directory)")
    if (path / "config.json").is_file() and not (path / "model.safetensors").is_file() \
            and (path / CHECKPOINT_DIR).is_dir():
        raise FileNotFoundError(f"{path} has no evaluated weights yet (model.safetensors is written at the first "
                                f"evaluation); continue training it with: attnlab train --recipe RECIPE --out {path} --resume")
    for name in files:
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path} is not a trained model directory: {name} is missing")


def start_run_dir(out: Path, config: dict) -> None:
    """Create a new run directory with its config.json (a stale metrics.jsonl is removed). Call it only
    once every setting has been checked, so that a refused run writes nothing."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    write_json_atomic(out / "config.json", config)
