"""BERT: masked-LM pretraining and sentence classification: the task."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from attnlab.config import Config, check, check_literals


@dataclass
class TextClassificationDataConfig(Config):
    """Which sentences a text-classification (or masked-LM) recipe trains on and how it tokenizes."""

    objective: Literal["classification", "mlm"] = "classification"  # fine-tune a classifier, or pretrain (MLM)
    dataset: Literal["sst2"] = "sst2"  # labelled sentences (data/datasets.py); dev is the evaluation split
    tokenizer_vocab_size: int = 8000  # WordPiece vocabulary trained from the text (models from scratch)
    max_len: int = 64                 # longer sentences are truncated (with a warning at inference)
    batch_size: int = 32              # sentences per batch
    mlm_probability: float = 0.15     # masked-LM pretraining: share of eligible tokens chosen (BERT §3.1)
    n_train: Optional[int] = None     # use only the first N training sentences (None = all)

    def __post_init__(self):
        check_literals(self)
        check(self.tokenizer_vocab_size >= 100, "tokenizer_vocab_size", ">= 100", self.tokenizer_vocab_size)
        for name in ("max_len", "batch_size"):
            check(getattr(self, name) >= 2, name, ">= 2", getattr(self, name))
        check(0.0 < self.mlm_probability < 1.0, "mlm_probability", "in (0, 1)", self.mlm_probability)
        check(self.n_train is None or self.n_train >= 1, "n_train", "None or >= 1", self.n_train)


