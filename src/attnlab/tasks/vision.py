"""Image classification with the Vision Transformer: the data config, the objective (cross-entropy on
augmented batches), and the task (train / load / evaluate a run, classify image files).

A ViT run directory holds config.json (with "normalization": {"mean", "std"}, "labels" and
"split_seed" beside the usual sections), model.safetensors, metrics.jsonl and checkpoint/; there
is no tokenizer.json.

Shape legend: N images, B batch, C channels, H height, W width, K classes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Optional

import torch
import torch.nn.functional as F

from attnlab.config import Config, check, check_literals
from attnlab.data.images import SPLIT_SEED, load_images, normalization, normalize, random_shift, read_image_file, split
from attnlab.errors import UserError
from attnlab.models.vit import ViTConfig, VisionTransformer
from attnlab.seeding import mix_seed
from attnlab.tasks.base import Prepared, RunSpec, Task
from attnlab.tasks.kinds import Kind
from attnlab.tasks.loaded import LoadedModel
from attnlab.train.guards import activation_bytes


@dataclass
class ImageDataConfig(Config):
    """Which images an image-classification recipe trains on, its split, batches and augmentation, and
    the loss's label smoothing."""

    dataset: Literal["mnist", "digits"] = "mnist"  # data set name (data/datasets.py)
    n_train: int = 8000               # images for training (seeded split of the data set)
    n_test: int = 2000                # held-out images for evaluation
    batch_size: int = 128             # images per batch
    max_shift: int = 0                # random translation augmentation, in pixels (0 = none)
    label_smoothing: float = 0.1      # ε_ls of the loss (ViT's ImageNet training: 0.1)

    def __post_init__(self):
        check_literals(self)
        for name in ("n_train", "n_test", "batch_size"):
            check(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        check(0.0 <= self.label_smoothing < 1.0, "label_smoothing", "in [0, 1)", self.label_smoothing)
        check(self.max_shift >= 0, "max_shift", ">= 0", self.max_shift)


class ImageBatch(NamedTuple):
    """One training batch: which training images, and the seed of their augmentation."""

    indices: torch.Tensor  # (B,) int64 positions in the training images
    seed: int              # seeds random_shift, from (train seed, epoch, batch position)
    rows: Optional[range] = None  # a process's part of the batch (data/sharding.py); None = all


class ImageClassificationObjective:
    """Label-smoothed cross-entropy on randomly shifted, normalised training images; evaluation is
    accuracy and cross-entropy on the held-out images.

    An epoch visits every training image once, in the order of a permutation seeded by (seed, epoch),
    in batches of data_cfg.batch_size (the last one may be smaller). Each batch's shifts come from a
    generator seeded by (seed, epoch, batch position), so a resumed run sees the same batches.

    Args:
        train_images: (N, C, H, W) float32 in [0, 1]. train_labels: (N,) int64.
        test_images, test_labels: the held-out split, likewise.
        data_cfg: batch size, max_shift and label smoothing. seed: the run's seed.
        mean, std: the normalisation (the training split's statistics).
    """

    best_metric = "accuracy"
    higher_is_better = True
    leaves_parameters_unused = False
    eval_batch_size = 500

    def __init__(self, train_images: torch.Tensor, train_labels: torch.Tensor, test_images: torch.Tensor,
                 test_labels: torch.Tensor, data_cfg: ImageDataConfig, seed: int, mean: float, std: float):
        if len(train_images) == 0 or len(test_images) == 0:
            raise UserError(f"need training and held-out images, got {len(train_images)} and {len(test_images)}")
        self.train_images, self.train_labels = train_images, train_labels
        self.test_images, self.test_labels = test_images, test_labels
        self.data_cfg, self.seed, self.mean, self.std = data_cfg, seed, mean, std

    def _seed(self, epoch: int, position: int = 0) -> int:
        return mix_seed(self.seed, epoch, position)

    def batches(self, epoch: int) -> list[ImageBatch]:
        """Every batch of `epoch`: a seeded permutation of the training images, cut in batch_size pieces."""
        perm = torch.randperm(len(self.train_images), generator=torch.Generator().manual_seed(self._seed(epoch)))
        size = self.data_cfg.batch_size
        return [ImageBatch(perm[i:i + size], self._seed(epoch, 1 + i // size)) for i in range(0, len(perm), size)]

    def batch_rows(self, batch: ImageBatch) -> int:
        return len(batch.indices)

    def shard(self, batch: ImageBatch, rows: range) -> ImageBatch:
        """The images `rows` of a batch (a process's part of it, data/sharding.py), shifted as in
        the whole batch."""
        return batch._replace(rows=rows)

    def inputs(self, batch: ImageBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The augmented, normalised (B, C, H, W) images of a batch (its `rows` only, when set; the
        shifts are drawn for the whole batch, as in one process) and their (B,) labels."""
        g = torch.Generator().manual_seed(batch.seed)
        images = random_shift(self.train_images[batch.indices], self.data_cfg.max_shift, g)
        labels = self.train_labels[batch.indices]
        if batch.rows is not None:
            keep = slice(batch.rows.start, batch.rows.stop)
            images, labels = images[keep], labels[keep]
        return normalize(images, self.mean, self.std), labels

    def loss(self, model, batch: ImageBatch) -> tuple[torch.Tensor, int]:
        """Mean label-smoothed cross-entropy of a batch (Szegedy et al. 2016, §7). Returns (loss, B)."""
        x, y = self.inputs(batch)
        logits = model(x)  # (B, K)
        return F.cross_entropy(logits.float(), y, label_smoothing=self.data_cfg.label_smoothing), len(y)

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


def _check_data(images: torch.Tensor, labels: torch.Tensor, model_cfg: ViTConfig, dataset: str) -> None:
    _, c, h, w = images.shape
    if c != model_cfg.in_channels:
        raise UserError(f"data set {dataset!r} has {c}-channel images, in_channels is {model_cfg.in_channels}")
    if h != model_cfg.image_size or w != model_cfg.image_size:
        raise UserError(f"data set {dataset!r} has {h}×{w} images, image_size is {model_cfg.image_size}")
    if int(labels.max()) >= model_cfg.n_classes:
        raise UserError(f"data set {dataset!r} has labels up to {int(labels.max())}, n_classes is "
                        f"{model_cfg.n_classes}")


def image_splits(data_cfg: ImageDataConfig, model_cfg: ViTConfig,
                 seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{"train": (images, labels), "test": (images, labels)} of the seeded split, checked against the model."""
    images, labels = load_images(data_cfg.dataset)
    _check_data(images, labels, model_cfg, data_cfg.dataset)
    train_idx, test_idx = split(len(images), data_cfg.n_train, data_cfg.n_test, seed)
    return {"train": (images[train_idx], labels[train_idx]), "test": (images[test_idx], labels[test_idx])}


class VisionTask(Task):
    """Vision Transformer classification runs ("vit"): a seeded split of MNIST or the UCI digits,
    normalised with the training split's statistics; accuracy on the held-out images."""

    model_type, model_class, model_config, data_config = "vit", VisionTransformer, ViTConfig, ImageDataConfig
    kind, classifies, takes_images = Kind.CLASSIFIER, True, True
    rate_key = "images_per_s"
    run_files = ("config.json", "model.safetensors")

    def load_tokenizer(self, path: Path) -> None:
        return None

    def read_config(self, path: Path):
        saved, model_cfg, data_cfg, train = super().read_config(path)
        norm = saved.get("normalization")
        if not isinstance(norm, dict) or not {"mean", "std"} <= set(norm):
            raise UserError(f"{path / 'config.json'}: missing section 'normalization' with mean and std")
        return saved, model_cfg, data_cfg, train

    def batch_memory(self, model_cfg: ViTConfig, data_cfg: ImageDataConfig) -> tuple[str, int, int]:
        patches = data_cfg.batch_size * (model_cfg.grid ** 2 + 1)  # + the [class] token of each image
        return "batch_size", patches, activation_bytes(patches, model_cfg.d_model, model_cfg.n_layers)

    def prepare(self, spec: RunSpec) -> Prepared:
        model_cfg, data_cfg = spec.model_cfg, spec.data_cfg
        split_seed = spec.saved.get("split_seed", SPLIT_SEED) if spec.saved else SPLIT_SEED
        data = image_splits(data_cfg, model_cfg, split_seed)
        mean, std = normalization(data["train"][0])
        objective = ImageClassificationObjective(*data["train"], *data["test"], data_cfg, spec.train_cfg.seed,
                                                 mean, std)
        info = {"normalization": {"mean": mean, "std": std}, "labels": [str(i) for i in range(model_cfg.n_classes)],
                "split_seed": split_seed}
        return Prepared(model_cfg, objective, run_info=info,
                        summary=f"{len(data['train'][0])} training images, {len(data['test'][0])} held-out images")

    def evaluate_run(self, run: LoadedModel, split: str | None, limit: int | None) -> dict:
        """Accuracy and mean cross-entropy on the held-out images ("test"; "val" is the same: these
        data sets have no third split) or the training images ("train", unaugmented).

        Returns:
            {"split", "n", "accuracy", "loss"}.
        """
        split = split or "test"
        if split not in ("train", "val", "test"):
            raise UserError(f"unknown split {split!r}; known: train, test (val = test: one held-out split)")
        data_cfg = ImageDataConfig.from_dict(run.config["data"])
        name = "train" if split == "train" else "test"
        images, labels = image_splits(data_cfg, run.model.cfg, run.config.get("split_seed", SPLIT_SEED))[name]
        images, labels = images[:limit], labels[:limit]
        norm = run.config["normalization"]
        record = ImageClassificationObjective(images, labels, images, labels, data_cfg, 0, norm["mean"],
                                              norm["std"]).evaluate(run.model)
        return {"split": name, "n": record["n"], "accuracy": record["accuracy"], "loss": record["test_loss"]}

    @torch.no_grad()
    def classify(self, run: LoadedModel, inputs: list[str]) -> list[tuple[str, float]]:
        """The most probable class of each image file, and its softmax probability.

        Each file (PNG, JPEG or PGM) is read as grayscale in [0, 1] at its own size and normalised as in
        training; a size other than the training size uses interpolated position embeddings, so any
        size divisible by the patch size works. Images should look like the training data (MNIST: a
        light digit on a dark background).

        Raises:
            FileNotFoundError / ValueError: naming the file that is missing, unreadable, or whose size
                is not divisible by the patch size; ValueError when no file is given.
        """
        if not inputs:
            raise UserError("give image files to classify")
        model, norm, labels = run.model, run.config["normalization"], run.config.get("labels")
        cfg = model.cfg
        results = []
        for f in inputs:
            image = read_image_file(f)  # (1, H, W)
            if cfg.in_channels != 1:
                image = image.expand(cfg.in_channels, -1, -1)
            h, w = image.shape[-2:]
            if h % cfg.patch_size or w % cfg.patch_size:
                raise UserError(f"{f}: image size {h}×{w} is not divisible by patch_size {cfg.patch_size}")
            probs = model(normalize(image[None], norm["mean"], norm["std"])).float().softmax(-1)[0]  # (K,)
            p, k = probs.max(-1)
            label = labels[int(k)] if isinstance(labels, list) and int(k) < len(labels) else str(int(k))
            results.append((label, round(float(p), 4)))
        return results
