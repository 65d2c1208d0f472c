"""train/host_memory.py: `attnlab train` fixes glibc's mmap threshold before the task prepares the run
(so before any model loads) in a run that checkpoints its activations, and in any recipe's run that
sets malloc_mmap_threshold; otherwise, with malloc_mmap_threshold=0 and under glibc's own
MALLOC_MMAP_THRESHOLD_ it leaves glibc alone. Properties of the process's allocator, observed in a
subprocess (mallinfo2), not timings."""
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
@pytest.mark.parametrize("recipe, sets", [("smollm2-lora-multi30k", ["activation_checkpointing=true"]),
                                          ("shakespeare-char", ["malloc_mmap_threshold=131072"])])
def test_train_fixes_the_mmap_threshold_before_the_model_loads(tmp_path, recipe, sets):
    assert probe(tmp_path, recipe, *sets)  # fixed at 128 KiB: the large block is mapped, and unmapped when freed


@glibc
@pytest.mark.parametrize("recipe, sets", [("smollm2-lora-multi30k", []),  # keeps its activations: glibc's way
                                          ("shakespeare-char", []),
                                          ("smollm2-lora-multi30k", ["activation_checkpointing=true",
                                                                     "malloc_mmap_threshold=0"])])
def test_the_threshold_is_left_to_glibc(tmp_path, recipe, sets):
    assert not probe(tmp_path, recipe, *sets)


@glibc
def test_glibc_own_setting_stands(tmp_path):  # 32 MiB from the environment: the probe's block comes from the heap
    assert not probe(tmp_path, "smollm2-lora-multi30k", "activation_checkpointing=true",
                     env={host_memory.GLIBC_ENV: str(host_memory.MAX)})


def test_the_default_fixes_it_for_checkpointing_runs_only():
    assert host_memory.mmap_threshold(None, checkpointing=True) == host_memory.DEFAULT
    assert host_memory.mmap_threshold(None, checkpointing=False) == 0
    assert host_memory.mmap_threshold(0, checkpointing=True) == 0
    assert host_memory.mmap_threshold(1 << 20, checkpointing=False) == 1 << 20


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
