"""Language modelling: the task."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from attnlab.config import Config, check, check_literals


@dataclass
class TextDataConfig(Config):
    """The text a language-model recipe trains on, its tokenizer and its batches."""

    dataset: Literal["tinyshakespeare"] = "tinyshakespeare"  # data set name (data/datasets.py)
    tokenizer: Literal["char", "bpe"] = "char"  # one token per character (byte), or our byte-level BPE
    tokenizer_vocab_size: int = 1024  # BPE vocabulary size (tokenizer "bpe" only)
    train_fraction: float = 0.9       # the first 90% of the text trains, the rest validates (nanoGPT)
    block_size: int = 64              # tokens per training sequence (<= the model's max_seq_len)
    batch_size: int = 12              # sequences per micro-batch, at random offsets
    eval_tokens: Optional[int] = None  # validation tokens scored per evaluation (None = the whole split)

    def __post_init__(self):
        check_literals(self)
        check(0.0 < self.train_fraction < 1.0, "train_fraction", "in (0, 1)", self.train_fraction)
        check(self.tokenizer_vocab_size >= 256, "tokenizer_vocab_size", ">= 256", self.tokenizer_vocab_size)
        for name in ("block_size", "batch_size"):
            check(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        check(self.eval_tokens is None or self.eval_tokens >= 1, "eval_tokens", "None or >= 1", self.eval_tokens)


