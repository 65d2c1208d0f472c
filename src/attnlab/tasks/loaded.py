"""The one type of a loaded model, wherever it came from: a run directory, a Hugging Face model
directory, a GGUF file or a named pretrained model (load.py), or Task.load (tasks/base.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.models.base import Model
from attnlab.tasks.kinds import Kind


@dataclass
class LoadedModel:
    """A model in eval mode with what running it needs. Its `task` (tasks.base.Task, the family
    from the registry) says its kind and what it can do (quantize, export, serve, classify ...)."""

    model: Model                   # e.g. models.gpt.GPT, models.bert.Bert; in eval mode
    tokenizer: Any                 # ByteLevelBPE, a tokenizers.Tokenizer (BERT WordPiece), or None (images)
    task: Any                      # its tasks.base.Task (not imported here: base.py imports this module)
    path: Path                     # the run directory, HF model directory or GGUF file it was read from
    config: dict = field(default_factory=dict)  # a run's config.json in the current layout; {} otherwise
    chat_template: str | None = None  # Jinja chat template, when the checkpoint has one
    special: dict = field(default_factory=dict)  # special tokens' text, e.g. {"bos": "<|im_start|>", "eos": ...}
    max_seq_len: int | None = None    # the longest input it reads (an encoder's pooling limit), when known

    @property
    def model_type(self) -> str:
        """The registry key of its family: "gpt", "bert", ..."""
        return self.task.model_type

    @property
    def kind(self) -> Kind:
        return self.task.kind

    @property
    def is_run(self) -> bool:
        """Whether it is one of our run directories (with a config.json of recipe, model, data, train)."""
        return bool(self.config)
