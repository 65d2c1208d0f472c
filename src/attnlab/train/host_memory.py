"""Freed activations handed back to the system at once, for runs that trade compute for memory.

PyTorch's CPU tensors come from the C library's malloc. glibc serves a block at or above its mmap
threshold with a mapping of its own, unmapped when freed; a smaller block comes from its heap, which
keeps freed memory for reuse. The threshold starts at 128 KiB and, by default, rises to the size of
each mapped block that is freed (up to 32 MiB): once a model has loaded, a training step's
activations (1-13 MB each for SmolLM2 on ~1,024 tokens) all come from the heap, where the small
allocations made between them (autograd's nodes, checkpointing's bookkeeping) split the freed
pieces, so the heap grows past what is live. With activation checkpointing a SmolLM2 LoRA step
holds ~150 MB of tensors above its weights while its resident memory grows ~480 MB
(bench/finetune.py --part memory; MALLOC_MMAP_THRESHOLD_=131072 gives ~155 MB).

`map_large_blocks()` fixes the threshold (mallopt M_MMAP_THRESHOLD, which also stops its rise):
blocks of LARGE_BLOCK bytes and more are mapped and unmapped, so the resident memory follows the
live tensors. The price is the page faults of fresh pages (the kernel zeroes them) at every step:
a few percent of a step, which a run that recomputes its activations to save memory pays gladly;
the Trainer applies it to a model that checkpoints its layers (`checkpoint_layers`). It changes no
value computed. Elsewhere than glibc it does nothing.

Source: glibc manual, "Malloc Tunable Parameters" (M_MMAP_THRESHOLD, dynamic threshold); mallopt(3).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
LARGE_BLOCK = 1 << 20  # 1 MiB: an activation of ~256 tokens × 1,024 fp32 features and more
_applied: dict = {}


def map_large_blocks(threshold: int = LARGE_BLOCK) -> bool:
    """Serve blocks of `threshold` bytes and more with their own mappings, unmapped when freed
    (module docstring), from now on in this process. Returns whether it applied (glibc only)."""
    if threshold in _applied:
        return _applied[threshold]
    ok = False
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            ok = bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
        except (OSError, AttributeError):
            ok = False
    _applied[threshold] = ok
    return ok
