"""Freed tensors handed back to the system: glibc's mmap threshold fixed before a run allocates.

PyTorch's CPU tensors come from the C library's malloc. glibc serves a request at or above its mmap
threshold with a mapping of its own, unmapped when freed; a smaller one comes from its heap, which
keeps freed memory for reuse and returns only what lies free at its top. The threshold starts at
128 KiB but is dynamic: each time a mapped block is freed, it rises to that block's size (up to
32 MiB on 64-bit), and the trim threshold with it (mallopt(3), M_MMAP_THRESHOLD, "dynamic mmap
threshold"). Loading a model maps and frees blocks of many MiB, so afterwards every activation of a
training step (1-13 MB each for SmolLM2 on ~1,024 tokens) comes from the heap, where the small
allocations made between them (autograd's nodes, optimizer bookkeeping) pin the freed pieces: the
heap grows far past what is live. A checkpointed SmolLM2 LoRA step keeps ~68 MB of saved tensors,
yet its resident memory grew ~480 MB (bench/finetune.py --part memory).

`fix_mmap_threshold(nbytes)` calls mallopt(M_MMAP_THRESHOLD, nbytes), which also turns the dynamic
rise off (for the trim threshold too, which stays at glibc's 128 KiB): blocks of `nbytes` and more
are mapped and unmapped, so the resident memory follows the live tensors. It must run before the
model loads: a large request is still served from free heap space when there is some, so a heap
already swollen by loading keeps serving the steps (set after loading, it changed nothing:
1,377 against 1,381 MB). Set first, it does what glibc's MALLOC_MMAP_THRESHOLD_=131072 at process
start does (the same peak to 1 MB).

What it costs: a mapped block's pages are fresh, so every large tensor of every step takes page
faults (the kernel zeroes its pages) and an munmap, where a heap block would be reused warm. On
small fast steps that is most of the step: shakespeare-char's bf16 step 43 -> 73 ms, multi30k-en-de's
866 -> 1,266 ms (bench/train_step.py, AMD EPYC, 2 threads). So `mmap_threshold(setting,
checkpointing)` (TrainConfig.malloc_mmap_threshold, applied by tasks/base.py before anything is
built, for every recipe) fixes it by default only in a run that checkpoints its activations, which
has chosen memory over speed already; None = that choice, 0 = glibc's dynamic threshold always, N =
N bytes always. Where the environment sets glibc's own MALLOC_MMAP_THRESHOLD_, that stands. It
changes no value computed. Elsewhere than Linux with glibc (musl, macOS, Windows) it does nothing
and says so (fix_mmap_threshold returns False).

`release_free_memory()` calls malloc_trim(0) once the model is built, before the first step
(tasks/base.py, every recipe): glibc then hands back the free pages anywhere in its heaps (not
only at the top, since glibc 2.8), which loading and preparing left resident; the steps fault in
again only what they use. It runs once and changes no value computed.

Source: mallopt(3) (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD), malloc_trim(3); glibc manual, "Malloc
Tunable Parameters".
"""
from __future__ import annotations

import ctypes
import os
import platform

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
GLIBC_ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc's own tunable, read when the process starts
DEFAULT = 128 << 10  # bytes: glibc's initial threshold (DEFAULT_MMAP_THRESHOLD_MIN), kept fixed
MAX = 32 << 20  # bytes: glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit); mallopt refuses more


def is_glibc() -> bool:
    """Whether this process runs on Linux with glibc (where mallopt's M_MMAP_THRESHOLD exists)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def mmap_threshold(setting: int | None, checkpointing: bool) -> int:
    """The threshold a run fixes (bytes; 0 = none): `setting` (TrainConfig.malloc_mmap_threshold)
    when given, else DEFAULT for a run that checkpoints its activations and 0 for one that does not
    (module docstring: what it costs)."""
    if setting is not None:
        return setting
    return DEFAULT if checkpointing else 0


def fix_mmap_threshold(nbytes: int) -> bool:
    """Serve blocks of `nbytes` bytes and more with their own mappings, unmapped when freed, from now
    on in this process, and stop glibc's threshold from rising (module docstring).

    Args:
        nbytes: the threshold in bytes, 0 < nbytes <= MAX; 0 = do nothing (glibc's dynamic default).
    Returns:
        whether the threshold was set: False for 0, where the environment sets MALLOC_MMAP_THRESHOLD_
        (the user's choice stands), and off glibc.
    Raises:
        ValueError: for nbytes < 0 or > MAX.
    """
    if not 0 <= nbytes <= MAX:
        raise ValueError(f"malloc_mmap_threshold must be in [0, {MAX}] bytes (0 = glibc's dynamic default), "
                         f"got {nbytes}")
    if nbytes == 0 or GLIBC_ENV in os.environ or not is_glibc():
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, int(nbytes)))
    except (OSError, AttributeError):
        return False


def release_free_memory() -> bool:
    """Hand the free pages of glibc's heaps back to the system now: malloc_trim(0) (module docstring).

    Returns:
        whether glibc released any memory; False off glibc (nothing to do there).
    """
    if not is_glibc():
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False
