"""Language modelling with decoder-only models: the data config, the next-token objective, and the
task (train / load / evaluate a run, load a HF directory or a GGUF file; generation itself lives in
generate.py).

Shape legend: B sequences, T block size, V vocabulary.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, NamedTuple, Optional

import torch
import torch.nn.functional as F

from attnlab.config import Config, check, check_literals
from attnlab.data.text import TokenStream, char_tokenizer, read_text, split_text
from attnlab.errors import UserError
from attnlab.interop.gguf import load_gguf
from attnlab.jsonfile import read_json
from attnlab.models.base import Model
from attnlab.nn.quant import SCHEMES
from attnlab.nn.quant_linear import set_dtype
from attnlab.seeding import mix_seed
from attnlab.tasks.base import Prepared, RunSpec, Task
from attnlab.tasks.kinds import Kind
from attnlab.tasks.loaded import LoadedModel
from attnlab.tokenizers import ByteLevelBPE
from attnlab.train.guards import activation_bytes
from attnlab.train.losses import perplexity

log = logging.getLogger("attnlab")


@dataclass
class TextDataConfig(Config):
    """The text a language-model recipe trains on, its tokenizer, its batches and the loss's label smoothing."""

    dataset: Literal["tinyshakespeare"] = "tinyshakespeare"  # data set name (data/datasets.py)
    tokenizer: Literal["char", "bpe"] = "char"  # one token per character (byte), or our byte-level BPE
    tokenizer_vocab_size: int = 1024  # BPE vocabulary size (tokenizer "bpe" only)
    train_fraction: float = 0.9       # the first 90% of the text trains, the rest validates (nanoGPT)
    block_size: int = 64              # tokens per training sequence (<= the model's max_seq_len)
    batch_size: int = 12              # sequences per micro-batch, at random offsets
    eval_tokens: Optional[int] = None  # validation tokens scored per evaluation (None = the whole split)
    label_smoothing: float = 0.0      # ε_ls of the next-token loss (0 = plain cross-entropy, as GPT-2)

    def __post_init__(self):
        check_literals(self)
        check(0.0 < self.train_fraction < 1.0, "train_fraction", "in (0, 1)", self.train_fraction)
        check(self.tokenizer_vocab_size >= 256, "tokenizer_vocab_size", ">= 256", self.tokenizer_vocab_size)
        for name in ("block_size", "batch_size"):
            check(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        check(0.0 <= self.label_smoothing < 1.0, "label_smoothing", "in [0, 1)", self.label_smoothing)
        check(self.eval_tokens is None or self.eval_tokens >= 1, "eval_tokens", "None or >= 1", self.eval_tokens)


def build_tokenizer(data_cfg: TextDataConfig, train_text: str) -> ByteLevelBPE:
    """Characters of the training text ("char"), or a byte-level BPE trained on it ("bpe")."""
    if data_cfg.tokenizer == "char":
        return char_tokenizer(train_text)
    return ByteLevelBPE.train([train_text], data_cfg.tokenizer_vocab_size)


def token_bytes(tokenizer: ByteLevelBPE) -> torch.Tensor:
    """(V,) int64 bytes per token id (0 for unused ids), for bits per byte."""
    sizes = []
    for i in range(tokenizer.vocab_size):
        try:
            sizes.append(len(tokenizer.token_bytes(i)))
        except KeyError:
            sizes.append(0)
    return torch.tensor(sizes)


def encode_text(tokenizer: ByteLevelBPE, text: str) -> TokenStream:
    return TokenStream(torch.tensor(tokenizer.encode(text), dtype=torch.long))


class LanguageModelObjective:
    """Teacher-forced next-token cross-entropy (+ the MoE load-balancing loss) on blocks of
    data_cfg.block_size tokens at random offsets; validation scores the whole validation text once,
    in consecutive blocks.

    An epoch is as many batches as cover the training text once (in expectation); its offsets are
    drawn from a generator seeded by (seed, epoch), so a resumed run sees the same batches.

    Args:
        train, val: the tokenized splits. data_cfg: block and batch sizes, label smoothing.
        seed: the run's seed. aux_loss_coef: weight of the model's aux_loss. token_bytes: (V,) bytes
            per token (for bits per byte); None to skip that metric.
    """

    best_metric = "val_loss"
    higher_is_better = False
    leaves_parameters_unused = False

    def __init__(self, train: TokenStream, val: TokenStream, data_cfg: TextDataConfig, seed: int = 0,
                 aux_loss_coef: float = 0.0, token_bytes: torch.Tensor | None = None):
        train.check_block(data_cfg.block_size, "training")
        val.check_block(1, "validation")
        self.train, self.val, self.data_cfg, self.seed = train, val, data_cfg, seed
        self.aux_loss_coef, self.token_bytes = aux_loss_coef, token_bytes
        self.batches_per_epoch = max(1, len(train) // (data_cfg.batch_size * data_cfg.block_size))

    def batches(self, epoch: int) -> list[torch.Tensor]:
        """The (B,) start offsets of every batch of `epoch`."""
        g = torch.Generator().manual_seed(mix_seed(self.seed, epoch))
        offsets = self.train.random_offsets(self.batches_per_epoch, self.data_cfg.batch_size,
                                            self.data_cfg.block_size, g)
        return list(offsets)

    def batch_rows(self, offsets: torch.Tensor) -> int:
        return len(offsets)

    def shard(self, offsets: torch.Tensor, rows: range) -> torch.Tensor:
        """The sequences `rows` of a (B,) batch of offsets (a process's part of it, data/sharding.py)."""
        return offsets[rows.start:rows.stop]

    def loss(self, model, offsets: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Mean cross-entropy of the next token over a (B, T) batch, plus aux_loss_coef · aux_loss."""
        x, y = self.train.blocks(offsets, self.data_cfg.block_size)  # (B, T) each
        out = model(x)
        ce = F.cross_entropy(out.logits.flatten(0, 1).float(), y.flatten(),
                             label_smoothing=self.data_cfg.label_smoothing)
        return ce + self.aux_loss_coef * out.aux_loss, y.numel()

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """{"val_loss" (nats per token), "perplexity", "bits_per_byte", "val_tokens"} on the validation
        text (data_cfg.eval_tokens of it, or all)."""
        total, count, n_bytes = 0.0, 0, 0
        for x, y in self.val.sequential_blocks(self.data_cfg.block_size, max_tokens=self.data_cfg.eval_tokens):
            logits = model(x).logits.float()
            total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            count += y.numel()
            if self.token_bytes is not None:
                n_bytes += int(self.token_bytes[y].sum())
        loss = total / count
        record = {"val_loss": round(loss, 4), "perplexity": round(perplexity(loss), 3), "val_tokens": count}
        if n_bytes:
            record["bits_per_byte"] = round(total / math.log(2) / n_bytes, 4)
        return record


class HFForm(NamedTuple):
    """How a family reads and writes Hugging Face model directories (interop/)."""

    model_types: tuple[str, ...]   # the config.json "model_type"s it reads (e.g. "llama", "mistral")
    load: Callable                 # load(path) -> (model in eval mode, config.json dict)
    save: Callable                 # save(model, out_dir, tokenizer)


def special_strings(tokenizer: ByteLevelBPE, cfg) -> dict:
    """{"bos": text, "eos": text} of the model's special ids (those the tokenizer has), for chat templates."""
    out = {}
    for key, token_id in (("bos", cfg.bos_id), ("eos", cfg.eos_id)):
        if token_id is not None:
            try:
                out[key] = tokenizer.id_to_token(token_id)
            except KeyError:
                pass
    return out


class LanguageModelTask(Task):
    """Decoder-only language-model runs on a text corpus (nanoGPT's setting): a character or
    byte-level BPE tokenizer built from the training split, validation loss, perplexity and bits
    per byte. One instance per model family that predicts the next token (the registry's GPT and
    Mamba lines): the instance states the family's capabilities.
    """

    kind, data_config = Kind.CAUSAL_LM, TextDataConfig
    evaluate_options = ("dtype",)

    def __init__(self, model_class: type[Model], model_config: type, hf: HFForm | None = None, *,
                 description: str = "", has_attention: bool = True, quantizable: bool = False, gguf: bool = False,
                 servable: bool = False):
        """Args: the family's model and config classes (the config's model_type is the registry key),
        its Hugging Face form (None: it has none), and what it can do (Task's attributes)."""
        self.model_type, self.model_class, self.model_config = model_config.model_type, model_class, model_config
        self.hf, self.hf_model_types, self.exports_hf = hf, hf.model_types if hf else (), hf is not None
        self.description, self.has_attention = description, has_attention
        self.quantizable, self.gguf, self.servable = quantizable, gguf, servable

    def load_tokenizer(self, path: Path) -> ByteLevelBPE:
        return ByteLevelBPE.load(path / "tokenizer.json")

    def load(self, path: str | Path) -> LoadedModel:
        loaded = super().load(path)
        loaded.special = special_strings(loaded.tokenizer, loaded.model.cfg)
        return loaded

    def load_hf(self, path: Path) -> LoadedModel:
        """A HF model directory of this family (config.json, safetensors, tokenizer.json; a chat
        template from tokenizer_config.json when it has one), fp32."""
        if self.hf is None:
            return super().load_hf(path)
        model, _ = self.hf.load(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path} has no tokenizer.json")
        tokenizer = ByteLevelBPE.load(path / "tokenizer.json")
        template = None
        if (path / "tokenizer_config.json").is_file():
            template = read_json(path / "tokenizer_config.json").get("chat_template")
        return LoadedModel(model.eval(), tokenizer, self, path, chat_template=template,
                           special=special_strings(tokenizer, model.cfg))

    def load_gguf(self, path: Path, dtype: str) -> LoadedModel:
        """A llama.cpp GGUF file (interop/gguf.py) at `dtype`, with its chat template."""
        if not self.gguf:
            return super().load_gguf(path, dtype)
        model, tokenizer, metadata = load_gguf(path, dtype)
        return LoadedModel(model, tokenizer, self, path, chat_template=metadata.get("tokenizer.chat_template"),
                           special=special_strings(tokenizer, model.cfg))

    def export_hf(self, model, tokenizer, out: Path, tokenizer_file: Path | None = None) -> None:
        """The family's Hugging Face directory: LLaMA / Mistral / Qwen2 / Mixtral / GPT-2 for a GPT
        (interop/hf.py), MambaForCausalLM for a Mamba (interop/hf_mamba.py)."""
        if self.hf is None:
            super().export_hf(model, tokenizer, out, tokenizer_file)
        self.hf.save(model, out, tokenizer)

    def batch_memory(self, model_cfg, data_cfg: TextDataConfig) -> tuple[str, int, int]:
        tokens = data_cfg.batch_size * data_cfg.block_size
        return "batch_size", tokens, activation_bytes(tokens, model_cfg.d_model, model_cfg.n_layers)

    def prepare(self, spec: RunSpec) -> Prepared:
        model_cfg, data_cfg = spec.model_cfg, spec.data_cfg
        if data_cfg.block_size > model_cfg.max_seq_len:
            raise UserError(f"block_size must be <= max_seq_len={model_cfg.max_seq_len}, got {data_cfg.block_size}")
        train_text, val_text = split_text(read_text(data_cfg.dataset), data_cfg.train_fraction)
        if spec.resume:
            tokenizer = self.load_tokenizer(spec.out)
        else:
            t0 = time.perf_counter()
            tokenizer = build_tokenizer(data_cfg, train_text)
            log.info("built a %d-token %s tokenizer in %.1f s", tokenizer.vocab_size, data_cfg.tokenizer,
                     time.perf_counter() - t0)
            model_cfg = self.model_config.from_dict({**model_cfg.to_dict(), "vocab_size": tokenizer.vocab_size})
        train, val = encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)
        objective = LanguageModelObjective(train, val, data_cfg, spec.train_cfg.seed,
                                           getattr(model_cfg, "router_aux_loss_coef", 0.0), token_bytes(tokenizer))
        return Prepared(model_cfg, objective, save_files=lambda out: tokenizer.save(out / "tokenizer.json"),
                        summary=f"{len(train)} training tokens, {len(val)} validation tokens")

    def evaluate_run(self, run: LoadedModel, split: str | None, limit: int | None, dtype: str = "fp32") -> dict:
        """Validation loss (nats per token), perplexity and bits per byte on the held-out text ("val";
        "test" is the same text: these corpora have no third split) or the training text ("train"),
        scored once in consecutive blocks of block_size tokens; `limit`: the first N tokens only;
        `dtype`: the weights' precision (nn.quant_linear.set_dtype; block quantization: `quantizable` families).

        Returns:
            {"split", "n" (tokens scored), "val_loss", "perplexity", "bits_per_byte"}.
        """
        split = split or "val"
        if dtype in SCHEMES and not self.quantizable:
            raise UserError(f"dtype={dtype!r} (quantized weights) is not implemented for {self.described}; use "
                            f"fp32 or bf16", param="dtype")
        set_dtype(run.model, dtype)
        if split not in ("train", "val", "test"):
            raise UserError(f"unknown split {split!r}; known: train, val (test = val for a text corpus)")
        data_cfg = TextDataConfig.from_dict({**run.config["data"], "eval_tokens": limit})
        train_text, val_text = split_text(read_text(data_cfg.dataset), data_cfg.train_fraction)
        stream = encode_text(run.tokenizer, train_text if split == "train" else val_text)
        objective = LanguageModelObjective(stream, stream, data_cfg, token_bytes=token_bytes(run.tokenizer))
        record = objective.evaluate(run.model)
        n = record.pop("val_tokens")
        return {"split": "train" if split == "train" else "val", "n": n, **record}
