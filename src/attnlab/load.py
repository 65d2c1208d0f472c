"""Load any model attnlab runs, by name or path: a named pretrained model, a .gguf file, a Hugging
Face model directory, or one of our run directories (through the task registry).

Loaded carries what running a model needs beside the model (tokenizer, chat template, special
tokens); `model_type` is the one vocabulary of kinds (the task registry's: "gpt", "bert", ...).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.interop.gguf import load_gguf
from attnlab.interop.hf import load_hf
from attnlab.interop.hf_bert import load_hf_bert
from attnlab.interop.hf_mamba import load_mamba_hf
from attnlab.jsonfile import read_json
from attnlab.nn.quant import SCHEMES
from attnlab.nn.quant_linear import check_dtype, set_dtype
from attnlab.pretrained import resolve
from attnlab.interop.peft import load_adapter, read_adapter_config
from attnlab.nn.lora import merge_lora
from attnlab.tasks.finetune_base import read_chat_template
from attnlab.tasks.registry import load_run
from attnlab.tokenizers import ByteLevelBPE
from attnlab.train.run_dir import ADAPTER_CONFIG, is_run_dir

CAUSAL = ("gpt", "mamba", "finetune")  # model types that continue a prompt (generate, chat)
ENCODERS = ("bert",)   # model types that embed text


@dataclass
class Loaded:
    """A loaded model with what running it needs."""

    model: object                       # e.g. models.gpt.GPT or models.bert.Bert, in eval mode
    tokenizer: object                   # ByteLevelBPE (decoders) or tokenizers.Tokenizer (BERT WordPiece)
    model_type: str                     # the task registry's key: "gpt", "bert", ...
    source: Path                        # the file or directory it came from
    chat_template: str | None = None    # Jinja chat template, when the checkpoint has one
    special: dict = field(default_factory=dict)  # e.g. {"bos": "<|im_start|>", "eos": ...}
    max_seq_len: int | None = None      # the longest input the pooling config allows (encoders)


def _model_dir(path: Path) -> dict:
    """config.json of a model directory."""
    if not path.is_dir():
        raise ValueError(f"{path} is not a model directory")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json")
    return read_json(path / "config.json")


def _special_strings(tokenizer, cfg) -> dict:
    """{"bos": text, "eos": text} of the model's special ids, for chat templates."""
    out = {}
    for key, token_id in (("bos", cfg.bos_id), ("eos", cfg.eos_id)):
        if token_id is not None:
            try:
                out[key] = tokenizer.id_to_token(token_id)
            except KeyError:
                pass
    return out


def _check_kind(loaded: Loaded, wanted: tuple[str, ...], what: str) -> Loaded:
    if loaded.model_type not in wanted:
        raise ValueError(f"{loaded.source} is a {loaded.model_type} model; {what} needs a {' or '.join(wanted)} model")
    return loaded


def _at_dtype(loaded: Loaded, dtype: str) -> Loaded:
    """Convert a loaded fp32 model to `dtype` (nn.quant_linear.set_dtype); block quantization is
    for GPT-family models only."""
    if dtype in SCHEMES and loaded.model_type not in ("gpt", "finetune"):
        raise ValueError(f"--dtype {dtype} (quantized weights) is implemented for GPT-family models; "
                         f"{loaded.source} is a {loaded.model_type} model (use fp32 or bf16)")
    set_dtype(loaded.model, dtype)
    return loaded


def load_model(name_or_path: str, dtype: str = "auto") -> Loaded:
    """Any model: a name (smollm2-135m, all-minilm-l6-v2), a GGUF file, a HF model directory
    (config.json + safetensors + tokenizer.json: llama, mistral, qwen2, mixtral, gpt2, mamba, bert), a
    PEFT LoRA adapter directory (on the base it names), or one of our run directories, at `dtype` (nn.quant_linear.DTYPES): "auto" = as stored (a GGUF file's
    Q8_0 / Q4_0 / Q4_1 matrices stay quantized; everything else fp32), "fp32" (GGUF dequantized: the
    reference), "bf16", or a block quantization "q8_0" / "q4_0" / "q4_1" (GPT-family models).

    Raises:
        FileNotFoundError, ValueError: naming what is missing or unsupported (a dtype we do not
            implement is named with the supported ones).
    """
    check_dtype(dtype)
    path = resolve(name_or_path)
    if path.is_file():
        model, tokenizer, metadata = load_gguf(path, dtype)
        return Loaded(model, tokenizer, "gpt", path, metadata.get("tokenizer.chat_template"),
                      _special_strings(tokenizer, model.cfg))
    return _at_dtype(_load_directory(path), dtype)


def _load_directory(path: Path) -> Loaded:
    """A run directory, a PEFT adapter directory or a HF model directory, fp32."""
    if (path / ADAPTER_CONFIG).is_file() and not is_run_dir(path):
        return _load_adapter_dir(path)
    config = _model_dir(path)
    if is_run_dir(path):
        run = load_run(path)
        special = _special_strings(run.tokenizer, run.model.cfg) if run.model_type in CAUSAL else {}
        return Loaded(run.model, run.tokenizer, run.model_type, path, read_chat_template(path), special,
                      max_seq_len=getattr(run.model.cfg, "max_seq_len", None))
    if config.get("model_type") == "bert":
        model, tokenizer, _, limit = load_hf_bert(str(path))
        return Loaded(model, tokenizer, "bert", path, max_seq_len=limit)
    model_type = "mamba" if config.get("model_type") == "mamba" else "gpt"
    model, _ = load_mamba_hf(path) if model_type == "mamba" else load_hf(path)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json")
    tokenizer = ByteLevelBPE.load(path / "tokenizer.json")
    template = None
    if (path / "tokenizer_config.json").is_file():
        template = json.loads((path / "tokenizer_config.json").read_text()).get("chat_template")
    return Loaded(model.eval(), tokenizer, model_type, path, template, _special_strings(tokenizer, model.cfg))


def _load_adapter_dir(path: Path) -> Loaded:
    """A PEFT LoRA adapter directory (e.g. one peft wrote): its base (adapter_config.json's
    base_model_name_or_path, any model load_model takes) with the adapters merged into its fp32
    weights; the directory's own tokenizer.json and chat template where it has them."""
    settings = read_adapter_config(path / ADAPTER_CONFIG)
    if not settings.base:
        raise ValueError(f"{path / ADAPTER_CONFIG}: base_model_name_or_path is not set; attnlab loads an adapter "
                         f"on the model it names")
    base = load_model(settings.base, "fp32")
    if base.model_type != "gpt":
        raise ValueError(f"{path}: its base {settings.base} is a {base.model_type} model; LoRA adapters load on "
                         f"GPT-family models")
    load_adapter(base.model, path)
    merge_lora(base.model)
    tokenizer = ByteLevelBPE.load(path / "tokenizer.json") if (path / "tokenizer.json").is_file() else base.tokenizer
    template = read_chat_template(path) or base.chat_template
    return Loaded(base.model.eval(), tokenizer, "gpt", path, template, _special_strings(tokenizer, base.model.cfg))


def load_causal_lm(name_or_path: str, dtype: str = "auto") -> Loaded:
    """A decoder-only language model (load_model at `dtype`, then checked to continue text).

    Raises:
        FileNotFoundError, ValueError: naming what is missing, unsupported or of another kind.
    """
    return _check_kind(load_model(name_or_path, dtype), CAUSAL, "text generation")


def load_encoder(name_or_path: str) -> Loaded:
    """A BERT encoder: all-minilm-l6-v2, a HF BERT directory or one of our BERT runs.

    Raises:
        FileNotFoundError, ValueError: naming what is missing, unsupported or of another kind.
    """
    path = resolve(name_or_path)
    if path.is_file():
        raise ValueError(f"{name_or_path} is a single-file (GGUF) language model; this needs a BERT encoder "
                         f"directory such as all-minilm-l6-v2")
    return _check_kind(load_model(name_or_path), ENCODERS, "an encoder")
