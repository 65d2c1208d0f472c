"""Masked-LM pretraining of a BERT encoder (Devlin et al. 2019, §3.1): the objective the loop trains.

Shape legend: B sentences, S tokens, V vocabulary.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.data.classification import length_grouped_batches, pad_batch
from attnlab.data.mlm import IGNORE, mask_tokens
from attnlab.models.bert import Bert, BertConfig
from attnlab.seeding import mix_seed
from attnlab.train.losses import perplexity


class MaskedLMObjective:
    """Masked-LM pretraining (BERT §3.1): cross-entropy of the original token at the chosen positions.

    Args:
        train, val: token id lists ([CLS] ... [SEP]). cfg: the BertConfig (pad/cls/sep/mask ids, V).
        batch_size, probability, seed: batching and masking. label_smoothing: of the loss.
    """

    best_metric = "mlm_loss"
    higher_is_better = False
    leaves_parameters_unused = True  # the classifier (DDP must look for unused parameters)

    def __init__(self, train, val, cfg: BertConfig, batch_size: int, probability: float, seed: int,
                 label_smoothing: float = 0.0):
        self.train, self.val, self.cfg = train, val, cfg
        self.batch_size, self.probability, self.seed = batch_size, probability, seed
        self.label_smoothing = label_smoothing
        special = torch.tensor([cfg.pad_id, cfg.cls_id, cfg.sep_id, cfg.mask_id])
        ordinary = torch.ones(cfg.vocab_size, dtype=torch.bool)
        ordinary[special] = False
        self.special, self.ordinary = special, ordinary.nonzero().flatten()

    def batches(self, epoch: int) -> list[tuple[int, int, list[int]]]:
        return [(epoch, i, b) for i, b in enumerate(length_grouped_batches([len(x) for x in self.train], self.batch_size,
                                                             self.seed, epoch))]

    def _masked(self, rows: list[list[int]], generator: torch.Generator):
        ids, attention = pad_batch(rows, self.cfg.pad_id)
        eligible = attention.bool() & ~torch.isin(ids, self.special)
        inputs, labels = mask_tokens(ids, eligible, self.cfg.mask_id, self.cfg.vocab_size, self.probability,
                                     generator, self.ordinary)
        return inputs, attention, labels

    def batch_rows(self, batch) -> int:
        return len(batch[2])

    def shard(self, batch, rows: range) -> tuple:
        """The sentences `rows` of a batch (a process's part of it, data/sharding.py): the whole
        batch is masked as in one process, then these rows are kept."""
        return (*batch[:3], rows)

    def loss(self, model: Bert, batch) -> tuple[torch.Tensor, int]:
        """batch: (epoch, position, sentence indices[, rows kept after masking the whole batch])."""
        epoch, position, index = batch[:3]
        g = torch.Generator().manual_seed(mix_seed(self.seed, epoch, position))
        inputs, attention, labels = self._masked([self.train[i] for i in index], g)
        if len(batch) > 3:
            keep = slice(batch[3].start, batch[3].stop)
            inputs, attention, labels = inputs[keep], attention[keep], labels[keep]
        chosen = labels != IGNORE
        logits = model.mlm_logits(model(inputs, attention)[chosen])  # the head only where a token is predicted
        loss = F.cross_entropy(logits.float(), labels[chosen], label_smoothing=self.label_smoothing)
        return loss, int(chosen.sum())

    @torch.no_grad()
    def evaluate(self, model: Bert) -> dict:
        """{"mlm_loss", "mlm_perplexity", "mlm_accuracy", "n"} on the validation sentences, masked with
        a fixed seed."""
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
        return {"mlm_loss": round(loss, 4), "mlm_perplexity": round(perplexity(loss), 2),
                "mlm_accuracy": round(correct / max(count, 1), 4), "n": count}
