"""The pretrained model a fine-tune starts from: found by what users would pass (a pretrained name,
a .gguf file, a Hugging Face model directory, or one of our GPT run directories) and loaded with its
tokenizer and chat template, at the precision the frozen base is kept at.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from attnlab.interop.gguf import load_gguf
from attnlab.interop.hf import load_hf
from attnlab.jsonfile import read_json
from attnlab.models.gpt import GPT
from attnlab.nn.quant_linear import check_dtype, set_dtype
from attnlab.pretrained import NAMED, resolve
from attnlab.tasks.language_model import LanguageModelTask
from attnlab.tokenizers import ByteLevelBPE
from attnlab.train.run_dir import is_run_dir

TOKENIZER_CONFIG = "tokenizer_config.json"  # transformers' file: the chat template and special tokens


@dataclass
class Base:
    """A loaded base model with what fine-tuning and chatting with it need."""

    model: GPT                         # in eval mode, frozen or not as loaded
    tokenizer: ByteLevelBPE
    chat_template: str | None          # Jinja chat template (None: the model has none)
    source: Path                       # the file or directory it came from
    special: dict = field(default_factory=dict)  # {"bos": text, "eos": text} for the template


def base_name(name_or_path: str) -> str:
    """How a run records its base: a pretrained name as it is, a path made absolute (a run is used
    from other directories)."""
    return name_or_path if name_or_path in NAMED else str(Path(name_or_path).resolve())


def read_chat_template(folder: Path) -> str | None:
    """The chat template in a directory's tokenizer_config.json (None without one)."""
    path = folder / TOKENIZER_CONFIG
    template = read_json(path).get("chat_template") if path.is_file() else None
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{path}: chat_template must be one Jinja template string (named templates are not "
                         f"supported), got {type(template).__name__}")
    return template


def special_strings(tokenizer, cfg) -> dict:
    """{"bos": text, "eos": text} of the model's special ids, for chat templates."""
    out = {}
    for key, token_id in (("bos", cfg.bos_id), ("eos", cfg.eos_id)):
        if token_id is not None:
            try:
                out[key] = tokenizer.id_to_token(token_id)
            except KeyError:
                pass
    return out


def load_base(name_or_path: str, dtype: str = "fp32") -> Base:
    """Load the decoder-only model a fine-tune starts from at `dtype` (nn.quant_linear.DTYPES: "auto"
    keeps a GGUF file's blocks as stored, a scheme quantizes; quantized weights are QLoRA's base).

    Raises:
        FileNotFoundError: naming what is missing (a named model's package, with its pip command).
        ValueError: an unsupported dtype, or a model that is not a GPT-family language model.
    """
    check_dtype(dtype)
    path = resolve(name_or_path)
    if path.is_file():
        model, tokenizer, metadata = load_gguf(path, dtype)
        template = metadata.get("tokenizer.chat_template")
    elif is_run_dir(path):
        if read_json(path / "config.json").get("model_type") != "gpt":
            raise ValueError(f"{path} is not a GPT language-model run; a fine-tune starts from a GPT-family model")
        run = LanguageModelTask().load(path)
        model, tokenizer, template = set_dtype(run.model, dtype), run.tokenizer, read_chat_template(path)
    else:
        config = read_json(path / "config.json") if (path / "config.json").is_file() else {}
        if config.get("model_type") in ("bert", "mamba"):
            raise ValueError(f"{path} is a {config['model_type']} model; a fine-tune starts from a GPT-family model")
        model, _ = load_hf(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path} has no tokenizer.json")
        model, tokenizer, template = set_dtype(model, dtype), ByteLevelBPE.load(path / "tokenizer.json"), \
            read_chat_template(path)
    return Base(model.eval(), tokenizer, template, path, special_strings(tokenizer, model.cfg))
