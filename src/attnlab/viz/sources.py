"""Every model, run and recipe the pictures load, in one place.

The pictures never call a loader directly: they get a `Source` from here, a tasks.LoadedModel (from
load.load_model) and the name the user gave. What a model is (its kind, whether it has attention
weights) the task registry says (tasks/registry.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnlab import pretrained
from attnlab.data.text import read_text, split_text
from attnlab.data.translation import read_parallel
from attnlab.errors import UserError
from attnlab.jsonfile import read_json
from attnlab.load import load_model
from attnlab.recipes import get_recipe as _get_recipe
from attnlab.tasks.kinds import Kind
from attnlab.tasks.language_model import TextDataConfig
from attnlab.tasks.loaded import LoadedModel
from attnlab.tasks.registry import task_of_path
from attnlab.tokenizers import ByteLevelBPE

DRAWN = (Kind.ENCODER, Kind.CAUSAL_LM, Kind.SEQ2SEQ)  # the kinds whose attention the pictures draw
FITTING = {  # what to pass where a figure needs a model of this kind
    Kind.ENCODER: "all-minilm-l6-v2 or a BERT run (attnlab train --recipe bert-mlm)",
    Kind.CAUSAL_LM: "smollm2-135m, a GGUF file or a language-model run (attnlab train --recipe shakespeare-char)",
    Kind.SEQ2SEQ: "a translation run (attnlab train --recipe multi30k-en-de --out runs/multi30k)",
}


@dataclass
class Source:
    """A loaded model with its tokenizer, for the pictures."""

    loaded: LoadedModel  # model (eval mode), tokenizer, task
    name: str            # what the user passed (a model name or a path)

    @property
    def model(self):
        return self.loaded.model

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def kind(self) -> Kind:
        return self.loaded.kind

    @property
    def described(self) -> str:
        """The model in words: "an encoder (BERT)"."""
        return self.loaded.task.described

    def tokenize(self, text: str) -> tuple[list[int], list[str]]:
        """Token ids of `text` as the model reads it, and each token as display text.

        Encoders get [CLS] ... [SEP] (WordPiece); decoders and translation sources get the plain
        byte-level BPE ids (no special token), as `generate` and `translate` give them.
        """
        if self.kind is Kind.ENCODER:
            enc = self.tokenizer.encode(text)
            return list(enc.ids), list(enc.tokens)
        ids = self.tokenizer.encode(text)
        return ids, [self.display(i) for i in ids]

    def display(self, token_id: int) -> str:
        """One byte-level BPE token as text (bytes cut from a character shown as \\xNN)."""
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")


def task_of(name_or_dir: str):
    """The family (tasks.base.Task) of a model name, GGUF file or run/model directory, without loading it.

    Raises:
        FileNotFoundError: no such model or path. UserError: a directory of no family we know.
    """
    path = pretrained.resolve(name_or_dir)
    try:
        return task_of_path(path)
    except UserError:
        raise UserError(f"{name_or_dir} is not a model this draws: give {FITTING[Kind.ENCODER]}; "
                        f"{FITTING[Kind.CAUSAL_LM]}; or {FITTING[Kind.SEQ2SEQ]}") from None


def load(name_or_dir: str, kinds: tuple[Kind, ...] = DRAWN, figure: str = "this figure") -> Source:
    """Load a model with attention weights for a figure that accepts `kinds`.

    Raises:
        UserError: the model is of another kind, or has no attention (naming the models that fit),
            or is not a model. FileNotFoundError: no such model or path.
    """
    task = task_of(name_or_dir)
    if task.kind not in kinds or not task.has_attention:
        fits = "; ".join(FITTING[k] for k in kinds)
        what = task.described + ("" if task.has_attention else ", which has no attention weights")
        raise UserError(f"{name_or_dir} is {what}; {figure} needs {fits}")
    return Source(load_model(name_or_dir), name_or_dir)


def load_for_attention(name_or_dir: str) -> Source:
    """Any model whose attention can be drawn: an encoder, a decoder or a translation run."""
    return load(name_or_dir, DRAWN, "the attention figure")


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
        source = load(run_dir, (Kind.SEQ2SEQ,), "a translation tokenizer")
        cfg = source.model.cfg
        return source.tokenizer, cfg.pad_id, cfg.bos_id, cfg.eos_id
    src, tgt = multi30k_pairs("train", sentences)
    tokenizer = ByteLevelBPE.train(src + tgt, vocab_size, ["<pad>", "<bos>", "<eos>"])
    ids = tokenizer.special_tokens
    return tokenizer, ids["<pad>"], ids["<bos>"], ids["<eos>"]
