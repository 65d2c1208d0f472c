"""Recipe: a named training setup (model config + data config + TrainConfig), with `--set` overrides."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnlab.config import Config, parse_value
from attnlab.errors import UserError
from attnlab.train.config import TrainConfig


@dataclass
class Recipe:
    """A named training setup: a model config, the task's data config and a TrainConfig."""

    name: str
    description: str
    model: Config         # a model config (GPTConfig, Seq2SeqConfig, ...)
    data: Config          # the task's data config (TextDataConfig, TranslationDataConfig, ...)
    train: TrainConfig

    @property
    def model_type(self) -> str:
        """The run's kind, the task registry's key (tasks/registry.py): the model config's model_type."""
        return self.model.model_type

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
                raise UserError(f"--set expects key=value, got {text!r}")
            if key == "vocab_size":
                raise UserError("vocab_size comes from the tokenizer; set tokenizer_vocab_size instead")
            owner = next((p for p, cfg in parts.items() if key in {f.name for f in dataclasses.fields(cfg)}), None)
            if owner is None:
                known = sorted(f.name for cfg in parts.values() for f in dataclasses.fields(cfg))
                raise UserError(f"unknown setting {key!r}; known settings: {', '.join(known)}")
            changes[owner][key] = parse_value(type(parts[owner]), key, value.strip())
        return dataclasses.replace(self, **{p: dataclasses.replace(cfg, **changes[p]) for p, cfg in parts.items()})
