"""The one registry of model families, keyed by the run's `model_type` (config.json's "model_type",
each model config's `model_type`), and the one vocabulary of model kinds: each family's Task states
its kind (tasks/kinds.py) and what it can do (quantize, export to Hugging Face / GGUF, serve,
classify, load a HF directory). load.py, convert.py, embed.py, the pictures and the command line
ask these tasks; none of them lists kinds or model types of its own.

Adding a family (README, "Adding a model family"): its model (models/), a task (tasks/: a Task
subclass, or a LanguageModelTask for a next-token model), a recipe (recipes/), one line in TASKS,
and its interop file when it has a Hugging Face form.
"""
from __future__ import annotations

from pathlib import Path

from attnlab.errors import UserError
from attnlab.interop.hf import load_hf, save_hf
from attnlab.interop.hf_config import MODEL_TYPES as GPT_HF_TYPES
from attnlab.interop.hf_mamba import MODEL_TYPE as MAMBA_HF_TYPE, load_mamba_hf, save_mamba_hf
from attnlab.jsonfile import read_json
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.mamba import Mamba, MambaConfig
from attnlab.tasks.base import Task
from attnlab.tasks.finetune import FinetuneTask
from attnlab.tasks.language_model import HFForm, LanguageModelTask
from attnlab.tasks.loaded import LoadedModel
from attnlab.tasks.text_classification import BertTask
from attnlab.tasks.translation import TranslationTask
from attnlab.tasks.vision import VisionTask
from attnlab.train.run_dir import ADAPTER_CONFIG, WEIGHTS, check_model_dir, is_run_dir

TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Add a family to the registry under its model_type (a later one of the same type replaces it).

    Raises:
        UserError: for a task whose HF model types another family already reads.
    """
    taken = {t: other.model_type for other in TASKS.values() if other.model_type != task.model_type
             for t in other.hf_model_types}
    clash = sorted(set(task.hf_model_types) & set(taken))
    if clash:
        raise UserError(f"{task.model_type}: HF model_type {clash[0]!r} is read by {taken[clash[0]]} already")
    TASKS[task.model_type] = task
    return task


_GPT = LanguageModelTask(GPT, GPTConfig, HFForm(tuple(GPT_HF_TYPES.values()), load_hf, save_hf),  # GPT-2 ... Mixtral
                         quantizable=True, gguf=True, servable=True)
for _task in (
    TranslationTask(),
    _GPT,
    LanguageModelTask(Mamba, MambaConfig, HFForm((MAMBA_HF_TYPE,), load_mamba_hf, save_mamba_hf),
                      description="a Mamba (state-space) model", has_attention=False, servable=True),
    BertTask(),
    VisionTask(),
    FinetuneTask(_GPT),  # LoRA / full fine-tunes of a pretrained GPT; PEFT adapter directories
):
    register(_task)


def get_task(model_type: str) -> Task:
    """The task of runs of `model_type`.

    Raises:
        UserError: for an unknown model_type, listing the known ones.
    """
    if model_type not in TASKS:
        raise UserError(f"unknown model_type {model_type!r}; known: {', '.join(sorted(TASKS))}")
    return TASKS[model_type]


def task_of_recipe(recipe) -> Task:
    """The task that trains `recipe` (recipes.Recipe), from its model config's model_type."""
    return get_task(recipe.model.model_type)


def task_of_run(path: str | Path) -> Task:
    """The task of the trained run directory `path`, from its config.json's model_type.

    Raises:
        FileNotFoundError: naming what is missing. UserError: for a damaged config.json or an
            unknown model_type (naming the file).
    """
    path = Path(path)
    check_model_dir(path, ("config.json", WEIGHTS))
    model_type = read_json(path / "config.json").get("model_type")
    try:
        return get_task(str(model_type))
    except UserError as e:
        raise UserError(f"{path / 'config.json'}: {e}") from None


def task_of_hf(path: Path) -> Task:
    """The family that reads the Hugging Face model directory `path`, from its config.json's model_type.

    Raises:
        FileNotFoundError: no config.json. UserError: a model_type no family reads (listing those read).
    """
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json")
    model_type = read_json(path / "config.json").get("model_type")
    for task in TASKS.values():
        if model_type in task.hf_model_types:
            return task
    known = sorted(t for task in TASKS.values() for t in task.hf_model_types)
    raise UserError(f"{path / 'config.json'}: model_type {model_type!r} is not supported; supported: {', '.join(known)}")


def gguf_task() -> Task:
    """The family that reads GGUF files (the LLaMA-family GPT)."""
    return next(task for task in TASKS.values() if task.gguf)


def adapter_task() -> Task:
    """The family that reads PEFT adapter directories (fine-tunes)."""
    return next(task for task in TASKS.values() if task.reads_adapters)


def task_of_path(path: Path) -> Task:
    """The family of a GGUF file, one of our run directories, a PEFT adapter directory (adapter_config.json,
    no run) or a HF model directory, without loading it.

    Raises:
        FileNotFoundError, UserError: naming what is missing or not supported.
    """
    if path.is_file():
        return gguf_task()
    if not path.is_dir():
        raise FileNotFoundError(f"no such model file or directory: {path}")
    if is_run_dir(path):
        return task_of_run(path)
    return adapter_task() if (path / ADAPTER_CONFIG).is_file() else task_of_hf(path)


def load_run(path: str | Path) -> LoadedModel:
    """Load any trained run directory: a LoadedModel (model in eval mode, tokenizer, task, config)."""
    return task_of_run(path).load(path)


def evaluate_run(path: str | Path, split: str | None = None, limit: int | None = None, **options) -> dict:
    """Score any trained run directory on `split` with its task's metrics (one JSON-able dict):
    sacreBLEU (translation), val_loss / perplexity / bits_per_byte (language models), accuracy
    (classifiers). Options: beam (translation), dtype (language models)."""
    return task_of_run(path).evaluate(path, split, limit, **options)
