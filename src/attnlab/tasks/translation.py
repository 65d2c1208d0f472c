"""Translation: the task."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.config import Config, check, check_literals


@dataclass
class TranslationDataConfig(Config):
    """Which parallel data a translation recipe trains on and how it is tokenized."""

    dataset: Literal["multi30k"] = "multi30k"  # data set name (data/datasets.py)
    src_lang: Literal["en", "de", "fr"] = "en"  # source language
    tgt_lang: Literal["en", "de", "fr"] = "de"  # target language
    tokenizer_vocab_size: int = 8000  # joint byte-level BPE vocabulary size, special tokens included
    max_len: int = 128                # longer training pairs are truncated to this many tokens
    test_split: Literal["test_2016_flickr"] = "test_2016_flickr"  # the split `evaluate --split test` reads

    def __post_init__(self):
        check_literals(self)
        check(self.src_lang != self.tgt_lang, "tgt_lang", f"different from src_lang={self.src_lang!r}",
               self.tgt_lang)
        check(self.tokenizer_vocab_size >= 259, "tokenizer_vocab_size", ">= 259 (256 bytes + 3 specials)",
               self.tokenizer_vocab_size)
        check(self.max_len >= 2, "max_len", ">= 2", self.max_len)


