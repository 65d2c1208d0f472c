"""Recipes: a named bundle of data, model preset and training configuration."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnlab.config import parse_value
from attnlab.models.bert import BertConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.models.vit import ViTConfig
from attnlab.tasks.language_model import TextDataConfig
from attnlab.tasks.text_classification import TextClassificationDataConfig
from attnlab.tasks.translation import TranslationDataConfig
from attnlab.tasks.vision import ImageDataConfig
from attnlab.train.config import TrainConfig
from attnlab.recipes import bert, digits_vit, mnist_vit, multi30k_en_de, shakespeare_bpe, shakespeare_char


@dataclass
class Recipe:
    name: str
    description: str
    model: Seq2SeqConfig | GPTConfig | BertConfig | ViTConfig
    data: TranslationDataConfig | TextDataConfig | TextClassificationDataConfig | ImageDataConfig
    train: TrainConfig

    @property
    def kind(self) -> str:
        """"translation" (encoder–decoder), "language-model" (decoder-only), "bert" or "vit"."""
        kinds = {GPTConfig: "language-model", BertConfig: "bert", ViTConfig: "vit", Seq2SeqConfig: "translation"}
        return kinds[type(self.model)]

    def with_overrides(self, assignments: list[str]) -> "Recipe":
        """Apply `key=value` strings to whichever config has the field `key`.

        Raises:
            ValueError: for a malformed assignment, an unknown key (listing the known ones) or a bad
                value (naming the field and the allowed values).
        """
        parts = {"model": self.model, "data": self.data, "train": self.train}
        changes: dict[str, dict] = {k: {} for k in parts}
        for text in assignments:
            key, sep, value = text.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ValueError(f"--set expects key=value, got {text!r}")
            if key == "vocab_size":
                raise ValueError("vocab_size comes from the tokenizer; set tokenizer_vocab_size instead")
            owner = next((p for p, cfg in parts.items() if key in {f.name for f in dataclasses.fields(cfg)}), None)
            if owner is None:
                known = sorted(f.name for cfg in parts.values() for f in dataclasses.fields(cfg))
                raise ValueError(f"unknown setting {key!r}; known settings: {', '.join(known)}")
            changes[owner][key] = parse_value(type(parts[owner]), key, value.strip())
        return dataclasses.replace(self, **{p: dataclasses.replace(cfg, **changes[p]) for p, cfg in parts.items()})


RECIPES = {multi30k_en_de.NAME: multi30k_en_de.recipe,
           shakespeare_char.NAME: shakespeare_char.recipe,
           shakespeare_char.LLAMA_NAME: shakespeare_char.llama_recipe,
           shakespeare_bpe.NAME: shakespeare_bpe.recipe,
           bert.MLM_NAME: bert.mlm_recipe,
           bert.SST2_NAME: bert.sst2_recipe,
           bert.MINILM_NAME: bert.minilm_recipe,
           mnist_vit.NAME: mnist_vit.recipe,
           digits_vit.NAME: digits_vit.recipe}


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`.

    Raises:
        ValueError: listing the known recipes when `name` is not one.
    """
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]()
