"""shakespeare-bpe: a word-piece-level language model of Tiny Shakespeare with our byte-level BPE.

The same model and schedule as shakespeare-char, over a 1,024-token BPE trained on the training
split (about 2.6 characters per token, so a 64-token block sees about 170 characters). Compare it
with the character model in bits per byte (evaluate reports it): nats per token are not comparable
across tokenizers.
"""
from __future__ import annotations

from attnlab.models.gpt import GPTConfig
from attnlab.recipes.recipe import Recipe
from attnlab.recipes.shakespeare_char import SIZES, train_config
from attnlab.tasks.language_model import TextDataConfig

NAME = "shakespeare-bpe"


def recipe():
    return Recipe(name=NAME, description="GPT-2-style BPE LM of Tiny Shakespeare (1,024-token byte-level BPE)",
                  model=GPTConfig.from_name("gpt2", **SIZES),
                  data=TextDataConfig(dataset="tinyshakespeare", tokenizer="bpe", tokenizer_vocab_size=1024,
                                      block_size=64, batch_size=12),
                  train=train_config())
