"""BERT's two tasks for the shared training loop: masked-LM pretraining and sentence classification.

Shape legend: B sentences, S tokens, V vocabulary, C classes.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnlab.data.classification import pad_batch
from attnlab.data.mlm import IGNORE, mask_tokens


def _batches(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Seeded shuffled batches, sorted by length inside groups of 50 batches (less padding)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    group = batch_size * 50
    batches = []
    for start in range(0, len(order), group):
        chunk = sorted(order[start:start + group], key=lambda i: lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]


class MaskedLMTask:
    """Masked-LM pretraining (BERT §3.1): cross-entropy of the original token at the chosen positions.

    Args:
        train, val: token id lists ([CLS] ... [SEP]). cfg: the BertConfig (pad/cls/sep/mask ids, V).
        batch_size, probability, seed: batching and masking. label_smoothing: of the loss.
    """

    best_metric = "mlm_loss"
    higher_is_better = False

    def __init__(self, train, val, cfg, batch_size: int, probability: float, seed: int, label_smoothing: float = 0.0):
        self.train, self.val, self.cfg = train, val, cfg
        self.batch_size, self.probability, self.seed, self.label_smoothing = batch_size, probability, seed, label_smoothing
        special = torch.tensor([cfg.pad_id, cfg.cls_id, cfg.sep_id, cfg.mask_id])
        ordinary = torch.ones(cfg.vocab_size, dtype=torch.bool)
        ordinary[special] = False
        self.special, self.ordinary = special, ordinary.nonzero().flatten()

    def batches(self, epoch: int) -> list[tuple[int, int, list[int]]]:
        return [(epoch, i, b) for i, b in enumerate(_batches([len(x) for x in self.train], self.batch_size,
                                                             self.seed, epoch))]

    def _masked(self, rows: list[list[int]], generator: torch.Generator):
        ids, attention = pad_batch(rows, self.cfg.pad_id)
        eligible = attention.bool() & ~torch.isin(ids, self.special)
        inputs, labels = mask_tokens(ids, eligible, self.cfg.mask_id, self.cfg.vocab_size, self.probability,
                                     generator, self.ordinary)
        return inputs, attention, labels

    def loss(self, model, batch) -> tuple[torch.Tensor, int]:
        epoch, position, index = batch
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 1_000_003 + position)
        inputs, attention, labels = self._masked([self.train[i] for i in index], g)
        chosen = labels != IGNORE
        logits = model.mlm_logits(model(inputs, attention)[chosen])  # the head only where a token is predicted
        loss = F.cross_entropy(logits.float(), labels[chosen], label_smoothing=self.label_smoothing)
        return loss, int(chosen.sum())

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """{"mlm_loss", "mlm_accuracy", "n"} on the validation sentences, masked with a fixed seed."""
        g = torch.Generator().manual_seed(12345)
        total, correct, count = 0.0, 0, 0
        for start in range(0, len(self.val), 128):
            inputs, attention, labels = self._masked(self.val[start:start + 128], g)
            chosen = labels != IGNORE
            logits = model.mlm_logits(model(inputs, attention)[chosen]).float()
            total += F.cross_entropy(logits, labels[chosen], reduction="sum").item()
            correct += int((logits.argmax(-1) == labels[chosen]).sum())
            count += int(chosen.sum())
        loss = total / max(count, 1)
        return {"mlm_loss": round(loss, 4), "mlm_perplexity": round(math.exp(min(loss, 50)), 2),
                "mlm_accuracy": round(correct / max(count, 1), 4), "n": count}


class SentenceClassificationTask:
    """Fine-tuning for sentence classification (BERT §4.1): cross-entropy of the classifier on the
    pooled [CLS] state; validation accuracy on the held-out split.

    Args:
        train, val: (token id lists, labels). pad_id: padding id. batch_size, seed, label_smoothing.
    """

    best_metric = "accuracy"

    def __init__(self, train, val, pad_id: int, batch_size: int, seed: int, label_smoothing: float = 0.0):
        self.train, self.val, self.pad_id = train, val, pad_id
        self.batch_size, self.seed, self.label_smoothing = batch_size, seed, label_smoothing

    def batches(self, epoch: int) -> list[list[int]]:
        return _batches([len(x) for x in self.train[0]], self.batch_size, self.seed, epoch)

    def loss(self, model, index: list[int]) -> tuple[torch.Tensor, int]:
        ids, attention = pad_batch([self.train[0][i] for i in index], self.pad_id)
        labels = torch.tensor([self.train[1][i] for i in index])
        logits = model.classify(model(ids, attention))
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing), len(index)

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """{"accuracy", "val_loss", "n"} on the validation sentences."""
        total, correct = 0.0, 0
        ids_all, labels_all = self.val
        for start in range(0, len(ids_all), 128):
            ids, attention = pad_batch(ids_all[start:start + 128], self.pad_id)
            labels = torch.tensor(labels_all[start:start + 128])
            logits = model.classify(model(ids, attention)).float()
            total += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += int((logits.argmax(-1) == labels).sum())
        n = len(ids_all)
        return {"accuracy": round(correct / n, 4), "val_loss": round(total / n, 4), "n": n}
