"""Where each real data set lives: a search path, then a download with a sha256 check.

Search order: $ATTNLAB_DATA, ../shared/data (beside the working directory, then beside
this checkout), ~/.cache/attnlab. Where none has the files, they are downloaded from the public
source into ~/.cache/attnlab and checked against the sha256 of their published content.
"""
from __future__ import annotations

import gzip
import hashlib
import logging
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import UnknownName


log = logging.getLogger("attnlab")


class DatasetNotFoundError(FileNotFoundError):
    """A data set is missing from every search location and could not be downloaded."""


@dataclass(frozen=True)
class RemoteFile:
    name: str     # file name inside the data set folder
    url: str      # public source
    sha256: str   # of the decompressed content
    gzipped: bool = True


_MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
_MULTI30K_URL = f"https://github.com/multi30k/dataset/raw/{_MULTI30K_COMMIT}/data/task1/raw/{{}}.gz"
_MULTI30K_SHA = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test_2016_flickr.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
}

_CHAR_RNN_COMMIT = "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e"
_TINY_SHAKESPEARE = RemoteFile(
    "input.txt", f"https://github.com/karpathy/char-rnn/raw/{_CHAR_RNN_COMMIT}/data/tinyshakespeare/input.txt",
    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", gzipped=False)

_MNIST_URL = "https://github.com/lijie2020/vae/raw/6aa58aba724f46dba967fc7058945941d171d433/data/MNIST/MNIST/raw/{}"
_MNIST = {  # kept gzipped: the sha256 is of the .gz file
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
_SST2_URL = ("https://github.com/brunnurs/binary-classification-bert/raw/35e1628db50472679176dd31b992534a3866a86e/"
             "data/SST2/{}")
_SST2 = {
    "train.tsv": "5c47819a1d04cfabc7afcc79a919c97b0b367101ad42d3ff148d67bf501384c2",
    "dev.tsv": "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0",
}
_DIGITS = RemoteFile(  # scikit-learn's package data, decompressed
    "digits.csv", "https://github.com/scikit-learn/scikit-learn/raw/1.5.2/sklearn/datasets/data/digits.csv.gz",
    "6ebb3d2fee246a4e99363262ddf8a00a3c41bee6014c373ed9d9216ba7f651b8")

DATASETS: dict[str, dict[str, RemoteFile]] = {
    "mnist": {n: RemoteFile(n, _MNIST_URL.format(n), sha, gzipped=False) for n, sha in _MNIST.items()},
    "sst2": {n: RemoteFile(n, _SST2_URL.format(n), sha, gzipped=False) for n, sha in _SST2.items()},
    "digits": {"digits.csv": _DIGITS},
    "multi30k": {n: RemoteFile(n, _MULTI30K_URL.format(n), sha) for n, sha in _MULTI30K_SHA.items()},
    "tinyshakespeare": {"input.txt": _TINY_SHAKESPEARE},
}


def search_path() -> list[Path]:
    """The folders searched for data sets, in order."""
    paths = []
    if os.environ.get("ATTNLAB_DATA"):
        paths.append(Path(os.environ["ATTNLAB_DATA"]))
    paths.append(Path.cwd().parent / "shared" / "data")
    checkout = Path(__file__).resolve().parents[3]  # src/attnlab/data/datasets.py -> repo root
    paths.append(checkout.parent / "shared" / "data")
    paths.append(Path.home() / ".cache" / "attnlab")
    unique = []
    for p in paths:
        if p not in unique:
            unique.append(p)
    return unique


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(remote: RemoteFile, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    with urllib.request.urlopen(remote.url, timeout=60) as r:
        data = r.read()
    if remote.gzipped:
        data = gzip.decompress(data)
    tmp.write_bytes(data)
    digest = _sha256(tmp)
    if digest != remote.sha256:
        tmp.unlink()
        raise DatasetNotFoundError(f"{remote.url}: sha256 {digest} does not match the expected {remote.sha256}")
    os.replace(tmp, dest)


def find_dataset(name: str, files: list[str] | None = None, download: bool = True) -> Path:
    """The folder holding data set `name` (all of `files`, default: every file of the data set).

    Raises:
        KeyError: for an unknown data set name.
        DatasetNotFoundError: naming every place searched and the download source, when the files
            are nowhere and the download fails (or download=False).
    """
    if name not in DATASETS:
        raise UnknownName(f"unknown data set {name!r}; known: {sorted(DATASETS)}")
    wanted = files if files is not None else sorted(DATASETS[name])
    env = os.environ.get("ATTNLAB_DATA")
    if env and not all((Path(env) / name / f).is_file() for f in wanted):
        log.warning("ATTNLAB_DATA=%s has no %s/%s; searching the other places", env, name, wanted[0])
    for root in search_path():
        if all((root / name / f).is_file() for f in wanted):
            return root / name
    cache = Path.home() / ".cache" / "attnlab" / name
    searched = ", ".join(str(p / name) for p in search_path())
    source = next(iter(DATASETS[name].values())).url.rsplit("/", 1)[0]
    unknown = sorted(set(wanted) - set(DATASETS[name]))
    if unknown:
        raise DatasetNotFoundError(f"{', '.join(unknown)} not found in {searched}, and not a file of data set "
                                   f"{name!r} (source {source}); known files: {', '.join(sorted(DATASETS[name]))}")
    if not download:
        raise DatasetNotFoundError(f"data set {name!r} not found in {searched}; download it from {source}")
    try:
        for f in wanted:
            if not (cache / f).is_file():
                _download(DATASETS[name][f], cache / f)
    except OSError as e:
        raise DatasetNotFoundError(
            f"data set {name!r} not found in {searched}, and downloading from {source} failed ({e}); "
            f"copy its files into one of those folders or set ATTNLAB_DATA") from None
    return cache
