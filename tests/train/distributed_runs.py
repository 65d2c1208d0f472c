"""Running tiny trainings under torchrun for the distributed tests: free ports, the tiny data as a
folder that subprocesses find through $ATTNLAB_DATA, and the one-process reference runs in this
process. Every launched process uses one thread (OMP_NUM_THREADS=1)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from attnlab.cli import main
from attnlab.tensorfile import read_tensors
from tests.conftest import TINY, TINY_LM, make_pairs, tiny_text

SRC = Path(__file__).resolve().parents[2] / "src"
# Adam's ε at 1e-4 instead of 1e-9: the keys' bias of an attention layer has a gradient that is zero in
# exact arithmetic (softmax ignores a constant added to every key); with ε = 1e-9 Adam turns its
# rounding noise (1e-9), which differs with the summation order of any split of the batch, into
# steps of the learning rate's size.
TRANSLATION = ["--recipe", "multi30k-en-de", *(a for s in TINY for a in ("--set", s)),
               "--set", "dropout=0.0", "--set", "eps=1e-4"]
LM = ["--recipe", "shakespeare-char", *(a for s in TINY_LM for a in ("--set", s)), "--set", "eps=1e-4"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_data(root: Path) -> Path:
    """The tiny Multi30k and Tiny Shakespeare of tests/conftest.py under `root`."""
    folder = root / "multi30k"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", 200, 0), ("val", 20, 1), ("test_2016_flickr", 20, 2)):
        pairs = make_pairs(n, seed)
        (folder / f"{split}.en").write_text("".join(e + "\n" for e, _ in pairs), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(d + "\n" for _, d in pairs), encoding="utf-8")
    (root / "tinyshakespeare").mkdir(exist_ok=True)
    (root / "tinyshakespeare" / "input.txt").write_text(tiny_text(), encoding="utf-8")
    return root


def env(data: Path, **extra: str) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SRC), "ATTNLAB_DATA": str(data),
            "ATTNLAB_COLLECTIVE_TIMEOUT": "30", **extra}


def torchrun(data: Path, argv: list[str], nproc: int = 2, timeout: float = 120, extra_env: dict | None = None,
             launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node N --master_port P -m attnlab train ARGV`."""
    cmd = launcher or ["--nproc_per_node", str(nproc), "--master_port", str(free_port())]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *cmd, "-m", "attnlab", "train", *argv],
                          env=env(data, **(extra_env or {})), capture_output=True, text=True, timeout=timeout)


def one_process(monkeypatch, data: Path, argv: list[str]) -> None:
    """`attnlab train ARGV` in this process, on one thread."""
    monkeypatch.setenv("ATTNLAB_DATA", str(data))
    assert main(["train", *argv]) == 0


def weights(run: Path) -> dict:
    """The last step's weights of a run (its checkpoint's)."""
    return read_tensors(run / "checkpoint" / "model.safetensors")


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)
