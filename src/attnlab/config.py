"""Configuration dataclasses: one per model family, the data of a recipe, and training.

Every field has a comment; invalid values raise ValueError naming the field and the allowed values.
Choices are Literal strings so configs serialise to JSON.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, fields
from typing import Literal, Optional


def _check(cond: bool, field: str, allowed: str, value) -> None:
    if not cond:
        raise ValueError(f"{field} must be {allowed}, got {value!r}")


def _check_literals(obj) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        hint = hints[f.name]
        if typing.get_origin(hint) is Literal:
            allowed = typing.get_args(hint)
            value = getattr(obj, f.name)
            _check(value in allowed, f.name, "one of " + ", ".join(map(repr, allowed)), value)


class _Config:
    """JSON round-trip helpers shared by the config dataclasses."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; known: {sorted(names)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass
class Seq2SeqConfig(_Config):
    """The encoder–decoder Transformer of Vaswani et al. 2017 (Table 3 "base": 512/8/6/2048)."""

    vocab_size: int = 8000            # joint source/target vocabulary (set from the tokenizer)
    d_model: int = 512                # model width D
    n_heads: int = 8                  # attention heads H; d_model % n_heads == 0
    n_encoder_layers: int = 6         # N encoder layers
    n_decoder_layers: int = 6         # N decoder layers
    d_ff: Optional[int] = None        # FFN hidden size; None = 4 * d_model
    dropout: float = 0.1              # P_drop on sublayer outputs and embedding sums (paper §5.4)
    attention_dropout: float = 0.0    # dropout on attention weights (not in the paper)
    norm_position: Literal["post", "pre"] = "post"  # Post-LN (paper) or Pre-LN (modern)
    activation: Literal["relu", "gelu"] = "relu"    # FFN non-linearity (paper: ReLU)
    max_seq_len: int = 256            # longest source or target sequence, in tokens
    tie_embeddings: bool = True       # share source, target embeddings and output projection (§3.4)
    attention_impl: Literal["sdpa", "math"] = "sdpa"  # fused kernel or explicit math
    pad_id: int = 0                   # special token ids (from the tokenizer)
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        _check_literals(self)
        for name in ("vocab_size", "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff",
                     "max_seq_len"):
            _check(isinstance(getattr(self, name), int) and getattr(self, name) > 0, name,
                   "a positive integer", getattr(self, name))
        _check(self.d_model % self.n_heads == 0, "d_model", f"divisible by n_heads={self.n_heads}",
               self.d_model)
        _check(self.d_model % 2 == 0, "d_model", "even (sinusoidal positions)", self.d_model)
        for name in ("dropout", "attention_dropout"):
            _check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("pad_id", "bos_id", "eos_id"):
            _check(0 <= getattr(self, name) < self.vocab_size, name, f"in [0, vocab_size={self.vocab_size})",
                   getattr(self, name))
        _check(len({self.pad_id, self.bos_id, self.eos_id}) == 3, "bos_id", "different from pad_id and eos_id",
               self.bos_id)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass
class TranslationDataConfig(_Config):
    """Which parallel data a translation recipe trains on and how it is tokenized."""

    dataset: Literal["multi30k"] = "multi30k"  # data set name (data/datasets.py)
    src_lang: Literal["en", "de", "fr"] = "en"  # source language
    tgt_lang: Literal["en", "de", "fr"] = "de"  # target language
    tokenizer_vocab_size: int = 8000  # joint byte-level BPE vocabulary size, special tokens included
    max_len: int = 128                # longer training pairs are truncated to this many tokens
    test_split: Literal["test_2016_flickr"] = "test_2016_flickr"  # the split `evaluate --split test` reads

    def __post_init__(self):
        _check_literals(self)
        _check(self.src_lang != self.tgt_lang, "tgt_lang", f"different from src_lang={self.src_lang!r}",
               self.tgt_lang)
        _check(self.tokenizer_vocab_size >= 259, "tokenizer_vocab_size", ">= 259 (256 bytes + 3 specials)",
               self.tokenizer_vocab_size)
        _check(self.max_len >= 2, "max_len", ">= 2", self.max_len)


@dataclass
class TrainConfig(_Config):
    """Optimisation, schedule, budget and evaluation of one training run."""

    batch_tokens: int = 4000          # target tokens per batch (length-bucketed batches)
    lr_schedule: Literal["noam", "constant"] = "noam"  # noam: the paper's warm-up + inverse sqrt decay
    lr_factor: float = 1.0            # noam: lr = factor · d_model^-0.5 · min(step^-0.5, step·warmup^-1.5)
    lr: float = 5e-4                  # constant schedule's learning rate
    warmup_steps: int = 4000          # linear warm-up steps (paper: 4000)
    beta1: float = 0.9                # Adam β1 (paper §5.3)
    beta2: float = 0.98               # Adam β2
    eps: float = 1e-9                 # Adam ε
    weight_decay: float = 0.0         # decoupled weight decay (AdamW), 0 = the paper's Adam
    label_smoothing: float = 0.1      # ε_ls (paper §5.4)
    clip_grad_norm: float = 1.0       # max global gradient norm; 0 = no clipping
    max_steps: Optional[int] = None   # step budget (None = unlimited)
    minutes: Optional[float] = None   # wall-clock budget for training, evaluations included
    eval_every: int = 1000            # steps between validations (loss + BLEU)
    eval_bleu_sentences: int = 500    # validation sentences decoded for BLEU at each evaluation
    log_every: int = 50               # steps between metrics.jsonl lines
    checkpoint_every: int = 500       # steps between resumable checkpoints
    average_last: int = 0             # average the weights of the last N checkpoints at the end (0 = off)
    beam_size: int = 4                # beam width for final evaluation / translation (paper §6.1)
    length_penalty: float = 0.6       # α of the GNMT length penalty (paper §6.1)
    autocast: Literal["none", "bf16"] = "none"  # bf16 autocast for matmuls (CPU with AVX512-BF16)
    seed: int = 0                     # seeds the data order, initialisation and dropout
    threads: int = 0                  # torch threads; 0 = all cores

    def __post_init__(self):
        _check_literals(self)
        for name in ("batch_tokens", "warmup_steps", "eval_every", "log_every", "checkpoint_every",
                     "beam_size", "eval_bleu_sentences"):
            _check(getattr(self, name) > 0, name, "> 0", getattr(self, name))
        _check(0.0 <= self.label_smoothing < 1.0, "label_smoothing", "in [0, 1)", self.label_smoothing)
        for name in ("beta1", "beta2"):
            _check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("eps", "lr", "lr_factor"):
            _check(getattr(self, name) > 0, name, "> 0", getattr(self, name))
        _check(self.weight_decay >= 0, "weight_decay", ">= 0", self.weight_decay)
        _check(self.length_penalty >= 0, "length_penalty", ">= 0", self.length_penalty)
        _check(self.beam_size <= 64, "beam_size", "in 1..64", self.beam_size)
        _check(self.max_steps is None or self.max_steps > 0, "max_steps", "> 0 or None", self.max_steps)
        _check(self.minutes is None or self.minutes > 0, "minutes", "> 0 or None", self.minutes)
        _check(self.average_last >= 0, "average_last", ">= 0", self.average_last)
        _check(self.clip_grad_norm >= 0, "clip_grad_norm", ">= 0", self.clip_grad_norm)
        _check(self.threads >= 0, "threads", ">= 0", self.threads)


def parse_value(cls, name: str, text: str):
    """Convert the text of a `--set name=text` to the type of field `name` of dataclass `cls`.

    Raises:
        ValueError: naming the field and the expected type when the text does not parse.
    """
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is Literal:
        return text
    if text.lower() in ("none", "null") and type(None) in typing.get_args(hint):
        return None
    base = args[0] if typing.get_origin(hint) is typing.Union else hint
    try:
        if base is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        return base(text)
    except ValueError:
        raise ValueError(f"{name} must be {getattr(base, '__name__', base)}, got {text!r}") from None
