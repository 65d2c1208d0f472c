"""The translation task for the training loop: token-count batches, the label-smoothed
teacher-forcing loss, and validation loss + BLEU."""
from __future__ import annotations

import math

import sacrebleu
import torch

from attnlab.train.config import TrainConfig
from attnlab.data.translation import ParallelCorpus, collate, pad_batch, token_batches
from attnlab.generate import beam_search, greedy_decode
from attnlab.models.seq2seq import Seq2SeqTransformer
from attnlab.train.losses import label_smoothed_cross_entropy


def teacher_forcing_loss(model: Seq2SeqTransformer, src: torch.Tensor, tgt_in: torch.Tensor,
                         labels: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, int]:
    """Mean label-smoothed cross-entropy over the real (non-pad) target tokens.

    The output projection runs only on the positions that have a label, which saves the
    (B·T − N)·D·V multiply-adds of padded positions.

    Args:
        src: (B, S), tgt_in: (B, T) (<bos> + target), labels: (B, T) (target + <eos>), int64.
    Returns:
        (scalar loss, N real target tokens).
    """
    pad = model.cfg.pad_id
    memory, src_mask = model.encode(src)
    h = model.decode(tgt_in, memory, src_mask)  # (B, T, D)
    keep = labels != pad
    logits = model.output_logits(h[keep])  # (N, V)
    return label_smoothed_cross_entropy(logits, labels[keep], epsilon, pad_id=pad), int(keep.sum())


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacreBLEU (13a tokenization, the standard) of detokenized hypotheses against raw references."""
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def decode_corpus(model: Seq2SeqTransformer, tokenizer, sources: list[list[int]], beam_size: int = 1,
                  alpha: float = 0.6, batch_rows: int = 128) -> list[str]:
    """Translate tokenized sources to text, in input order.

    Sources are sorted by length so that each batch holds similar lengths (little padding); a batch
    holds batch_rows // beam_size sentences. beam_size 1 is greedy decoding.
    """
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    n = max(1, batch_rows // beam_size)
    out: list[str] = [""] * len(sources)
    for start in range(0, len(order), n):
        idx = order[start:start + n]
        src = pad_batch([sources[j] for j in idx], model.cfg.pad_id)
        ids = greedy_decode(model, src) if beam_size == 1 else beam_search(model, src, beam_size, alpha)
        for j, seq in zip(idx, ids):
            out[j] = tokenizer.decode(seq, skip_special=True).strip()
    return out


class TranslationTask:
    """Training data, objective and validation of a translation run (see train/loop.py)."""

    best_metric = "val_bleu"

    def __init__(self, tokenizer, train: ParallelCorpus, val: ParallelCorpus, val_refs: list[str],
                 cfg: TrainConfig, pad_id: int, bos_id: int, eos_id: int):
        self.tokenizer, self.train, self.val, self.val_refs, self.cfg = tokenizer, train, val, val_refs, cfg
        self.ids = (pad_id, bos_id, eos_id)

    def batches(self, epoch: int) -> list[list[int]]:
        return token_batches(self.train, self.cfg.batch_tokens, seed=self.cfg.seed * 100003 + epoch)

    def loss(self, model: Seq2SeqTransformer, batch: list[int]) -> tuple[torch.Tensor, int]:
        src, tgt_in, labels = collate(self.train, batch, *self.ids)
        return teacher_forcing_loss(model, src, tgt_in, labels, self.cfg.label_smoothing)

    def evaluate(self, model: Seq2SeqTransformer) -> dict:
        """Validation: per-token NLL ("val_loss", no smoothing), perplexity, and greedy BLEU on the
        first cfg.eval_bleu_sentences sentences ("val_bleu")."""
        total, count = 0.0, 0
        for batch in token_batches(self.val, self.cfg.batch_tokens, seed=0):
            src, tgt_in, labels = collate(self.val, batch, *self.ids)
            loss, n = teacher_forcing_loss(model, src, tgt_in, labels, 0.0)
            total, count = total + loss.item() * n, count + n
        k = min(self.cfg.eval_bleu_sentences, len(self.val))
        hyps = decode_corpus(model, self.tokenizer, self.val.src[:k])
        nll = total / max(count, 1)
        return {"val_loss": round(nll, 4), "val_ppl": round(math.exp(min(nll, 50)), 2),
                "val_bleu": round(corpus_bleu(hyps, self.val_refs[:k]), 2)}
