"""Image-classification data: MNIST (IDX files) and the UCI 8×8 digits (CSV), a seeded train/test split,
normalisation with the training split's statistics, random-shift augmentation, and image files.

Shape legend: N images, B batch, C channels (1 here), H height, W width.
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import torch

from attnlab.data.datasets import find_dataset
from attnlab.errors import UserError

MNIST_IMAGES = "t10k-images-idx3-ubyte.gz"
MNIST_LABELS = "t10k-labels-idx1-ubyte.gz"
DIGITS_CSV = "digits.csv"
IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions (N, rows, columns)
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension (N,)
SPLIT_SEED = 0           # the train/test split is the same for every training seed


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """The array stored in an IDX file (gzipped when the name ends in .gz).

    IDX: a big-endian int32 magic number (0, 0, type 0x08 = unsigned byte, number of dimensions),
    one big-endian int32 size per dimension, then the data in row-major order.

    Args:
        path: the file. magic: the expected magic number (2051 for images, 2049 for labels).
    Returns:
        uint8 array of the header's shape.
    Raises:
        ValueError: naming the file when the magic number is not `magic` or the data is short.
    Source: LeCun et al., "THE MNIST DATABASE of handwritten digits", file formats section.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise UserError(f"{path} is not a readable IDX file ({e})") from None
    if len(data) < 4 or struct.unpack(">i", data[:4])[0] != magic:
        found = struct.unpack(">i", data[:4])[0] if len(data) >= 4 else None
        raise UserError(f"{path} is not an IDX file of magic number {magic} (found {found})")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}i", data[4:header])
    count = int(np.prod(shape))
    if len(data) - header != count:
        raise UserError(f"{path}: the header says {count} bytes of data for shape {shape}, "
                        f"the file holds {len(data) - header}")
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def _load_mnist(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(folder / MNIST_IMAGES, IDX_IMAGES_MAGIC).astype(np.float32) / 255.0
    labels = read_idx(folder / MNIST_LABELS, IDX_LABELS_MAGIC)
    return images, labels


def _load_digits(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    path = folder / DIGITS_CSV
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.float32, ndmin=2)
    except ValueError as e:
        raise UserError(f"{path} is not a CSV of numbers ({e})") from None
    if table.shape[1] != 65:
        raise UserError(f"{path} must have 65 columns (64 pixels and a label), found {table.shape[1]}")
    return table[:, :64].reshape(-1, 8, 8) / 16.0, table[:, 64]


def load_images(dataset: str) -> tuple[torch.Tensor, torch.Tensor]:
    """All images and labels of data set "mnist" (the 10,000 test images) or "digits" (1,797 8×8).

    Returns:
        (images (N, 1, H, W) float32 in [0, 1], labels (N,) int64).
    Raises:
        ValueError: for an unknown data set, or a damaged file (naming it).
        DatasetNotFoundError: when the files are missing everywhere (see data/datasets.py).
    """
    loaders = {"mnist": _load_mnist, "digits": _load_digits}
    if dataset not in loaders:
        raise UserError(f"unknown image data set {dataset!r}; known: {', '.join(loaders)}")
    images, labels = loaders[dataset](find_dataset(dataset))
    if len(images) != len(labels):
        raise UserError(f"data set {dataset!r} has {len(images)} images but {len(labels)} labels")
    return torch.from_numpy(np.array(images))[:, None], torch.from_numpy(np.array(labels)).long()


def split(n_images: int, n_train: int, n_test: int, seed: int = SPLIT_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random split of image indices into disjoint training and held-out sets.

    Returns:
        (train_idx (n_train,) int64, test_idx (n_test,) int64).
    Raises:
        ValueError: when n_train + n_test exceeds n_images (naming the numbers).
    """
    if n_train + n_test > n_images:
        raise UserError(f"n_train + n_test = {n_train} + {n_test} = {n_train + n_test} exceeds the "
                        f"{n_images} images of the data set")
    perm = torch.randperm(n_images, generator=torch.Generator().manual_seed(seed))
    return perm[:n_train], perm[n_train:n_train + n_test]


def normalization(images: torch.Tensor) -> tuple[float, float]:
    """(mean, std) of every pixel of `images` (the training split's), as plain floats."""
    return float(images.mean()), float(images.std())


def normalize(images: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """(images − mean) / std, the input the model is trained on."""
    return (images - mean) / std


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by its own random (dy, dx) in [−max_shift, max_shift]², zero fill.

    Args:
        images: (B, C, H, W), background 0 (before normalisation).
        max_shift: largest shift in pixels (0 returns the images unchanged).
        generator: the source of the shifts (seeded by the caller: the same seed, the same shifts).
    Returns:
        (B, C, H, W), same dtype.
    """
    if max_shift == 0:
        return images
    b, c, h, w = images.shape
    s = max_shift
    padded = torch.nn.functional.pad(images, (s, s, s, s))  # (B, C, H + 2s, W + 2s)
    top = torch.randint(0, 2 * s + 1, (b,), generator=generator)  # row of the window = s − dy
    left = torch.randint(0, 2 * s + 1, (b,), generator=generator)
    rows = (top[:, None] + torch.arange(h))[:, :, None]  # (B, H, 1)
    cols = (left[:, None] + torch.arange(w))[:, None, :]  # (B, 1, W)
    out = padded.permute(0, 2, 3, 1)[torch.arange(b)[:, None, None], rows, cols]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()  # (B, C, H, W)


def _read_pgm(path: Path) -> np.ndarray:
    """A binary (P5) or plain (P2) PGM file as (H, W) float32 in [0, 1]."""
    data = path.read_bytes()
    tokens, pos = [], 0
    while len(tokens) < 4:  # magic, width, height, maxval; '#' starts a comment
        while pos < len(data) and data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.find(b"\n", pos) + 1 or len(data)
            continue
        end = pos
        while end < len(data) and not data[end:end + 1].isspace():
            end += 1
        if end == pos:
            raise UserError("truncated header")
        tokens.append(data[pos:end])
        pos = end
    magic, (w, h, maxval) = tokens[0], map(int, tokens[1:])
    if magic == b"P2":
        pixels = np.array(data[pos:].split(), dtype=np.float32)
    else:
        dtype = np.dtype(">u2" if maxval > 255 else np.uint8)
        pixels = np.frombuffer(data[pos + 1:pos + 1 + w * h * dtype.itemsize], dtype)
    if pixels.size < w * h or maxval < 1:
        raise UserError(f"{pixels.size} pixels of maximum {maxval}, the header says {w}×{h}")
    return pixels[:w * h].astype(np.float32).reshape(h, w) / maxval


def read_image_file(path: str | Path) -> torch.Tensor:
    """A PNG, JPEG or PGM file as a grayscale (1, H, W) float32 image in [0, 1], at its own size.

    PGM is read here; other formats with Pillow, or PNG with matplotlib when Pillow is missing.
    Colour images are converted to luminance (ITU-R 601-2, Pillow's "L").
    Raises:
        FileNotFoundError: naming a missing file. ValueError: naming a file that cannot be read.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no image file at {path}")
    if path.read_bytes()[:2] in (b"P5", b"P2"):
        try:
            return torch.from_numpy(_read_pgm(path))[None]
        except ValueError as e:
            raise UserError(f"{path} is not a readable PGM image ({e})") from None
    try:
        from PIL import Image  # optional dependency (Pillow), for PNG/JPEG files
    except ImportError:
        Image = None
    try:
        if Image is not None:
            with Image.open(path) as im:
                array = np.asarray(im.convert("L"), dtype=np.float32) / 255.0
        else:
            import matplotlib.image as mpimg  # optional dependency (the viz extra)
            array = np.asarray(mpimg.imread(path), dtype=np.float32)
            if array.ndim == 3:  # RGB(A) in [0, 1]: luminance, alpha dropped
                array = array[..., :3] @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    except ImportError:
        raise UserError(f"{path}: reading this format needs Pillow (pip install pillow)") from None
    except Exception as e:  # noqa: BLE001 - the readers raise many types for a damaged file
        raise UserError(f"{path} is not a readable image ({e})") from None
    return torch.from_numpy(np.ascontiguousarray(array))[None]
