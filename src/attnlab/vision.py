"""Image classification end to end: train a Vision Transformer recipe, load it, evaluate it, classify files.

A ViT run directory holds config.json ({"model_type": "vit", "recipe", "model", "data", "train",
"normalization": {"mean", "std"}, "labels", "split_seed"}), model.safetensors (best weights),
metrics.jsonl and checkpoint/ (for --resume). There is no tokenizer.json.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from attnlab.tasks.vision import ImageDataConfig

from attnlab.train.config import TrainConfig

from attnlab.models.vit import ViTConfig
from attnlab.data.images import SPLIT_SEED, load_images, normalization, normalize, read_image_file, split
from attnlab.models.vit import VisionTransformer
from attnlab.runs import fit, read_run_config, run_settings, start_run_dir
from attnlab.train.checkpoint import load_weights
from attnlab.train.image_task import ImageClassificationTask
from attnlab.train.loop import CHECKPOINT_DIR

log = logging.getLogger("attnlab")


def check_vit_dir(path: Path) -> None:
    """Raise FileNotFoundError naming what is missing unless `path` is a trained ViT directory."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory (expected a trained model directory)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a trained model directory: config.json is missing")
    if not (path / "model.safetensors").is_file():
        hint = (f"; continue training it with: attnlab train --recipe RECIPE --out {path} --resume"
                if (path / CHECKPOINT_DIR).is_dir() else "")
        raise FileNotFoundError(f"{path} has no trained weights: model.safetensors is missing{hint}")


def _check_data(images: torch.Tensor, labels: torch.Tensor, model_cfg: ViTConfig, dataset: str) -> None:
    _, c, h, w = images.shape
    if c != model_cfg.in_channels:
        raise ValueError(f"data set {dataset!r} has {c}-channel images, in_channels is {model_cfg.in_channels}")
    if h != model_cfg.image_size or w != model_cfg.image_size:
        raise ValueError(f"data set {dataset!r} has {h}×{w} images, image_size is {model_cfg.image_size}")
    if int(labels.max()) >= model_cfg.n_classes:
        raise ValueError(f"data set {dataset!r} has labels up to {int(labels.max())}, n_classes is "
                         f"{model_cfg.n_classes}")


def _splits(data_cfg: ImageDataConfig, model_cfg: ViTConfig, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{"train": (images, labels), "test": (images, labels)} of the seeded split."""
    images, labels = load_images(data_cfg.dataset)
    _check_data(images, labels, model_cfg, data_cfg.dataset)
    train_idx, test_idx = split(len(images), data_cfg.n_train, data_cfg.n_test, seed)
    return {"train": (images[train_idx], labels[train_idx]), "test": (images[test_idx], labels[test_idx])}


def _saved_configs(path: Path) -> tuple[dict, ViTConfig, ImageDataConfig, dict]:
    saved = read_run_config(path, "vit")
    norm = saved.get("normalization")
    if not isinstance(norm, dict) or not {"mean", "std"} <= set(norm):
        raise ValueError(f"{path / 'config.json'}: missing section 'normalization' with mean and std")
    return saved, ViTConfig.from_dict(saved["model"]), ImageDataConfig.from_dict(saved["data"]), saved["train"]


def train_vit(recipe, out: str | Path, resume: bool = False) -> dict:
    """Train image-classification `recipe` (recipes.Recipe with a ViTConfig and an ImageDataConfig)
    into run directory `out`.

    A new run loads and splits the images, checks them against the model (channels, size, classes)
    and only then writes config.json. `resume` continues from out/checkpoint/ with the saved
    settings; recipe.train's budgets apply and are totals.

    Returns:
        the final evaluation record with "best" (accuracy), "best_step", "parameters", "steps",
        "images_per_s".
    Raises:
        FileExistsError / FileNotFoundError: for an `out` that cannot be used (see runs.check_out_dir).
        DatasetNotFoundError: when the images are missing. ValueError: for an invalid setting.
    """
    out = Path(out)
    saved, model_cfg, data_cfg, train_cfg = run_settings(out, recipe, resume, _saved_configs)
    split_seed = saved.get("split_seed", SPLIT_SEED) if saved else SPLIT_SEED
    data = _splits(data_cfg, model_cfg, split_seed)
    mean, std = normalization(data["train"][0])
    task = ImageClassificationTask(*data["train"], *data["test"], data_cfg, train_cfg, mean, std)
    torch.manual_seed(train_cfg.seed)
    model = VisionTransformer(model_cfg)
    if not resume:  # every setting has been checked: now the run directory is written
        start_run_dir(out, {
            "model_type": "vit", "recipe": recipe.name, "model": model_cfg.to_dict(), "data": data_cfg.to_dict(),
            "train": train_cfg.to_dict(), "normalization": {"mean": mean, "std": std},
            "labels": [str(i) for i in range(model_cfg.n_classes)], "split_seed": split_seed})
    log.info("model: %.2fM parameters; %d training images, %d held-out images", model.num_parameters() / 1e6,
             len(data["train"][0]), len(data["test"][0]))
    return fit(model, task, train_cfg, out, resume, rate_key="images_per_s")


def load_vit(path: str | Path) -> tuple[VisionTransformer, dict]:
    """Load a trained ViT directory (config.json, model.safetensors).

    Returns:
        (model in eval mode, the saved config dict).
    Raises:
        FileNotFoundError: naming the missing file. ValueError: for a damaged config, another model
            type, or weights that do not match.
    """
    path = Path(path)
    check_vit_dir(path)
    saved, model_cfg, _, _ = _saved_configs(path)
    model = VisionTransformer(model_cfg)
    load_weights(model, path / "model.safetensors")
    return model.eval(), saved


def evaluate_vit(path: str | Path, split: str = "test", limit: int | None = None) -> dict:
    """Accuracy and mean cross-entropy of a trained ViT on its held-out images ("test"; "val" is the
    same: these data sets have no third split) or its training images ("train", unaugmented).

    Args:
        limit: score only the first `limit` images of the split.
    Returns:
        {"split", "n", "accuracy", "loss", "seconds"}.
    Raises:
        ValueError: for an unknown split. As load_vit and load_images otherwise.
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"unknown split {split!r}; known: train, test (val = test: one held-out split)")
    model, saved = load_vit(path)
    data_cfg = ImageDataConfig.from_dict(saved["data"])
    name = "train" if split == "train" else "test"
    images, labels = _splits(data_cfg, model.cfg, saved.get("split_seed", SPLIT_SEED))[name]
    images, labels = images[:limit], labels[:limit]
    norm = saved["normalization"]
    task = ImageClassificationTask(images, labels, images, labels, data_cfg, TrainConfig(), norm["mean"], norm["std"])
    t0 = time.perf_counter()
    record = task.evaluate(model)
    return {"split": name, "n": record["n"], "accuracy": record["accuracy"], "loss": record["test_loss"],
            "seconds": round(time.perf_counter() - t0, 1)}


@torch.no_grad()
def classify_images(path: str | Path, files: list[str]) -> list[tuple[str, float]]:
    """The most probable class of each image file, and its softmax probability.

    Each file (PNG, JPEG or PGM) is read as grayscale in [0, 1] at its own size and normalised as in
    training; a size other than the training size uses interpolated position embeddings, so any size
    divisible by the patch size works. Images should look like the training data (MNIST: a light
    digit on a dark background).

    Returns:
        one (label, probability) per file, in order.
    Raises:
        FileNotFoundError / ValueError: naming the file that is missing, unreadable, or whose size is
            not divisible by the patch size.
    """
    model, saved = load_vit(path)
    norm, labels, cfg = saved["normalization"], saved.get("labels"), model.cfg
    results = []
    for f in files:
        image = read_image_file(f)  # (1, H, W)
        if cfg.in_channels != 1:
            image = image.expand(cfg.in_channels, -1, -1)
        h, w = image.shape[-2:]
        if h % cfg.patch_size or w % cfg.patch_size:
            raise ValueError(f"{f}: image size {h}×{w} is not divisible by patch_size {cfg.patch_size}")
        probs = model(normalize(image[None], norm["mean"], norm["std"])).float().softmax(-1)[0]  # (K,)
        p, k = probs.max(-1)
        label = labels[int(k)] if isinstance(labels, list) and int(k) < len(labels) else str(int(k))
        results.append((label, round(float(p), 4)))
    return results
