"""Every model, run and recipe the pictures load, in one place.

The pictures never call a loader directly: they get a `Source` (model + tokenizer + kind) from here
(through load.load_model and the task registry's run directories).
Kinds: "encoder" (BERT: all-minilm-l6-v2, a bert run), "causal-lm" (GPT/LLaMA: smollm2-135m, a GGUF
file, a language-model run), "seq2seq" (a translation run); "recurrent" (Mamba) and "vision" (ViT)
models are recognised so that a figure that needs attention says which models fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnlab import pretrained
from attnlab.data.text import read_text, split_text
from attnlab.data.translation import read_parallel
from attnlab.jsonfile import read_json
from attnlab.load import load_model
from attnlab.recipes import get_recipe as _get_recipe
from attnlab.tasks.language_model import TextDataConfig
from attnlab.tokenizers import ByteLevelBPE

NAMED_KINDS = {"all-minilm-l6-v2": "encoder", "smollm2-135m": "causal-lm"}
# model_type (the task registry's, or a HF config.json's) -> kind
RUN_KINDS = {"seq2seq": "seq2seq", "gpt": "causal-lm", "bert": "encoder", "vit": "vision", "mamba": "recurrent",
             "llama": "causal-lm", "mistral": "causal-lm", "qwen2": "causal-lm", "mixtral": "causal-lm",
             "gpt2": "causal-lm"}
FITTING = {  # what to pass where a figure needs a model of this kind
    "encoder": "all-minilm-l6-v2 or a BERT run (attnlab train --recipe bert-mlm)",
    "causal-lm": "smollm2-135m, a GGUF file or a language-model run (attnlab train --recipe shakespeare-char)",
    "seq2seq": "a translation run (attnlab train --recipe multi30k-en-de --out runs/multi30k)",
}

DESCRIBED = {"encoder": "an encoder (BERT)", "causal-lm": "a decoder-only language model",
             "seq2seq": "an encoder–decoder translation model", "vision": "a vision model",
             "recurrent": "a Mamba (state-space) model, which has no attention weights"}


def describe(kind: str) -> str:
    """A kind in words, with its article: "an encoder (BERT)"."""
    return DESCRIBED.get(kind, f"a {kind} model")


@dataclass
class Source:
    """A loaded model with its tokenizer, for the pictures."""

    model: object       # models.bert.Bert, models.gpt.GPT or models.seq2seq.Seq2SeqTransformer, in eval mode
    tokenizer: object   # tokenizers.Tokenizer (BERT WordPiece) or ByteLevelBPE
    kind: str           # "encoder", "causal-lm" or "seq2seq"
    name: str           # what the user passed (a model name or a path)

    def tokenize(self, text: str) -> tuple[list[int], list[str]]:
        """Token ids of `text` as the model reads it, and each token as display text.

        Encoders get [CLS] ... [SEP] (WordPiece); decoders and translation sources get the plain
        byte-level BPE ids (no special token), as `generate` and `translate` give them.
        """
        if self.kind == "encoder":
            enc = self.tokenizer.encode(text)
            return list(enc.ids), list(enc.tokens)
        ids = self.tokenizer.encode(text)
        return ids, [self.display(i) for i in ids]

    def display(self, token_id: int) -> str:
        """One byte-level BPE token as text (bytes cut from a character shown as \\xNN)."""
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")


def kind_of(name_or_dir: str) -> str:
    """The kind of a model name, GGUF file or run/model directory, without loading it.

    Raises:
        FileNotFoundError: no such model or path. ValueError: a directory of an unknown kind.
    """
    if name_or_dir in NAMED_KINDS:
        return NAMED_KINDS[name_or_dir]
    path = pretrained.resolve(name_or_dir)
    if path.is_file():
        return "causal-lm"  # a GGUF file
    if (path / "model.safetensors").is_file() and (path / "config.json").is_file():
        kind = str(read_json(path / "config.json").get("model_type"))
        if kind in RUN_KINDS:
            return RUN_KINDS[kind]
    raise ValueError(f"{name_or_dir} is not a model this draws: give {FITTING['encoder']}; "
                     f"{FITTING['causal-lm']}; or {FITTING['seq2seq']}")


def load(name_or_dir: str, kinds: tuple[str, ...] = ("encoder", "causal-lm", "seq2seq"),
         figure: str = "this figure") -> Source:
    """Load a model for a figure that accepts `kinds`.

    Raises:
        ValueError: the model is of another kind (naming the models that fit), or not a model.
        FileNotFoundError: no such model or path.
    """
    kind = kind_of(name_or_dir)
    if kind not in kinds:
        fits = "; ".join(FITTING[k] for k in kinds)
        raise ValueError(f"{name_or_dir} is {describe(kind)}; {figure} needs {fits}")
    loaded = load_model(name_or_dir)
    return Source(loaded.model.eval(), loaded.tokenizer, kind, name_or_dir)


def load_for_attention(name_or_dir: str) -> Source:
    """Any model whose attention can be drawn: an encoder, a decoder or a translation run."""
    return load(name_or_dir, ("encoder", "causal-lm", "seq2seq"), "the attention figure")


def run_config(run_dir: str | Path) -> dict:
    """The config.json of a run directory (model_type, recipe, model, data, train)."""
    return read_json(Path(run_dir) / "config.json")


def get_recipe(name: str):
    """The recipe called `name` (recipes.Recipe: model, data and train configs).

    Raises:
        ValueError: listing the known recipes.
    """
    return _get_recipe(name)


def multi30k_pairs(split: str = "val", n: int | None = None) -> tuple[list[str], list[str]]:
    """The first `n` English/German sentence pairs of a Multi30k split (all when None).

    Raises:
        DatasetNotFoundError: Multi30k is nowhere on the data search path.
    """
    src, tgt = read_parallel("multi30k", split, "en", "de")
    return src[:n], tgt[:n]


def shakespeare_text(n_chars: int | None = None) -> str:
    """The first `n_chars` characters of the held-out 10% of Tiny Shakespeare (all when None)."""
    held_out = split_text(read_text("tinyshakespeare"), TextDataConfig().train_fraction)[1]
    return held_out[:n_chars]


def translation_tokenizer(run_dir: str | None, vocab_size: int = 1000, sentences: int = 3000):
    """(tokenizer, pad_id, bos_id, eos_id): a translation run's tokenizer, or, without a run, a small
    byte-level BPE trained here on the first `sentences` Multi30k training pairs (both languages)."""
    if run_dir is not None:
        source = load(run_dir, ("seq2seq",), "a translation tokenizer")
        cfg = source.model.cfg
        return source.tokenizer, cfg.pad_id, cfg.bos_id, cfg.eos_id
    src, tgt = multi30k_pairs("train", sentences)
    tokenizer = ByteLevelBPE.train(src + tgt, vocab_size, ["<pad>", "<bos>", "<eos>"])
    ids = tokenizer.special_tokens
    return tokenizer, ids["<pad>"], ids["<bos>"], ids["<eos>"]
