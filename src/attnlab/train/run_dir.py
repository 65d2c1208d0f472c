"""Run directories: what a new run may overwrite, its one writer (a lock), the saved config.json, the
files a trained model directory must hold, and putting a resumed run directory back in the state
its checkpoint describes. Shared by every task (tasks/base.py) and the loop.

A run directory holds config.json ({"model_type", "recipe", "model", "data", "train", and a task's
own entries}), model.safetensors (best weights), tokenizer.json (tasks with text), metrics.jsonl,
checkpoint/ (for --resume, train/checkpoint.py), snapshots/ when the last checkpoints are averaged,
and .lock (held by the process training into it). A LoRA run's directory is a PEFT adapter directory
too: adapter_config.json (written when the run starts) marks it, and its best weights are the
adapter, adapter_model.safetensors, instead of model.safetensors (weights_path).
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import Iterator

from attnlab.errors import UserError, naming
from attnlab.files import atomic_link, committed_directory, remove_temporaries
from attnlab.jsonfile import read_json, write_json_atomic
from attnlab.train.checkpoint import BEST_FILE, read_state
from attnlab.train.state import TrainState

log = logging.getLogger("attnlab")

CHECKPOINT_DIR = "checkpoint"   # resumable state inside a run directory
WEIGHTS = "model.safetensors"   # the best weights of a run
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # a LoRA run's (PEFT's
                                # names: interop/peft.py writes them)
SNAPSHOT_DIR = "snapshots"      # weights of the last checkpoints, for averaging
LOCK_FILE = ".lock"             # flock'ed by the one process that writes the run directory


class RunDirInUse(OSError):
    """Another process holds the run directory's lock (str(): one line naming it)."""


@contextlib.contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """Hold the exclusive lock of run directory `out` (created if missing): fcntl.flock on out/.lock,
    which the OS releases when the process ends, even by kill -9, so no stale lock outlives a run.

    Raises:
        RunDirInUse: at once, naming the directory and the process holding it.
    """
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise naming(RunDirInUse(f"out={out} is being written by another training (process {holder}); wait "
                                     f"for it to end or choose another run directory"), "out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def has_checkpoint(out: Path) -> bool:
    """Whether `out` holds a resumable checkpoint (also one a crash left aside mid-replacement)."""
    folder = committed_directory(out / CHECKPOINT_DIR)
    return folder is not None and (folder / "state.json").is_file()


def weights_path(out: Path) -> Path:
    """The file of a run directory's best weights: adapter_model.safetensors in a LoRA run (one with
    adapter_config.json), else model.safetensors."""
    return out / (ADAPTER_WEIGHTS if (out / ADAPTER_CONFIG).is_file() else WEIGHTS)


def _has_weights(out: Path) -> bool:
    return (out / WEIGHTS).is_file() or (out / ADAPTER_WEIGHTS).is_file()


def has_run(out: Path) -> bool:
    """Whether `out` holds trained weights or a resumable checkpoint (the things a rerun would lose)."""
    return has_checkpoint(out) or _has_weights(out)


def check_out_dir(out: Path, resume: bool) -> None:
    """Refuse an `out` that is a file, one that already holds a run (without resume), or a resume
    with nothing to resume; each message says what works instead.

    Raises:
        FileExistsError, FileNotFoundError: saying what to do instead.
    """
    if out.exists() and not out.is_dir():
        raise naming(FileExistsError(f"out={out} is a file, not a run directory"), "out")
    weights = _has_weights(out)
    if resume and not has_checkpoint(out):
        if weights:
            raise naming(FileNotFoundError(f"nothing to resume: out={out} holds trained weights but no {CHECKPOINT_DIR}/; "
                                           f"choose another run directory, or delete {out} to train it again"), "out")
        started = " (the run stopped before its first checkpoint)" if (out / "config.json").is_file() else ""
        raise naming(FileNotFoundError(f"nothing to resume: out={out} has no checkpoint{started}; start it without "
                                       f"resume=True"), "out", "resume")
    if not resume and has_checkpoint(out):
        raise naming(FileExistsError(f"out={out} already holds a run; pass resume=True to continue it or choose another "
                                     f"run directory"), "out", "resume")
    if not resume and weights:
        raise naming(FileExistsError(f"out={out} holds trained weights ({weights_path(out).name}) but no {CHECKPOINT_DIR}/ to "
                                     f"resume from; choose another run directory, or delete {out} to train it again"),
                     "out")


def check_resume_recipe(saved: dict, recipe_name: str, out: Path) -> None:
    """Refuse to resume a run under a recipe other than the one it was trained with."""
    if saved.get("recipe") not in (None, recipe_name):
        raise UserError(f"{out} was trained with recipe {saved['recipe']!r}, not {recipe_name!r}; resume it with "
                        f"recipe={saved['recipe']}", param="recipe")


def read_run_config(path: Path, model_type: str | None = None) -> dict:
    """The config.json of run directory `path`, checked for its sections (and its model_type).

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    saved = read_json(path / "config.json")
    if model_type is not None and saved.get("model_type") != model_type:
        raise UserError(f"{path / 'config.json'}: model_type is {saved.get('model_type')!r}, expected {model_type!r}")
    missing = [k for k in ("model", "data", "train") if not isinstance(saved.get(k), dict)]
    if missing:
        raise UserError(f"{path / 'config.json'}: missing section(s) {missing}")
    return saved


def is_run_dir(path: Path) -> bool:
    """Whether `path` is one of our run directories (config.json with a "model" section), as opposed
    to a Hugging Face model directory."""
    if not (path / "config.json").is_file():
        return False
    return isinstance(read_json(path / "config.json").get("model"), dict)


def _missing_weights_advice(path: Path) -> str | None:
    """What to do about a run directory whose best weights are missing, when its checkpoint can
    help (None otherwise)."""
    folder = committed_directory(path / CHECKPOINT_DIR)
    if folder is None or not (folder / "state.json").is_file():
        return None
    name = weights_path(path).name
    try:
        state, recipe = read_state(folder), read_json(path / "config.json").get("recipe") or "RECIPE"
    except (OSError, ValueError) as e:
        return f"{path} has no {name} and its checkpoint is unreadable ({e})"
    resume = f"attnlab train --recipe {recipe} --out {path} --resume"
    if state.best is None:
        return (f"{path} has no evaluated weights yet ({name} is written at the first evaluation); "
                f"continue training it with: {resume}")
    if (folder / BEST_FILE).is_file():
        budget = f" --steps {state.step}" if state.end == "done" else ""
        return f"{path}/{name} is missing; restore it from the checkpoint with: {resume}{budget}"
    return (f"{path}/{name} is missing and its checkpoint holds no copy of the best weights (a run from "
            f"an older attnlab); the last weights (step {state.step}) are in {folder}/model.safetensors")


def check_model_dir(path: Path, files: tuple[str, ...] = ("config.json", WEIGHTS, "tokenizer.json")) -> None:
    """Raise FileNotFoundError naming what is missing unless `path` is a trained model directory
    holding `files` (the best weights under their name: weights_path); for missing weights that
    the checkpoint can restore, the command that does."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory (expected a trained model directory)")
    weights = weights_path(path)
    if (path / "config.json").is_file() and not weights.is_file():
        advice = _missing_weights_advice(path)
        if advice:
            raise FileNotFoundError(advice)
    for name in files:
        name = weights.name if name == WEIGHTS else name
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path} is not a trained model directory: {name} is missing")


def start_run_dir(out: Path, config: dict) -> None:
    """Create a new run directory with its config.json (a stale metrics.jsonl and what a run killed
    before its first checkpoint left are removed). Call it only once every setting has been checked,
    so that a refused run writes nothing, and holding the run's lock."""
    out.mkdir(parents=True, exist_ok=True)
    remove_temporaries(out)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    write_json_atomic(out / "config.json", config)


def snapshot_path(out: Path, step: int) -> Path:
    return out / SNAPSHOT_DIR / f"step_{step:08d}.safetensors"


def snapshot_steps(out: Path) -> list[int]:
    """The steps of the snapshot files in out/snapshots/, in order."""
    return sorted(int(p.stem[len("step_"):]) for p in (out / SNAPSHOT_DIR).glob("step_*.safetensors")
                  if p.stem[len("step_"):].isdigit())


def take_snapshot(out: Path, step: int, keep: list[int]) -> None:
    """Make snapshots/ hold the steps `keep` (the checkpoint's list, ending with `step`): the new one
    is a hard link of the checkpoint's weights, those no longer listed are deleted."""
    atomic_link(out / CHECKPOINT_DIR / "model.safetensors", snapshot_path(out, step))
    for old in set(snapshot_steps(out)) - set(keep):
        snapshot_path(out, old).unlink(missing_ok=True)


def align_with_checkpoint(out: Path, state: TrainState) -> None:
    """Put run directory `out` back in the state its checkpoint describes, undoing whatever a killed
    or interrupted run wrote after it (a resume then replays those steps exactly): temporary files
    removed, metrics.jsonl cut to state.metrics_bytes (when something else cut it shorter, to its last
    whole line, with a warning), the best weights (weights_path) = the checkpoint's
    best.safetensors (removed when nothing was evaluated yet), snapshots/ = state.snapshots (the
    checkpoint's own step re-linked from its weights when a kill fell before the link).
    Call it holding the run's lock.

    Raises:
        FileNotFoundError: naming a listed snapshot that is missing and cannot be re-made.
    """
    for folder in (out, out / SNAPSHOT_DIR):
        remove_temporaries(folder)
    metrics = out / "metrics.jsonl"
    if state.metrics_bytes is not None and metrics.is_file():
        size = metrics.stat().st_size
        if size > state.metrics_bytes:
            os.truncate(metrics, state.metrics_bytes)
        elif size < state.metrics_bytes:  # cut by something else: new records must not join a cut line
            keep = metrics.read_bytes().rfind(b"\n") + 1
            os.truncate(metrics, keep)
            log.warning("%s is %d bytes, shorter than the %d its checkpoint recorded (cut outside this run): kept "
                        "its %d bytes of whole lines; the records lost from it are not written again",
                        metrics, size, state.metrics_bytes, keep)
    best, weights = out / CHECKPOINT_DIR / BEST_FILE, weights_path(out)
    if best.is_file() and not (weights.is_file() and os.path.samefile(best, weights)):
        atomic_link(best, weights)
    elif not best.is_file() and state.best is None:
        weights.unlink(missing_ok=True)
    if state.snapshots is None:  # a checkpoint from before snapshots were listed: the files decide
        state.snapshots = [s for s in snapshot_steps(out) if s <= state.step]
    for step in state.snapshots:
        if not snapshot_path(out, step).is_file():
            if step != state.step:
                raise FileNotFoundError(f"{snapshot_path(out, step)} is missing: the final average of this run needs "
                                        f"it (checkpoint/state.json lists steps {state.snapshots})")
            atomic_link(out / CHECKPOINT_DIR / "model.safetensors", snapshot_path(out, step))
    for extra in set(snapshot_steps(out)) - set(state.snapshots):
        snapshot_path(out, extra).unlink()
