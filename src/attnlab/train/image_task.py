"""The image-classification task for the shared training loop: cross-entropy on augmented batches.

Shape legend: N images, B batch, C channels, H height, W width, K classes.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from attnlab.tasks.vision import ImageDataConfig

from attnlab.train.config import TrainConfig
from attnlab.data.images import normalize, random_shift


class ImageBatch(NamedTuple):
    """One training batch: which training images, and the seed of their augmentation."""

    indices: torch.Tensor  # (B,) int64 positions in the training images
    seed: int              # seeds random_shift, from (train seed, epoch, batch position)


class ImageClassificationTask:
    """Label-smoothed cross-entropy on randomly shifted, normalised training images; evaluation is
    accuracy and cross-entropy on the held-out images.

    An epoch visits every training image once, in the order of a permutation seeded by (seed, epoch),
    in batches of data_cfg.batch_size (the last one may be smaller). Each batch's shifts come from a
    generator seeded by (seed, epoch, batch position), so a resumed run sees the same batches.

    Args:
        train_images: (N, C, H, W) float32 in [0, 1]. train_labels: (N,) int64.
        test_images, test_labels: the held-out split, likewise.
        data_cfg: batch size and max_shift. train_cfg: seed and label smoothing.
        mean, std: the normalisation (the training split's statistics).
    """

    best_metric = "accuracy"
    higher_is_better = True
    eval_batch_size = 500

    def __init__(self, train_images: torch.Tensor, train_labels: torch.Tensor, test_images: torch.Tensor,
                 test_labels: torch.Tensor, data_cfg: ImageDataConfig, train_cfg: TrainConfig, mean: float, std: float):
        if len(train_images) == 0 or len(test_images) == 0:
            raise ValueError(f"need training and held-out images, got {len(train_images)} and {len(test_images)}")
        self.train_images, self.train_labels = train_images, train_labels
        self.test_images, self.test_labels = test_images, test_labels
        self.data_cfg, self.train_cfg, self.mean, self.std = data_cfg, train_cfg, mean, std

    def _seed(self, epoch: int, position: int = 0) -> int:
        return (self.train_cfg.seed * 1_000_003 + epoch) * 1_000_003 + position

    def batches(self, epoch: int) -> list[ImageBatch]:
        """Every batch of `epoch`: a seeded permutation of the training images, cut in batch_size pieces."""
        perm = torch.randperm(len(self.train_images), generator=torch.Generator().manual_seed(self._seed(epoch)))
        size = self.data_cfg.batch_size
        return [ImageBatch(perm[i:i + size], self._seed(epoch, 1 + i // size)) for i in range(0, len(perm), size)]

    def inputs(self, batch: ImageBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The augmented, normalised (B, C, H, W) images of a batch and their (B,) labels."""
        g = torch.Generator().manual_seed(batch.seed)
        images = random_shift(self.train_images[batch.indices], self.data_cfg.max_shift, g)
        return normalize(images, self.mean, self.std), self.train_labels[batch.indices]

    def loss(self, model, batch: ImageBatch) -> tuple[torch.Tensor, int]:
        """Mean label-smoothed cross-entropy of a batch (Szegedy et al. 2016, §7). Returns (loss, B)."""
        x, y = self.inputs(batch)
        logits = model(x)  # (B, K)
        return F.cross_entropy(logits.float(), y, label_smoothing=self.train_cfg.label_smoothing), len(y)

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """{"accuracy", "test_loss" (mean cross-entropy, no smoothing), "n"} on the held-out images."""
        correct, total = 0, 0.0
        for i in range(0, len(self.test_images), self.eval_batch_size):
            x = normalize(self.test_images[i:i + self.eval_batch_size], self.mean, self.std)
            y = self.test_labels[i:i + self.eval_batch_size]
            logits = model(x).float()  # (B, K)
            total += F.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.argmax(-1) == y).sum())
        n = len(self.test_images)
        return {"accuracy": round(correct / n, 5), "test_loss": round(total / n, 4), "n": n}
