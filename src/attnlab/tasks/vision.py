"""Image classification with the Vision Transformer: the task."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab.config import Config, check, check_literals


@dataclass
class ImageDataConfig(Config):
    """Which images an image-classification recipe trains on, its split and augmentation."""

    dataset: Literal["mnist", "digits"] = "mnist"  # data set name (data/datasets.py)
    n_train: int = 8000               # images for training (seeded split of the data set)
    n_test: int = 2000                # held-out images for evaluation
    batch_size: int = 128             # images per batch
    max_shift: int = 0                # random translation augmentation, in pixels (0 = none)

    def __post_init__(self):
        check_literals(self)
        for name in ("n_train", "n_test", "batch_size"):
            check(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        check(self.max_shift >= 0, "max_shift", ">= 0", self.max_shift)


