"""Translation with the encoder–decoder Transformer: its data config, the teacher-forcing objective,
decoding a corpus, sacreBLEU, and the task (train / load / evaluate a run).

Shape legend: B sentences, S source length, T target length, D model dim, V vocabulary, N real target tokens.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import sacrebleu
import torch

from attnlab.config import Config, check, check_literals
from attnlab.data.rampup import rampup_batches
from attnlab.data.translation import ParallelCorpus, collate, pad_batch, read_parallel, token_batches
from attnlab.errors import UserError
from attnlab.generate import beam_search, greedy_decode
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn.linear_cross_entropy import linear_cross_entropy
from attnlab.seeding import mix_seed
from attnlab.tasks.base import Prepared, RunSpec, Task
from attnlab.tasks.kinds import Kind
from attnlab.tasks.loaded import LoadedModel
from attnlab.tokenizers import ByteLevelBPE
from attnlab.train.guards import activation_bytes
from attnlab.train.losses import perplexity

log = logging.getLogger("attnlab")
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]


@dataclass
class TranslationDataConfig(Config):
    """Which parallel data a translation recipe trains on, how it is tokenized and batched, the
    objective's label smoothing, and how the run decodes at evaluation."""

    dataset: Literal["multi30k"] = "multi30k"  # data set name (data/datasets.py)
    src_lang: Literal["en", "de", "fr"] = "en"  # source language
    tgt_lang: Literal["en", "de", "fr"] = "de"  # target language
    tokenizer_vocab_size: int = 8000  # joint byte-level BPE vocabulary size, special tokens included
    max_len: int = 128                # longer training pairs are truncated to this many tokens
    test_split: Literal["test_2016_flickr"] = "test_2016_flickr"  # the split `evaluate --split test` reads
    batch_tokens: int = 4000          # padded tokens per batch (length-bucketed batches, paper §5.1)
    batch_tokens_start: int = 0       # batch-size warm-up (data/rampup.py): the run's first batch holds at most
    # this many padded tokens, the cap growing linearly to batch_tokens over its first batch_rampup batches
    batch_rampup: int = 0             # batches the ramp lasts (within the first epoch); 0 = every batch full size
    label_smoothing: float = 0.1      # ε_ls of the loss (paper §5.4)
    eval_bleu_sentences: int = 500    # validation sentences decoded (greedy) for BLEU at each evaluation
    best_metric: Literal["val_bleu", "val_loss"] = "val_bleu"  # what picks the kept weights: that greedy
    # BLEU (higher is better) or the validation per-token NLL over the whole split (lower is better)
    beam_size: int = 4                # beam width of `evaluate` and `translate` by default (paper §6.1)
    length_penalty: float = 0.6       # α of the GNMT length penalty in beam search (paper §6.1)
    beam_stopping: Literal["exact", "heuristic"] = "exact"  # when a sentence's beam stops (generate.beam_search)

    def __post_init__(self):
        check_literals(self)
        check(self.src_lang != self.tgt_lang, "tgt_lang", f"different from src_lang={self.src_lang!r}", self.tgt_lang)
        check(self.tokenizer_vocab_size >= 259, "tokenizer_vocab_size", ">= 259 (256 bytes + 3 specials)",
              self.tokenizer_vocab_size)
        check(self.max_len >= 2, "max_len", ">= 2", self.max_len)
        for name in ("batch_tokens", "eval_bleu_sentences"):
            check(getattr(self, name) > 0, name, "> 0", getattr(self, name))
        check(self.batch_rampup >= 0, "batch_rampup", ">= 0", self.batch_rampup)
        if self.batch_rampup:
            check(0 < self.batch_tokens_start <= self.batch_tokens, "batch_tokens_start",
                  f"in 1..batch_tokens={self.batch_tokens} when batch_rampup={self.batch_rampup} > 0 (or set "
                  f"batch_rampup=0: no batch warm-up)", self.batch_tokens_start)
        else:
            check(self.batch_tokens_start == 0, "batch_tokens_start", "0 when batch_rampup is 0 (no ramp)",
                  self.batch_tokens_start)
        check(0.0 <= self.label_smoothing < 1.0, "label_smoothing", "in [0, 1)", self.label_smoothing)
        check(1 <= self.beam_size <= 64, "beam_size", "in 1..64", self.beam_size)
        check(self.length_penalty >= 0, "length_penalty", ">= 0", self.length_penalty)


def teacher_forcing_loss(model: Seq2SeqTransformer, src: torch.Tensor, tgt_in: torch.Tensor,
                         labels: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, int]:
    """Mean label-smoothed cross-entropy over the real (non-pad) target tokens.

    The output projection runs only on the positions that have a label, which saves the
    (B·T − N)·D·V multiply-adds of padded positions; in a training step it runs fused with the loss,
    in chunks of rows, its gradient taken in the forward pass, also under bf16 autocast
    (nn/linear_cross_entropy.py: the step 1.23x faster than with the composition on an AMD EPYC Zen 3
    in fp32, 1.45x on a Zen 5 under bf16 autocast, bench/train_step.py).

    Args:
        src: (B, S), tgt_in: (B, T) (<bos> + target), labels: (B, T) (target + <eos>), int64.
    Returns:
        (scalar loss, N real target tokens).
    Source: Vaswani et al. 2017, §5.4 (label smoothing); teacher forcing: Williams & Zipser 1989.
    """
    pad = model.cfg.pad_id
    memory, src_mask = model.encode(src)
    h = model.decode(tgt_in, memory, src_mask)  # (B, T, D)
    keep = labels != pad
    loss = linear_cross_entropy(h[keep], model.lm_head, labels[keep], epsilon, pad_id=pad)
    return loss, int(keep.sum())


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacreBLEU (13a tokenization, the standard) of detokenized hypotheses against raw references."""
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def decode_corpus(model: Seq2SeqTransformer, tokenizer, sources: list[list[int]], beam_size: int = 1,
                  alpha: float = 0.6, batch_rows: int = 128, early_stopping: str = "exact") -> list[str]:
    """Translate tokenized sources to text, in input order.

    Sources are sorted by length so that each batch holds similar lengths (little padding); a batch
    holds batch_rows // beam_size sentences. beam_size 1 is greedy decoding; early_stopping is beam
    search's stopping rule ("exact" or "heuristic", generate.beam_search).
    """
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    n = max(1, batch_rows // beam_size)
    out: list[str] = [""] * len(sources)
    for start in range(0, len(order), n):
        idx = order[start:start + n]
        src = pad_batch([sources[j] for j in idx], model.cfg.pad_id)
        ids = (greedy_decode(model, src) if beam_size == 1
               else beam_search(model, src, beam_size, alpha, early_stopping=early_stopping))
        for j, seq in zip(idx, ids):
            out[j] = tokenizer.decode(seq, skip_special=True).strip()
    return out


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
              alpha: float = 0.6, early_stopping: str = "exact") -> list[str]:
    """Translate sentences (beam search, or greedy with beam_size 1); one output per input."""
    with torch.no_grad():
        return decode_corpus(model, tokenizer, encode_sources(model, tokenizer, sentences), beam_size, alpha,
                             early_stopping=early_stopping)


class TranslationObjective:
    """Training data, objective and validation of a translation run, for the loop (train/loop.py):
    token-count batches, the label-smoothed teacher-forcing loss, validation loss + greedy BLEU.
    The kept weights are the best by data_cfg.best_metric: "val_bleu" (greedy BLEU of the first
    eval_bleu_sentences validation sentences) or "val_loss" (the whole split's NLL: less noisy, and
    the one that agrees with beam search at the end of a cosine run, see recipes/multi30k_en_de.py)."""

    best_metric, higher_is_better = "val_bleu", True  # the default; each run's from its data_cfg
    leaves_parameters_unused = False

    def __init__(self, tokenizer, train: ParallelCorpus, val: ParallelCorpus, val_refs: list[str],
                 data_cfg: TranslationDataConfig, seed: int, pad_id: int, bos_id: int, eos_id: int):
        self.tokenizer, self.train, self.val, self.val_refs = tokenizer, train, val, val_refs
        self.data_cfg, self.seed, self.ids = data_cfg, seed, (pad_id, bos_id, eos_id)
        self.best_metric = data_cfg.best_metric
        self.higher_is_better = data_cfg.best_metric == "val_bleu"

    def batches(self, epoch: int) -> list[list[int]]:
        """The batches of `epoch`: token_batches, the first epoch's first ones cut to the batch-size
        warm-up (data_cfg.batch_tokens_start, batch_rampup; data/rampup.py)."""
        cfg = self.data_cfg
        batches = token_batches(self.train, cfg.batch_tokens, seed=mix_seed(self.seed, epoch))
        if epoch > 0 or not cfg.batch_rampup:
            return batches
        return rampup_batches(batches, self.train.row_tokens(), cfg.batch_tokens_start, cfg.batch_tokens, cfg.batch_rampup)

    def batch_rows(self, batch: list[int]) -> int:
        return len(batch)

    def shard(self, batch: list[int], rows: range) -> list[int]:
        """The sentence pairs `rows` of a batch (a process's part of it, data/sharding.py)."""
        return batch[rows.start:rows.stop]

    def loss(self, model: Seq2SeqTransformer, batch: list[int]) -> tuple[torch.Tensor, int]:
        src, tgt_in, labels = collate(self.train, batch, *self.ids)
        return teacher_forcing_loss(model, src, tgt_in, labels, self.data_cfg.label_smoothing)

    def evaluate(self, model: Seq2SeqTransformer) -> dict:
        """Validation: per-token NLL ("val_loss", no smoothing), perplexity, and greedy BLEU on the
        first data_cfg.eval_bleu_sentences sentences ("val_bleu")."""
        total, count = 0.0, 0
        for batch in token_batches(self.val, self.data_cfg.batch_tokens, seed=0):
            src, tgt_in, labels = collate(self.val, batch, *self.ids)
            loss, n = teacher_forcing_loss(model, src, tgt_in, labels, 0.0)
            total, count = total + loss.item() * n, count + n
        k = min(self.data_cfg.eval_bleu_sentences, len(self.val))
        hyps = decode_corpus(model, self.tokenizer, self.val.src[:k])
        nll = total / max(count, 1)
        return {"val_loss": round(nll, 4), "val_ppl": round(perplexity(nll), 2),
                "val_bleu": round(corpus_bleu(hyps, self.val_refs[:k]), 2)}


class TranslationTask(Task):
    """Encoder–decoder translation runs ("seq2seq"): a joint byte-level BPE trained on both sides of
    the training split, the Transformer of Vaswani et al. 2017, sacreBLEU of beam search."""

    model_type, kind = "seq2seq", Kind.SEQ2SEQ
    model_class = Seq2SeqTransformer
    model_config = Seq2SeqConfig
    data_config = TranslationDataConfig
    evaluate_options = ("beam", "length_penalty")

    def load_tokenizer(self, path: Path) -> ByteLevelBPE:
        return ByteLevelBPE.load(path / "tokenizer.json")

    def batch_memory(self, model_cfg: Seq2SeqConfig, data_cfg: TranslationDataConfig) -> tuple[str, int, int]:
        tokens, layers = data_cfg.batch_tokens, model_cfg.n_encoder_layers + model_cfg.n_decoder_layers
        return "batch_tokens", tokens, activation_bytes(tokens, model_cfg.d_model, layers)

    def prepare(self, spec: RunSpec) -> Prepared:
        data_cfg, model_cfg = spec.data_cfg, spec.model_cfg
        src, tgt = read_parallel(data_cfg.dataset, "train", data_cfg.src_lang, data_cfg.tgt_lang)
        val_src, val_tgt = read_parallel(data_cfg.dataset, "val", data_cfg.src_lang, data_cfg.tgt_lang)
        if spec.resume:
            tokenizer = self.load_tokenizer(spec.out)
        else:
            t0 = time.perf_counter()
            tokenizer = ByteLevelBPE.train(src + tgt, data_cfg.tokenizer_vocab_size, SPECIAL_TOKENS)
            log.info("trained a %d-token BPE in %.1f s", tokenizer.vocab_size, time.perf_counter() - t0)
            ids = tokenizer.special_tokens
            model_cfg = Seq2SeqConfig.from_dict({**model_cfg.to_dict(), "vocab_size": tokenizer.vocab_size,
                                                 "pad_id": ids["<pad>"], "bos_id": ids["<bos>"],
                                                 "eos_id": ids["<eos>"]})
        max_len = min(data_cfg.max_len, model_cfg.max_seq_len)
        train = ParallelCorpus.encode(tokenizer, src, tgt, max_len)
        val = ParallelCorpus.encode(tokenizer, val_src, val_tgt, max_len)
        objective = TranslationObjective(tokenizer, train, val, val_tgt, data_cfg, spec.train_cfg.seed,
                                         model_cfg.pad_id, model_cfg.bos_id, model_cfg.eos_id)
        return Prepared(model_cfg, objective, save_files=lambda out: tokenizer.save(out / "tokenizer.json"),
                        summary=f"{len(train)} training pairs, {train.target_tokens()} target tokens per epoch")

    def evaluate_run(self, run: LoadedModel, split: str | None, limit: int | None, beam: int | None = None,
                     length_penalty: float | None = None) -> dict:
        """sacreBLEU on a split ("val", "test" = the recipe's test split, or a file stem such as
        "test_2016_flickr") against the raw references, decoding with `beam` (default: the run's
        beam_size), `length_penalty` (α of the GNMT penalty, Wu et al. 2016 §7; default: the run's)
        and the run's beam_stopping.

        Returns:
            {"split", "n", "bleu", "beam", "length_penalty"}.
        """
        data = TranslationDataConfig.from_dict(run.config["data"])
        splits = {"train": "train", "val": "val", "test": data.test_split, data.test_split: data.test_split}
        split = split or "test"
        if split not in splits:
            raise UserError(f"unknown split {split!r}; known: train, val, test (= {data.test_split})")
        name = splits[split]
        src, refs = read_parallel(data.dataset, name, data.src_lang, data.tgt_lang)
        if limit is not None:
            src, refs = src[:limit], refs[:limit]
        beam = beam or data.beam_size
        alpha = data.length_penalty if length_penalty is None else length_penalty
        if not alpha >= 0:  # NaN too
            raise UserError(f"length_penalty must be >= 0, got {alpha}", param="length_penalty")
        hyps = translate(run.model, run.tokenizer, src, beam, alpha, data.beam_stopping)
        return {"split": name, "n": len(src), "bleu": round(corpus_bleu(hyps, refs), 2), "beam": beam,
                "length_penalty": alpha}
