"""Fine-tuning a BERT encoder for sentence classification (Devlin et al. 2019, §4.1): the objective
the loop trains.

Shape legend: B sentences, S tokens, C classes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.data.classification import length_grouped_batches, pad_batch
from attnlab.models.bert import Bert


class SentenceClassificationObjective:
    """Fine-tuning for sentence classification (BERT §4.1): cross-entropy of the classifier on the
    pooled [CLS] state; validation accuracy on the held-out split.

    Args:
        train, val: (token id lists, labels). pad_id: padding id. batch_size, seed, label_smoothing.
    """

    best_metric = "accuracy"
    higher_is_better = True
    leaves_parameters_unused = True  # the masked-LM head (DDP must look for unused parameters)

    def __init__(self, train, val, pad_id: int, batch_size: int, seed: int, label_smoothing: float = 0.0):
        self.train, self.val, self.pad_id = train, val, pad_id
        self.batch_size, self.seed, self.label_smoothing = batch_size, seed, label_smoothing

    def batches(self, epoch: int) -> list[list[int]]:
        return length_grouped_batches([len(x) for x in self.train[0]], self.batch_size, self.seed, epoch)

    def batch_rows(self, index: list[int]) -> int:
        return len(index)

    def shard(self, index: list[int], rows: range) -> list[int]:
        """The sentences `rows` of a batch (a process's part of it, data/sharding.py)."""
        return index[rows.start:rows.stop]

    def loss(self, model: Bert, index: list[int]) -> tuple[torch.Tensor, int]:
        ids, attention = pad_batch([self.train[0][i] for i in index], self.pad_id)
        labels = torch.tensor([self.train[1][i] for i in index])
        logits = model.classify(model(ids, attention))
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing), len(index)

    @torch.no_grad()
    def evaluate(self, model: Bert) -> dict:
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
