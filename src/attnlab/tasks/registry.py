"""The one registry of task families, keyed by the run's `model_type` (config.json's "model_type",
each model config's `model_type`). The CLI, evaluate, classify, the model loaders and convert
dispatch through it. Adding a family: its model (models/), one task module (tasks/), one line here.
"""
from __future__ import annotations

from pathlib import Path

from attnlab.interop.hf_mamba import save_mamba_hf
from attnlab.jsonfile import read_json
from attnlab.models.mamba import Mamba, MambaConfig
from attnlab.tasks.base import Run, Task
from attnlab.tasks.finetune import FinetuneTask
from attnlab.tasks.language_model import LanguageModelTask
from attnlab.tasks.text_classification import BertTask
from attnlab.tasks.translation import TranslationTask
from attnlab.tasks.vision import VisionTask
from attnlab.train.run_dir import WEIGHTS, check_model_dir

TASKS: dict[str, Task] = {task.model_type: task for task in (
    TranslationTask(),
    LanguageModelTask(),                                            # "gpt": GPT-2 ... LLaMA, Mistral, Mixtral
    LanguageModelTask("mamba", Mamba, MambaConfig, export=save_mamba_hf),  # selective state-space LM
    BertTask(),
    VisionTask(),
    FinetuneTask(),                                                 # LoRA / full fine-tunes of a pretrained GPT
)}


def get_task(model_type: str) -> Task:
    """The task of runs of `model_type`.

    Raises:
        ValueError: for an unknown model_type, listing the known ones.
    """
    if model_type not in TASKS:
        raise ValueError(f"unknown model_type {model_type!r}; known: {', '.join(sorted(TASKS))}")
    return TASKS[model_type]


def task_of_recipe(recipe) -> Task:
    """The task that trains `recipe` (recipes.Recipe), from its model config's model_type."""
    return get_task(recipe.model.model_type)


def task_of_run(path: str | Path) -> Task:
    """The task of the trained run directory `path`, from its config.json's model_type.

    Raises:
        FileNotFoundError: naming what is missing. ValueError: for a damaged config.json or an
            unknown model_type (naming the file).
    """
    path = Path(path)
    check_model_dir(path, ("config.json", WEIGHTS))
    model_type = read_json(path / "config.json").get("model_type")
    try:
        return get_task(str(model_type))
    except ValueError as e:
        raise ValueError(f"{path / 'config.json'}: {e}") from None


def load_run(path: str | Path) -> Run:
    """Load any trained run directory: Run(model (eval mode), tokenizer, config, path)."""
    return task_of_run(path).load(path)


def evaluate_run(path: str | Path, split: str | None = None, limit: int | None = None, **options) -> dict:
    """Score any trained run directory on `split` with its task's metrics (one JSON-able dict):
    sacreBLEU (translation), val_loss / perplexity / bits_per_byte (language models), accuracy
    (classifiers). Options: beam (translation)."""
    return task_of_run(path).evaluate(path, split, limit, **options)
