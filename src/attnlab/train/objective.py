"""What the training loop trains on: the Objective protocol, written once.

A task family (tasks/) builds one objective per run from its data; the loop (train/loop.py) and
the multi-process strategies (train/parallel.py) call nothing else on it. A batch is whatever the
objective chooses (offsets, sentence indices, ...): the loop only passes it back.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Objective(Protocol):
    """The data and the loss of one run.

    Attributes:
        best_metric: the key of evaluate()'s dict that picks the best weights (e.g. "val_loss").
        higher_is_better: whether a larger best_metric is better (accuracy, BLEU) or worse (a loss).
        leaves_parameters_unused: whether loss() leaves some parameters out of the graph (e.g.
            BERT's classifier during masked-LM pretraining): DDP must then look for unused ones.
    """

    best_metric: str
    higher_is_better: bool
    leaves_parameters_unused: bool

    def batches(self, epoch: int) -> list[Any]:
        """Every global batch of `epoch`, in order; the same list each time it is asked (a resume
        replays the same batches), seeded from the run's seed and `epoch`."""

    def batch_rows(self, batch: Any) -> int:
        """The rows (sequences, sentences, images) of `batch`: what several processes split."""

    def shard(self, batch: Any, rows: range) -> Any:
        """The part of `batch` made of `rows` (data/sharding.py: one process's share)."""

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """(the mean loss over the batch's counted items, their count): tokens, masked tokens,
        sentences or images; the loop weights micro-batches by the count."""

    def evaluate(self, model: nn.Module) -> dict:
        """The validation metrics of `model` (in eval mode, under no_grad), JSON-able, with
        best_metric among them."""
