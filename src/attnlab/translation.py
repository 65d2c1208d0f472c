"""Translation end to end: train a recipe, load a trained model, translate, evaluate with sacreBLEU."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from attnlab.models.seq2seq import Seq2SeqConfig

from attnlab.tasks.translation import TranslationDataConfig
from attnlab.data.translation import ParallelCorpus, read_parallel
from attnlab.models.seq2seq import Seq2SeqTransformer
from attnlab.tokenizers import ByteLevelBPE
from attnlab.runs import check_model_dir, fit, read_run_config, run_settings, start_run_dir
from attnlab.train.checkpoint import load_weights
from attnlab.train.translation_task import TranslationTask, corpus_bleu, decode_corpus

log = logging.getLogger("attnlab")
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]


def _saved_configs(path: Path) -> tuple[dict, Seq2SeqConfig, TranslationDataConfig, dict]:
    saved = read_run_config(path, "seq2seq")
    return saved, Seq2SeqConfig.from_dict(saved["model"]), TranslationDataConfig.from_dict(saved["data"]), saved["train"]


def train_translation(recipe, out: str | Path, resume: bool = False) -> dict:
    """Train `recipe` (recipes.Recipe) into run directory `out`.

    A new run trains the joint byte-level BPE on the training split of both languages, checks every
    setting by building the model, and only then writes tokenizer.json and config.json and trains.
    `resume` continues from out/checkpoint/ with the saved settings; the budgets of `recipe.train`
    apply and are totals (a finished run resumed with the same budget only reports its result).

    Returns:
        the final validation record with "best", "best_step", "parameters", "steps", "tokens_per_s".
    Raises:
        FileExistsError: when `out` is a file, or already holds a run and resume is False.
        FileNotFoundError: when resume is asked for but `out` has no checkpoint.
        DatasetNotFoundError: when the data set is missing (data/datasets.py).
        ValueError: for an invalid setting or a damaged run directory, naming what is wrong.
    """
    out = Path(out)
    _, model_cfg, data_cfg, train_cfg = run_settings(out, recipe, resume, _saved_configs)
    if resume:
        tokenizer = ByteLevelBPE.load(out / "tokenizer.json")
    src, tgt = read_parallel(data_cfg.dataset, "train", data_cfg.src_lang, data_cfg.tgt_lang)
    val_src, val_tgt = read_parallel(data_cfg.dataset, "val", data_cfg.src_lang, data_cfg.tgt_lang)
    if not resume:
        t0 = time.perf_counter()
        tokenizer = ByteLevelBPE.train(src + tgt, data_cfg.tokenizer_vocab_size, SPECIAL_TOKENS)
        log.info("trained a %d-token BPE in %.1f s", tokenizer.vocab_size, time.perf_counter() - t0)
        ids = tokenizer.special_tokens
        model_cfg = Seq2SeqConfig.from_dict({**model_cfg.to_dict(), "vocab_size": tokenizer.vocab_size,
                                             "pad_id": ids["<pad>"], "bos_id": ids["<bos>"], "eos_id": ids["<eos>"]})
    torch.manual_seed(train_cfg.seed)
    model = Seq2SeqTransformer(model_cfg)
    if not resume:  # every setting has been checked: now the run directory is written
        start_run_dir(out, {"model_type": "seq2seq", "recipe": recipe.name, "model": model_cfg.to_dict(),
                            "data": data_cfg.to_dict(), "train": train_cfg.to_dict()})
        tokenizer.save(out / "tokenizer.json")
    max_len = min(data_cfg.max_len, model_cfg.max_seq_len)
    train = ParallelCorpus.encode(tokenizer, src, tgt, max_len)
    val = ParallelCorpus.encode(tokenizer, val_src, val_tgt, max_len)
    task = TranslationTask(tokenizer, train, val, val_tgt, train_cfg, model_cfg.pad_id, model_cfg.bos_id,
                           model_cfg.eos_id)
    log.info("model: %.2fM parameters; %d training pairs, %d target tokens per epoch",
             model.num_parameters() / 1e6, len(train), train.target_tokens())
    return fit(model, task, train_cfg, out, resume)


def load_translator(path: str | Path) -> tuple[Seq2SeqTransformer, ByteLevelBPE, dict]:
    """Load a trained translation model directory (config.json, model.safetensors, tokenizer.json).

    Returns:
        (model in eval mode, tokenizer, the saved config dict).
    Raises:
        FileNotFoundError: naming the missing file or directory.
        ValueError: for a damaged config, a config of another model type, or weights that do not match.
    """
    path = Path(path)
    check_model_dir(path)
    saved, model_cfg, _, _ = _saved_configs(path)
    model = Seq2SeqTransformer(model_cfg)
    load_weights(model, path / "model.safetensors")
    return model.eval(), ByteLevelBPE.load(path / "tokenizer.json"), saved


def encode_sources(model: Seq2SeqTransformer, tokenizer, sentences: list[str]) -> list[list[int]]:
    """Tokenize source sentences, cutting any longer than max_seq_len with a warning."""
    limit = model.cfg.max_seq_len
    out = []
    for i, ids in enumerate(tokenizer.encode_batch(sentences)):
        if len(ids) > limit:
            log.warning("source %d has %d tokens; truncated to max_seq_len=%d", i + 1, len(ids), limit)
            ids = ids[:limit]
        out.append(ids)
    return out


def translate(model: Seq2SeqTransformer, tokenizer, sentences: list[str], beam_size: int = 4,
              alpha: float = 0.6) -> list[str]:
    """Translate sentences (beam search, or greedy with beam_size 1); one output per input."""
    with torch.no_grad():
        return decode_corpus(model, tokenizer, encode_sources(model, tokenizer, sentences), beam_size, alpha)


def evaluate_translation(path: str | Path, split: str = "test", limit: int | None = None,
                         beam_size: int = 4, alpha: float = 0.6) -> dict:
    """sacreBLEU of a trained model on a split ("val", "test" = the recipe's test split, or a file
    stem such as "test_2016_flickr"), against the raw references.

    Returns:
        {"split", "n", "bleu", "beam", "seconds"}.
    """
    model, tokenizer, saved = load_translator(path)
    data = saved["data"]
    splits = {"train": "train", "val": "val", "test": data["test_split"], data["test_split"]: data["test_split"]}
    if split not in splits:
        raise ValueError(f"unknown split {split!r}; known: train, val, test (= {data['test_split']})")
    name = splits[split]
    src, refs = read_parallel(data["dataset"], name, data["src_lang"], data["tgt_lang"])
    if limit is not None:
        src, refs = src[:limit], refs[:limit]
    t0 = time.perf_counter()
    hyps = translate(model, tokenizer, src, beam_size, alpha)
    return {"split": name, "n": len(src), "bleu": round(corpus_bleu(hyps, refs), 2), "beam": beam_size,
            "seconds": round(time.perf_counter() - t0, 1)}
