"""train/host_memory.py: `attnlab train` fixes glibc's mmap threshold before the task prepares the run
(so before any model loads), for any recipe; --set malloc_mmap_threshold=0 and glibc's own
MALLOC_MMAP_THRESHOLD_ leave it alone. Properties of the process's allocator, observed in a subprocess
(mallinfo2), not timings."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.train import host_memory
from attnlab.train.config import TrainConfig

PROBE = Path(__file__).with_name("host_memory_probe.py")
LIBC, VERSION = platform.libc_ver()
glibc = pytest.mark.skipif(LIBC != "glibc" or tuple(map(int, VERSION.split(".")[:2])) < (2, 33),
                           reason="mallopt and mallinfo2 are glibc's (2.33+)")


def probe(tmp_path, recipe: str, *sets: str, env: dict | None = None) -> bool:
    """Whether a large block is mapped on its own when `attnlab train --recipe RECIPE` starts to prepare."""
    environ = {k: v for k, v in os.environ.items() if k != host_memory.GLIBC_ENV}
    root = Path(__file__).resolve().parents[2]
    environ["PYTHONPATH"] = os.pathsep.join([str(root), environ.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(PROBE), "train", "--recipe", recipe, "--steps", "1",
                        "--out", str(tmp_path / "run"), *[x for s in sets for x in ("--set", s)]],
                       env={**environ, **(env or {})}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])["maps_a_large_block"]


@glibc
@pytest.mark.parametrize("recipe", ["smollm2-lora-multi30k", "shakespeare-char"])
def test_train_fixes_the_mmap_threshold_before_the_model_loads(tmp_path, recipe):
    assert probe(tmp_path, recipe)  # fixed at 128 KiB: the large block is mapped, and unmapped when freed


@glibc
def test_the_threshold_can_be_left_to_glibc(tmp_path):
    assert not probe(tmp_path, "smollm2-lora-multi30k", "malloc_mmap_threshold=0")  # glibc's dynamic default
    # glibc's own setting from the environment stands (32 MiB: the probe's block comes from the heap)
    assert not probe(tmp_path, "smollm2-lora-multi30k", env={host_memory.GLIBC_ENV: str(host_memory.MAX)})


def test_bad_thresholds_name_the_field():
    for bad in (-1, host_memory.MAX + 1):
        with pytest.raises(ValueError, match="malloc_mmap_threshold"):
            TrainConfig(malloc_mmap_threshold=bad)
        with pytest.raises(ValueError, match="malloc_mmap_threshold"):
            host_memory.fix_mmap_threshold(bad)


def test_off_and_elsewhere_it_does_nothing(monkeypatch):
    assert host_memory.fix_mmap_threshold(0) is False
    monkeypatch.setattr(host_memory, "is_glibc", lambda: False)
    assert host_memory.fix_mmap_threshold(host_memory.DEFAULT) is False  # musl, macOS, Windows: no mallopt
