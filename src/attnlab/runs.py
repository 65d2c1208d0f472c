"""Run directories shared by every task: what a new run may overwrite, the saved config.json, and
the files a trained model directory must hold.

A run directory holds config.json ({"model_type", "recipe", "model", "data", "train"}),
model.safetensors (best weights), tokenizer.json, metrics.jsonl and checkpoint/ (for --resume).
"""
from __future__ import annotations

from pathlib import Path

import torch

from attnlab.jsonfile import read_json, write_json_atomic
from attnlab.train.loop import CHECKPOINT_DIR, Trainer


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


def model_type(path: Path) -> str:
    """The model_type of the trained model directory `path` ("seq2seq", "gpt", "bert", "vit")."""
    check_model_dir(path, ("config.json", "model.safetensors"))
    return str(read_json(path / "config.json").get("model_type"))


def resumed_train_config(saved_train: dict, recipe):
    """A resumed run's TrainConfig: its saved settings with the budgets (totals) of `recipe.train`."""
    from attnlab.train.config import TrainConfig

    return TrainConfig.from_dict({**saved_train, "max_steps": recipe.train.max_steps, "minutes": recipe.train.minutes})


def run_settings(out: Path, recipe, resume: bool, saved_configs) -> tuple:
    """The settings a training run uses, the first step of every task's train function.

    Checks `out` (check_out_dir). A resumed run takes its own saved settings, read by
    `saved_configs(out) -> (config.json dict, model config, data config, saved train dict)`, after
    checking it was trained with `recipe`, with recipe.train's budgets (resumed_train_config); a new
    run takes the recipe's. Sets torch's intra-op threads when the train config names a number.

    Returns:
        (the saved config.json dict, or None for a new run; model config; data config; TrainConfig).
    Raises:
        as check_out_dir, check_resume_recipe and saved_configs.
    """
    check_out_dir(out, resume)
    if resume:
        saved, model_cfg, data_cfg, saved_train = saved_configs(out)
        check_resume_recipe(saved, recipe.name, out)
        train_cfg = resumed_train_config(saved_train, recipe)
    else:
        saved, model_cfg, data_cfg, train_cfg = None, recipe.model, recipe.data, recipe.train
    if train_cfg.threads:
        torch.set_num_threads(train_cfg.threads)
    return saved, model_cfg, data_cfg, train_cfg


def start_run_dir(out: Path, config: dict) -> None:
    """Create a new run directory with its config.json (a stale metrics.jsonl is removed). Call it only
    once every setting has been checked, so that a refused run writes nothing."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    write_json_atomic(out / "config.json", config)


def fit(model, task, train_cfg, out: Path, resume: bool, rate_key: str = "tokens_per_s") -> dict:
    """Train with the shared loop (resuming from out/checkpoint when asked) and return the final
    record with "parameters", "steps" and the training rate under `rate_key` (units the task's
    loss counts: tokens, sentences or images per second)."""
    trainer = Trainer(model, task, train_cfg, out, getattr(model.cfg, "d_model", 512))
    if resume:
        trainer.resume()
    record = trainer.fit()
    s = trainer.state
    return {**record, "parameters": sum(p.numel() for p in model.parameters()), "steps": s["step"],
            rate_key: round(s["tokens"] / max(s["elapsed_s"], 1e-9), 1)}
