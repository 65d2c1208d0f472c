"""The kinds of model attnlab knows, the one vocabulary that everything outside tasks/ uses.

A family's Task (tasks/base.py) states its kind; load.py, convert.py, embed.py, the pictures and
the command line ask a loaded model's task for its kind and capabilities rather than its name.
"""
from __future__ import annotations

import enum


class Kind(str, enum.Enum):
    """What a model does with its input (the value is how it is written in JSON and messages)."""

    CAUSAL_LM = "causal-lm"    # continues text token by token: generate, chat (GPT, LLaMA ..., Mamba)
    ENCODER = "encoder"        # reads a text whole: contextual vectors, embeddings, classification (BERT)
    SEQ2SEQ = "seq2seq"        # encoder–decoder: reads a source text, writes a target (translation)
    CLASSIFIER = "classifier"  # labels an input that is not text (ViT: images)

    def __str__(self) -> str:
        return self.value

    @property
    def described(self) -> str:
        """The kind in words, with its article: "a decoder-only language model"."""
        return DESCRIBED[self]


DESCRIBED = {Kind.CAUSAL_LM: "a decoder-only language model", Kind.ENCODER: "an encoder (BERT)",
             Kind.SEQ2SEQ: "an encoder–decoder translation model", Kind.CLASSIFIER: "an image classifier (ViT)"}
