"""Language models end to end: train a recipe, load a trained model, evaluate perplexity.

Generation lives in generate.py (the KV-cache decode loop and the sampling chain).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from attnlab.models.gpt import GPTConfig

from attnlab.tasks.language_model import TextDataConfig

from attnlab.train.config import TrainConfig
from attnlab.data.text import TokenStream, char_tokenizer, read_text, split_text
from attnlab.models.gpt import GPT
from attnlab.runs import check_model_dir, fit, read_run_config, run_settings, start_run_dir
from attnlab.tokenizers import ByteLevelBPE
from attnlab.train.checkpoint import load_weights
from attnlab.train.lm_task import LanguageModelTask

log = logging.getLogger("attnlab")


def build_tokenizer(data_cfg: TextDataConfig, train_text: str) -> ByteLevelBPE:
    """Characters of the training text ("char"), or a byte-level BPE trained on it ("bpe")."""
    if data_cfg.tokenizer == "char":
        return char_tokenizer(train_text)
    return ByteLevelBPE.train([train_text], data_cfg.tokenizer_vocab_size)


def _token_bytes(tokenizer: ByteLevelBPE) -> torch.Tensor:
    """(V,) int64 bytes per token id (0 for unused ids)."""
    sizes = []
    for i in range(tokenizer.vocab_size):
        try:
            sizes.append(len(tokenizer.token_bytes(i)))
        except KeyError:
            sizes.append(0)
    return torch.tensor(sizes)


def _encode(tokenizer: ByteLevelBPE, text: str) -> TokenStream:
    return TokenStream(torch.tensor(tokenizer.encode(text), dtype=torch.long))


def _saved_configs(path: Path) -> tuple[dict, GPTConfig, TextDataConfig, dict]:
    saved = read_run_config(path, "gpt")
    return saved, GPTConfig.from_dict(saved["model"]), TextDataConfig.from_dict(saved["data"]), saved["train"]


def train_lm(recipe, out: str | Path, resume: bool = False) -> dict:
    """Train language-model `recipe` (recipes.Recipe with a GPTConfig) into run directory `out`.

    A new run builds the tokenizer from the training split, checks every setting by building the
    model, and only then writes tokenizer.json and config.json. `resume` continues from
    out/checkpoint/ with the saved settings; recipe.train's budgets apply and are totals.

    Returns:
        the final validation record with "best", "best_step", "parameters", "steps", "tokens_per_s".
    Raises:
        FileExistsError / FileNotFoundError: for an `out` that cannot be used (see runs.check_out_dir).
        DatasetNotFoundError: when the text is missing. ValueError: for an invalid setting.
    """
    out = Path(out)
    _, model_cfg, data_cfg, train_cfg = run_settings(out, recipe, resume, _saved_configs)
    if data_cfg.block_size > model_cfg.max_seq_len:
        raise ValueError(f"block_size must be <= max_seq_len={model_cfg.max_seq_len}, got {data_cfg.block_size}")
    train_text, val_text = split_text(read_text(data_cfg.dataset), data_cfg.train_fraction)
    if resume:
        tokenizer = ByteLevelBPE.load(out / "tokenizer.json")
    else:
        t0 = time.perf_counter()
        tokenizer = build_tokenizer(data_cfg, train_text)
        log.info("built a %d-token %s tokenizer in %.1f s", tokenizer.vocab_size, data_cfg.tokenizer,
                 time.perf_counter() - t0)
        model_cfg = GPTConfig.from_dict({**model_cfg.to_dict(), "vocab_size": tokenizer.vocab_size})
    train, val = _encode(tokenizer, train_text), _encode(tokenizer, val_text)
    task = LanguageModelTask(train, val, data_cfg, train_cfg, model_cfg.router_aux_loss_coef, _token_bytes(tokenizer))
    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg)
    if not resume:  # every setting has been checked: now the run directory is written
        start_run_dir(out, {"model_type": "gpt", "recipe": recipe.name, "model": model_cfg.to_dict(),
                            "data": data_cfg.to_dict(), "train": train_cfg.to_dict()})
        tokenizer.save(out / "tokenizer.json")
    log.info("model: %.2fM parameters; %d training tokens, %d validation tokens", model.num_parameters() / 1e6,
             len(train), len(val))
    return fit(model, task, train_cfg, out, resume)


def load_lm(path: str | Path) -> tuple[GPT, ByteLevelBPE, dict]:
    """Load a trained language-model directory (config.json, model.safetensors, tokenizer.json).

    Returns:
        (model in eval mode, tokenizer, the saved config dict).
    Raises:
        FileNotFoundError: naming the missing file. ValueError: for a damaged config, another
            model type, or weights that do not match.
    """
    path = Path(path)
    check_model_dir(path)
    saved, model_cfg, _, _ = _saved_configs(path)
    model = GPT(model_cfg)
    load_weights(model, path / "model.safetensors")
    return model.eval(), ByteLevelBPE.load(path / "tokenizer.json"), saved


def evaluate_lm(path: str | Path, split: str = "val", limit: int | None = None) -> dict:
    """Validation loss (nats per token), perplexity and bits per byte of a trained language model on
    the held-out text ("val"; "test" is the same text: these corpora have no third split) or the
    training text ("train"), scored once in consecutive blocks of block_size tokens.

    Args:
        limit: score only the first `limit` tokens.
    Returns:
        {"split", "n" (tokens scored), "val_loss", "perplexity", "bits_per_byte", "seconds"}.
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"unknown split {split!r}; known: train, val (test = val for a text corpus)")
    model, tokenizer, saved = load_lm(path)
    data_cfg = TextDataConfig.from_dict(saved["data"])
    data_cfg = TextDataConfig.from_dict({**data_cfg.to_dict(), "eval_tokens": limit})
    train_text, val_text = split_text(read_text(data_cfg.dataset), data_cfg.train_fraction)
    stream = _encode(tokenizer, train_text if split == "train" else val_text)
    task = LanguageModelTask(stream, stream, data_cfg, TrainConfig(), 0.0, _token_bytes(tokenizer))
    t0 = time.perf_counter()
    record = task.evaluate(model)
    n = record.pop("val_tokens")
    return {"split": "train" if split == "train" else "val", "n": n, **record,
            "seconds": round(time.perf_counter() - t0, 1)}
