"""The pretrained model a fine-tune starts from: found by what users would pass (a pretrained name,
a .gguf file, a Hugging Face model directory, or one of our GPT run directories) and loaded by its
family (the registry's GPT task) with its tokenizer and chat template, at the precision the frozen
base is kept at.
"""
from __future__ import annotations

from pathlib import Path

from attnlab.errors import UserError
from attnlab.jsonfile import read_json
from attnlab.nn.quant_linear import check_dtype, set_dtype
from attnlab.pretrained import NAMED, resolve
from attnlab.tasks.base import Task
from attnlab.tasks.loaded import LoadedModel
from attnlab.train.run_dir import is_run_dir

TOKENIZER_CONFIG = "tokenizer_config.json"  # transformers' file: the chat template and special tokens


def base_name(name_or_path: str) -> str:
    """How a run records its base: a pretrained name as it is, a path made absolute (a run is used
    from other directories)."""
    return name_or_path if name_or_path in NAMED else str(Path(name_or_path).resolve())


def read_chat_template(folder: Path) -> str | None:
    """The chat template in a directory's tokenizer_config.json (None without one).

    Raises:
        UserError: for a template that is not one string (transformers' named templates).
    """
    path = folder / TOKENIZER_CONFIG
    template = read_json(path).get("chat_template") if path.is_file() else None
    if template is not None and not isinstance(template, str):
        raise UserError(f"{path}: chat_template must be one Jinja template string (named templates are not "
                        f"supported), got {type(template).__name__}")
    return template


def load_base(name_or_path: str, dtype: str, family: Task) -> LoadedModel:
    """Load the model a fine-tune starts from with `family` (the GPT task: its GGUF, HF and run
    readers) at `dtype` (nn.quant_linear.DTYPES: "auto" keeps a GGUF file's blocks as stored, a
    scheme quantizes; quantized weights are QLoRA's frozen base).

    Raises:
        FileNotFoundError: naming what is missing (a named model's package, with its pip command).
        UserError: an unsupported dtype, or a model that is not of `family` (a BERT, a Mamba ...).
    """
    check_dtype(dtype)
    path = resolve(name_or_path)
    if path.is_file():
        return family.load_gguf(path, dtype)
    if is_run_dir(path):
        model_type = read_json(path / "config.json").get("model_type")
        if model_type != family.model_type:
            raise UserError(f"base={name_or_path}: a {model_type} run; a fine-tune starts from {family.described}",
                            param="base")
        loaded = family.load(path)
        loaded.chat_template = read_chat_template(path)
    else:
        model_type = read_json(path / "config.json").get("model_type") if (path / "config.json").is_file() else None
        if model_type not in family.hf_model_types:
            raise UserError(f"base={name_or_path}: Hugging Face model_type {model_type!r}; a fine-tune starts from "
                            f"{family.described} ({', '.join(family.hf_model_types)})", param="base")
        loaded = family.load_hf(path)
    set_dtype(loaded.model, dtype)
    return loaded
