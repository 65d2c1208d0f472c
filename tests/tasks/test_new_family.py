"""README's "Adding a model family", followed for real: a tiny new family (a bigram language model:
the next token from the current one alone) is written here — model, task, recipe — and registered
with one line; the library then trains, loads, evaluates and runs it from the command line, and
generate drives it, with no other file changed."""
from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import nn

from attnlab.cli import main
from attnlab.config import Config, check
from attnlab.generate import generate
from attnlab.load import load_causal_lm, load_model
from attnlab.models.base import CausalLM, Model
from attnlab.recipes import Recipe
from attnlab.tasks.kinds import Kind
from attnlab.tasks.language_model import LanguageModelTask, TextDataConfig
from attnlab.tasks.registry import TASKS, evaluate_run, register, task_of_recipe
from attnlab.train.config import TrainConfig


# ----------------------------------------------------------------------------- 1. the model (models/bigram.py)
@dataclass
class BigramConfig(Config):
    """A bigram language model: logits of the next token from an embedding of the current one."""

    model_type: ClassVar[str] = "bigram"  # the registry key
    vocab_size: int = 64          # tokens (set from the tokenizer)
    d_model: int = 32             # embedding width D
    n_layers: int = 1             # one embedding, one projection (the memory check reads it)
    max_seq_len: int = 64         # training block size (the model itself has no length limit)
    bos_id: Optional[int] = None  # special token ids, from the tokenizer
    eos_id: Optional[int] = None

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "max_seq_len"):
            check(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))


@dataclass
class BigramOutput:
    logits: torch.Tensor       # (B, T, V)
    aux_loss: torch.Tensor     # () zero
    attentions: None = None


class Bigram(Model):
    is_recurrent: ClassVar[bool] = True  # no positions, no context limit, a constant (empty) decoding state

    def __init__(self, cfg: BigramConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def setup_kv_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None) -> None:
        pass  # nothing to remember: the next token depends on the current one only

    def clear_kv_cache(self) -> None:
        pass

    @property
    def max_chunk(self) -> int | None:
        return None

    def kv_cache_bytes(self) -> int:
        return 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, need_weights: bool = False,
                logits_to_keep: int = 0) -> BigramOutput:
        x = self.embed(input_ids[:, -logits_to_keep:] if logits_to_keep else input_ids)  # (B, T, D)
        return BigramOutput(self.lm_head(x), torch.zeros(()))


# ----------------------------------------------------------------------------- 2. the task (a next-token model:
# LanguageModelTask serves as it is) and 3. the recipe (recipes/bigram.py)
def bigram_recipe(steps: int = 40) -> Recipe:
    return Recipe("bigram-char", "a bigram model of characters", BigramConfig(),
                  TextDataConfig(block_size=32, batch_size=8, eval_tokens=400),
                  TrainConfig(lr_schedule="constant", lr=3e-2, warmup_steps=1, max_steps=steps, minutes=None,
                              eval_every=steps, log_every=steps, checkpoint_every=steps))


# ----------------------------------------------------------------------------- 4. one registry line
@contextlib.contextmanager
def bigram_family():
    """The family registered (tasks/registry.py's one line), for the duration of a test."""
    register(LanguageModelTask(Bigram, BigramConfig))
    try:
        yield
    finally:
        TASKS.pop("bigram")


def trained_bigram(tmp_path, steps: int = 40):
    """A trained bigram run directory (call inside bigram_family(), with the tiny_shakespeare fixture)."""
    out = tmp_path / "bigram"
    task_of_recipe(bigram_recipe(steps)).train(bigram_recipe(steps), out)
    return out


def test_a_new_family_trains_loads_evaluates_and_generates_through_the_library(tiny_shakespeare, tmp_path,
                                                                               capsys):
    with bigram_family():
        out = trained_bigram(tmp_path)
        saved = json.loads((out / "config.json").read_text())
        assert saved["model_type"] == "bigram" and saved["recipe"] == "bigram-char"
        loaded = load_model(str(out))
        assert loaded.kind is Kind.CAUSAL_LM and loaded.model_type == "bigram" and isinstance(loaded.model, CausalLM)
        record = evaluate_run(out)
        uniform = math.log(loaded.model.cfg.vocab_size)
        assert record["split"] == "val" and record["val_loss"] < uniform - 1.0  # it learnt the bigram statistics
        ids = loaded.tokenizer.encode("To be")
        greedy = generate(load_causal_lm(str(out)).model, [ids], max_new_tokens=6, temperature=0.0)[0]
        assert len(greedy) == 6
        capsys.readouterr()
        assert main(["generate", "--model", str(out), "--prompt", "To be", "--max-new-tokens", "6",
                     "--temperature", "0"]) == 0
        assert capsys.readouterr().out == "To be" + loaded.tokenizer.decode(greedy) + "\n"
        assert main(["train", "--recipe", "shakespeare-char", "--out", str(out), "--resume", "--steps", "3"]) == 2
        assert "model_type is 'bigram', expected 'gpt'" in capsys.readouterr().err  # a run of another family
        # what the family did not state it cannot do, refused in one line
        assert main(["evaluate", "--model", str(out), "--dtype", "q8_0"]) == 2
        assert "--dtype 'q8_0' (quantized weights) is not implemented for a decoder-only language model" in \
            capsys.readouterr().err
        assert main(["convert", "--from", str(out), "--to", str(tmp_path / "hf")]) == 2
        assert "has no Hugging Face export" in capsys.readouterr().err
    assert "bigram" not in TASKS
