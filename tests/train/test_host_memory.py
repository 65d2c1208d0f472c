"""train/host_memory.py: `attnlab train` fixes glibc's mmap threshold before the task prepares the run
(so before any model loads) in a run that checkpoints its activations, and in any recipe's run that
sets malloc_mmap_threshold; a run that does neither keeps its heap (32 MiB, no trimming: a freed block
stays at the heap's top); with malloc_mmap_threshold=0 and under glibc's own MALLOC_MMAP_THRESHOLD_
it leaves glibc alone. Once the model is built, before the first step, it
hands the heap's free pages back (malloc_trim), which gives back memory freed amid live blocks.
Properties of the process's allocator, observed in a subprocess (mallinfo2, /proc), not timings."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.tasks import base
from attnlab.tasks.registry import get_task
from attnlab.train import host_memory
from attnlab.train.config import TrainConfig

from tests.conftest import tiny_lm_recipe

PROBE = Path(__file__).with_name("host_memory_probe.py")
LIBC, VERSION = platform.libc_ver()
glibc = pytest.mark.skipif(LIBC != "glibc" or tuple(map(int, VERSION.split(".")[:2])) < (2, 33),
                           reason="mallopt and mallinfo2 are glibc's (2.33+)")


def probe(tmp_path, recipe: str, *sets: str, env: dict | None = None, key: str = "maps_a_large_block") -> bool:
    """Whether a large block is mapped on its own (or with key="keeps_a_freed_heap_top", whether the
    heap keeps a freed large block) when `attnlab train --recipe RECIPE` starts to prepare."""
    environ = {k: v for k, v in os.environ.items() if k != host_memory.GLIBC_ENV}
    root = Path(__file__).resolve().parents[2]
    environ["PYTHONPATH"] = os.pathsep.join([str(root), environ.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(PROBE), "train", "--recipe", recipe, "--steps", "1",
                        "--out", str(tmp_path / "run"), *[x for s in sets for x in ("--set", s)]],
                       env={**environ, **(env or {})}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])[key]


@glibc
@pytest.mark.parametrize("recipe, sets", [("smollm2-lora-multi30k", ["activation_checkpointing=true"]),
                                          ("shakespeare-char", ["malloc_mmap_threshold=131072"])])
def test_train_fixes_the_mmap_threshold_before_the_model_loads(tmp_path, recipe, sets):
    assert probe(tmp_path, recipe, *sets)  # fixed at 128 KiB: the large block is mapped, and unmapped when freed


@glibc
@pytest.mark.parametrize("recipe", ["smollm2-lora-multi30k", "shakespeare-char"])
def test_a_run_that_keeps_its_activations_keeps_its_heap(tmp_path, recipe):
    assert not probe(tmp_path, recipe)  # 32 MiB: the large block comes from the heap
    assert probe(tmp_path, recipe, key="keeps_a_freed_heap_top")  # and stays there when freed (no trim)


@glibc
@pytest.mark.parametrize("recipe, sets", [("smollm2-lora-multi30k", ["activation_checkpointing=true"]),
                                          ("shakespeare-char", ["malloc_mmap_threshold=131072"]),
                                          ("shakespeare-char", ["malloc_mmap_threshold=0"])])
def test_otherwise_the_heap_is_trimmed(tmp_path, recipe, sets):
    # a fixed threshold trims at glibc's 128 KiB; glibc's dynamic one at twice the largest block it
    # mapped and freed so far (64 MiB at most), below the probe's 70 MiB of freed heap blocks
    assert not probe(tmp_path, recipe, *sets, key="keeps_a_freed_heap_top")


RESET = """
import json, sys
sys.path.insert(0, {probe_dir!r})
from host_memory_probe import keeps_a_freed_heap_top
from attnlab.train import host_memory
host_memory.fix_mmap_threshold(host_memory.MAX, keep_heap=True)
kept = keeps_a_freed_heap_top()
host_memory.fix_mmap_threshold(host_memory.DEFAULT)
print(json.dumps([kept, keeps_a_freed_heap_top()]))
"""


@glibc
def test_a_later_fixed_threshold_trims_again():
    # mallopt's settings last for the process: a later run (or test) fixing 128 KiB trims at glibc's
    # 128 KiB again, not at an earlier kept heap's 1 GiB
    env = {k: v for k, v in os.environ.items() if k not in (host_memory.GLIBC_ENV, host_memory.GLIBC_TRIM_ENV)}
    r = subprocess.run([sys.executable, "-c", RESET.format(probe_dir=str(PROBE.parent))], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [True, False]


@glibc
def test_the_threshold_is_left_to_glibc(tmp_path):
    assert not probe(tmp_path, "smollm2-lora-multi30k", "activation_checkpointing=true", "malloc_mmap_threshold=0")


@glibc
def test_glibc_own_setting_stands(tmp_path):  # 32 MiB from the environment: the probe's block comes from the heap
    assert not probe(tmp_path, "smollm2-lora-multi30k", "activation_checkpointing=true",
                     env={host_memory.GLIBC_ENV: str(host_memory.MAX)})


def test_the_default_is_small_for_checkpointing_runs_and_kept_for_others():
    assert host_memory.mmap_threshold(None, checkpointing=True) == host_memory.DEFAULT
    assert host_memory.mmap_threshold(None, checkpointing=False) == host_memory.MAX
    assert host_memory.mmap_threshold(0, checkpointing=True) == 0
    assert host_memory.mmap_threshold(1 << 20, checkpointing=False) == 1 << 20


def test_heap_setup_says_what_it_did(monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "fix_mmap_threshold", lambda n, keep_heap=False: calls.append((n, keep_heap)) or n > 0)
    assert host_memory.heap_setup(None, checkpointing=False) == {
        "malloc_mmap_threshold": host_memory.MAX, "heap_kept": True, "mmap_threshold_fixed": True}
    assert host_memory.heap_setup(None, checkpointing=True)["heap_kept"] is False
    assert host_memory.heap_setup(1 << 20, checkpointing=False)["heap_kept"] is False  # N bytes: trimmed as glibc's
    assert host_memory.heap_setup(0, checkpointing=False) == {
        "malloc_mmap_threshold": 0, "heap_kept": False, "mmap_threshold_fixed": False}
    assert calls == [(host_memory.MAX, True), (host_memory.DEFAULT, False), (1 << 20, False), (0, False)]


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


TRIM = """
import ctypes, json
from pathlib import Path
from attnlab.train.host_memory import release_free_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
def rss_mb():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20
blocks = [libc.malloc(64 << 10) for _ in range(2000)]  # 125 MiB of heap blocks (under the 128 KiB threshold)
for b in blocks:
    ctypes.memset(b, 1, 64 << 10)  # resident
for b in blocks[:-1]:
    libc.free(b)  # free, but below a live block: glibc's automatic trim of the heap's top cannot give it back
before = rss_mb()
released = release_free_memory()
print(json.dumps({"released": released, "freed_mb": before - rss_mb()}))
"""


@glibc
def test_release_free_memory_gives_back_free_heap_pages_below_live_blocks():
    r = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != host_memory.GLIBC_ENV})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["released"] and out["freed_mb"] > 100


def test_train_releases_free_memory_once_the_model_is_built(tiny_shakespeare, tmp_path, monkeypatch):
    calls = []
    build = get_task("gpt").build_model
    monkeypatch.setattr(type(get_task("gpt")), "build_model", lambda self, cfg: calls.append("build") or build(cfg))
    monkeypatch.setattr(base, "release_free_memory", lambda: calls.append("release") or True)
    monkeypatch.setattr(base, "fit", lambda *a, **k: calls.append("fit") or {})
    get_task("gpt").train(tiny_lm_recipe(1), tmp_path / "run")
    assert calls == ["build", "release", "fit"]  # after the model is built (loaded), before the first step


def test_off_glibc_release_does_nothing(monkeypatch):
    monkeypatch.setattr(host_memory, "is_glibc", lambda: False)
    assert host_memory.release_free_memory() is False
