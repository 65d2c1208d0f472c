"""Image data: IDX parsing, the digits CSV, the seeded split, random shifts, image files."""
import gzip
import struct

import numpy as np
import pytest
import torch

from attnlab.data import images as img


def write_idx(path, array: np.ndarray, magic: int) -> None:
    header = struct.pack(">i", magic) + struct.pack(f">{array.ndim}i", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


@pytest.fixture
def tiny_mnist(tmp_path, monkeypatch):
    """5 MNIST-style 4×3 images and labels as gzipped IDX files, the only place searched."""
    import attnlab.data.datasets as datasets

    root = tmp_path / "data"
    (root / "mnist").mkdir(parents=True)
    pixels = np.arange(5 * 4 * 3).reshape(5, 4, 3) * 4
    labels = np.array([3, 1, 4, 1, 5])
    write_idx(root / "mnist" / img.MNIST_IMAGES, pixels, 2051)
    write_idx(root / "mnist" / img.MNIST_LABELS, labels, 2049)
    monkeypatch.setenv("ATTNLAB_DATA", str(root))
    monkeypatch.setattr(datasets, "search_path", lambda: [root])
    return root / "mnist", pixels, labels


def test_read_idx_parses_the_header_and_data(tiny_mnist):
    folder, pixels, labels = tiny_mnist
    images = img.read_idx(folder / img.MNIST_IMAGES, 2051)
    assert images.dtype == np.uint8 and images.shape == (5, 4, 3) and np.array_equal(images, pixels)
    assert np.array_equal(img.read_idx(folder / img.MNIST_LABELS, 2049), labels)


def test_read_idx_says_which_file_is_bad(tmp_path):
    labels = tmp_path / "labels.idx"
    write_idx(labels, np.array([1, 2, 3]), 2049)
    with pytest.raises(ValueError, match=r"labels\.idx is not an IDX file of magic number 2051 \(found 2049\)"):
        img.read_idx(labels, 2051)
    short = tmp_path / "short.idx"
    short.write_bytes(struct.pack(">ii", 2049, 10) + b"\x01\x02")
    with pytest.raises(ValueError, match="short.idx.*10 bytes"):
        img.read_idx(short, 2049)
    garbage = tmp_path / "garbage.gz"
    garbage.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="garbage.gz"):
        img.read_idx(garbage, 2051)


def test_load_images_mnist_scales_to_unit_range(tiny_mnist):
    _, pixels, labels = tiny_mnist
    images, y = img.load_images("mnist")
    assert images.shape == (5, 1, 4, 3) and images.dtype == torch.float32
    torch.testing.assert_close(images[:, 0], torch.tensor(pixels / 255.0, dtype=torch.float32))
    assert y.dtype == torch.int64 and y.tolist() == labels.tolist()


def test_load_images_digits_divides_by_16(tmp_path, monkeypatch):
    import attnlab.data.datasets as datasets

    (tmp_path / "digits").mkdir()
    rows = np.concatenate([np.tile(np.arange(64) % 17, (3, 1)), [[7], [0], [9]]], axis=1)
    (tmp_path / "digits" / "digits.csv").write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    monkeypatch.setattr(datasets, "search_path", lambda: [tmp_path])
    images, labels = img.load_images("digits")
    assert images.shape == (3, 1, 8, 8) and labels.tolist() == [7, 0, 9]
    assert float(images.max()) == 1.0 and float(images[0, 0, 0, 1]) == pytest.approx(1 / 16)
    with pytest.raises(ValueError, match="unknown image data set 'cifar'"):
        img.load_images("cifar")


def test_split_is_disjoint_seeded_and_checked():
    train, test = img.split(100, 70, 20, seed=3)
    assert len(train) == 70 and len(test) == 20 and not set(train.tolist()) & set(test.tolist())
    again, _ = img.split(100, 70, 20, seed=3)
    other, _ = img.split(100, 70, 20, seed=4)
    assert torch.equal(train, again) and not torch.equal(train, other)
    with pytest.raises(ValueError, match="70 \\+ 40 = 110 exceeds the 100 images"):
        img.split(100, 70, 40)


def test_random_shift_keeps_shape_is_seeded_and_translates():
    x = torch.zeros(16, 1, 9, 9)
    x[:, :, 3:6, 3:6] = torch.rand(16, 1, 3, 3) + 0.1  # content away from the border: shifts keep all of it
    a = img.random_shift(x, 2, torch.Generator().manual_seed(0))
    b = img.random_shift(x, 2, torch.Generator().manual_seed(0))
    c = img.random_shift(x, 2, torch.Generator().manual_seed(1))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, c)
    torch.testing.assert_close(a.sum((1, 2, 3)), x.sum((1, 2, 3)))
    for i in range(16):  # each image is its original moved by some (dy, dx) within ±2
        shifts = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                  if torch.equal(torch.roll(x[i], (dy, dx), (1, 2)), a[i])]
        assert shifts
    assert torch.equal(img.random_shift(x, 0, torch.Generator()), x)


def test_normalization_uses_the_given_statistics():
    x = torch.tensor([[[[0.0, 1.0], [2.0, 3.0]]]])
    mean, std = img.normalization(x)
    assert mean == pytest.approx(1.5) and std == pytest.approx(x.std().item())
    torch.testing.assert_close(img.normalize(x, mean, std).mean(), torch.tensor(0.0))


def test_read_image_file_pgm_and_png(tmp_path):
    pixels = (np.arange(12).reshape(3, 4) * 20).astype(np.uint8)
    pgm = tmp_path / "a.pgm"
    pgm.write_bytes(b"P5\n# a comment\n4 3\n255\n" + pixels.tobytes())
    image = img.read_image_file(pgm)
    assert image.shape == (1, 3, 4)
    torch.testing.assert_close(image[0], torch.tensor(pixels / 255.0, dtype=torch.float32))
    short = tmp_path / "short.pgm"
    short.write_bytes(b"P5 4 3 255\n" + bytes(5))
    with pytest.raises(ValueError, match="short.pgm is not a readable PGM image .*5 pixels.*4×3"):
        img.read_image_file(short)
    with pytest.raises(FileNotFoundError, match="missing.png"):
        img.read_image_file(tmp_path / "missing.png")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG not really")
    with pytest.raises(ValueError, match="bad.png"):
        img.read_image_file(bad)
    Image = pytest.importorskip("PIL.Image")
    rgb = np.stack([pixels] * 3, axis=-1)
    Image.fromarray(rgb).save(tmp_path / "a.png")
    torch.testing.assert_close(img.read_image_file(tmp_path / "a.png"), image, atol=1 / 255, rtol=0)
