"""ViT training end to end on a tiny digits.csv: run directory, evaluation, resume, classification."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from attnlab.recipes.digits_vit import recipe as digits_recipe
from attnlab.tasks.registry import get_task
from attnlab.tasks.vision import ImageBatch, ImageClassificationObjective

VISION = get_task("vit")


def load_vit(path):
    run = VISION.load(path)
    return run.model, run.config


def classify_images(path, files):
    return VISION.classify(VISION.load(path), files)

TINY = ["d_model=16", "n_heads=2", "n_layers=1", "d_ff=32", "n_train=100", "n_test=40", "batch_size=20",
        "max_shift=0", "lr=1e-2", "warmup_steps=2", "lr_decay_steps=24", "eval_every=8", "checkpoint_every=8",
        "log_every=2", "dropout=0.1"]


@pytest.fixture
def tiny_digits(tmp_path, monkeypatch):
    """160 noisy copies of 10 random 8×8 prototypes (pixels 0–16) as digits/digits.csv, the only place searched."""
    import attnlab.data.datasets as datasets

    rng = np.random.default_rng(0)
    prototypes = rng.integers(0, 17, (10, 64))
    labels = np.arange(160) % 10
    pixels = np.clip(prototypes[labels] + rng.integers(-3, 4, (160, 64)), 0, 16)
    root = tmp_path / "data"
    (root / "digits").mkdir(parents=True)
    rows = np.concatenate([pixels, labels[:, None]], axis=1)
    (root / "digits" / "digits.csv").write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    monkeypatch.setenv("ATTNLAB_DATA", str(root))
    monkeypatch.setattr(datasets, "search_path", lambda: [root])
    return pixels, labels


def tiny_recipe(steps, extra=()):
    return digits_recipe().with_overrides(TINY + [f"max_steps={steps}", *extra])


def test_train_vit_writes_a_run_that_evaluates_to_its_best(tiny_digits, tmp_path):
    out = tmp_path / "run"
    result = VISION.train(tiny_recipe(24), out)
    assert result["steps"] == 24 and result["parameters"] > 0 and result["images_per_s"] > 0
    for name in ("config.json", "model.safetensors", "metrics.jsonl", "checkpoint/state.json"):
        assert (out / name).is_file()
    assert not (out / "tokenizer.json").exists()
    saved = json.loads((out / "config.json").read_text())
    assert saved["model_type"] == "vit" and saved["recipe"] == "digits-vit"
    assert saved["labels"] == [str(i) for i in range(10)] and saved["data"]["n_train"] == 100
    assert 0 < saved["normalization"]["mean"] < 1 and saved["normalization"]["std"] > 0
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "accuracy" in r]
    assert [r["step"] for r in evals] == [8, 16, 24] and all(r["n"] == 40 for r in evals)
    assert result["best"] == max(r["accuracy"] for r in evals) > 0.5
    scored = VISION.evaluate(out)
    assert scored["split"] == "test" and scored["n"] == 40 and scored["accuracy"] == pytest.approx(result["best"])
    assert VISION.evaluate(out, "train", limit=30)["n"] == 30
    with pytest.raises(ValueError, match="split"):
        VISION.evaluate(out, "dev")
    model, _ = load_vit(out)
    assert not model.training


def test_resumed_vit_run_equals_uninterrupted(tiny_digits, tmp_path):
    shifted = ["max_shift=1"]  # exercises the seeded augmentation
    VISION.train(tiny_recipe(12, shifted), tmp_path / "full")
    VISION.train(tiny_recipe(7, shifted), tmp_path / "split")  # stops in the middle of epoch 1 (5 batches an epoch)
    result = VISION.train(tiny_recipe(12, shifted), tmp_path / "split", resume=True)
    assert result["steps"] == 12
    a = load_file(str(tmp_path / "full" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_batches_are_a_seeded_permutation_with_seeded_shifts(tiny_digits):
    from attnlab.tasks.vision import ImageDataConfig

    images, labels = torch.rand(50, 1, 8, 8), torch.arange(50) % 10
    task = ImageClassificationObjective(images, labels, images[:5], labels[:5],
                                        ImageDataConfig(batch_size=16, max_shift=1), 1, 0.5, 0.25)
    epoch0 = task.batches(0)
    assert [len(b.indices) for b in epoch0] == [16, 16, 16, 2]
    assert sorted(torch.cat([b.indices for b in epoch0]).tolist()) == list(range(50))
    assert all(torch.equal(a.indices, b.indices) and a.seed == b.seed for a, b in zip(epoch0, task.batches(0)))
    assert not torch.equal(epoch0[0].indices, task.batches(1)[0].indices)
    assert len({b.seed for b in epoch0 + task.batches(1)}) == 8
    x1, y1 = task.inputs(epoch0[0])
    x2, _ = task.inputs(ImageBatch(epoch0[0].indices, epoch0[0].seed))
    assert x1.shape == (16, 1, 8, 8) and torch.equal(x1, x2) and torch.equal(y1, labels[epoch0[0].indices])


def test_classify_image_files_at_any_divisible_size(tiny_digits, tmp_path):
    pixels, labels = tiny_digits
    out = tmp_path / "run"
    VISION.train(tiny_recipe(4), out)
    files = []
    for name, image in (("a.pgm", pixels[0].reshape(8, 8)), ("big.pgm", np.kron(pixels[1].reshape(8, 8),
                                                                                 np.ones((2, 3), dtype=int)))):
        h, w = image.shape
        (tmp_path / name).write_bytes(f"P5 {w} {h} 16\n".encode() + image.astype(np.uint8).tobytes())
        files.append(str(tmp_path / name))
    results = classify_images(out, files)  # 8×8 (the training size) and 16×24 (interpolated positions)
    assert len(results) == 2
    for label, prob in results:
        assert label in [str(i) for i in range(10)] and 0.1 <= prob <= 1.0
    odd = tmp_path / "odd.pgm"
    odd.write_bytes(b"P5 8 10 16\n" + bytes(80))
    with pytest.raises(ValueError, match="odd.pgm: image size 10×8 is not divisible by patch_size 4"):
        classify_images(out, [str(odd)])


def test_bad_settings_are_refused_before_writing(tiny_digits, tmp_path):
    with pytest.raises(ValueError, match="100 \\+ 100 = 200 exceeds the 160 images"):
        VISION.train(tiny_recipe(4, ["n_test=100"]), tmp_path / "bad")
    with pytest.raises(ValueError, match="8×8 images, image_size is 16"):
        VISION.train(tiny_recipe(4, ["image_size=16"]), tmp_path / "bad")
    with pytest.raises(ValueError, match="labels up to 9, n_classes is 5"):
        VISION.train(tiny_recipe(4, ["n_classes=5"]), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        load_vit(tmp_path)
