"""glibc's heap set up for a training run before it allocates: freed tensors handed back to the
system (memory first) or kept for the next step (speed first).

PyTorch's CPU tensors come from the C library's malloc. glibc serves a request at or above its mmap
threshold with a mapping of its own, unmapped when freed; a smaller one comes from its heap, which
keeps freed memory for reuse and returns only what lies free at its top, once that exceeds the trim
threshold. The threshold starts at 128 KiB but is dynamic: each time a mapped block is freed, it rises
to that block's size (up to 32 MiB on 64-bit), and the trim threshold to twice that (mallopt(3),
M_MMAP_THRESHOLD, "dynamic mmap threshold"). Loading a model maps and frees blocks of many MiB, so
afterwards every activation of a training step (1-13 MB each for SmolLM2 on ~1,024 tokens) comes
from the heap, where the small allocations made between them (autograd's nodes, optimizer
bookkeeping) pin the freed pieces: the heap grows far past what is live. A checkpointed SmolLM2 LoRA
step keeps ~68 MB of saved tensors, yet its resident memory grew ~480 MB (bench/finetune.py --part
memory).

`fix_mmap_threshold(nbytes)` calls mallopt(M_MMAP_THRESHOLD, nbytes), which also turns the dynamic
rise off (for the trim threshold too, which it fixes at glibc's 128 KiB): blocks of `nbytes` and more
are mapped and unmapped, so the resident memory follows the live tensors. It must run before the
model loads: a large request is still served from free heap space when there is some, so a heap
already swollen by loading keeps serving the steps (set after loading, it changed nothing:
1,377 against 1,381 MB). Set first, it does what glibc's MALLOC_MMAP_THRESHOLD_=131072 at process
start does (the same peak to 1 MB).

What it costs: a mapped block's pages are fresh, so every large tensor of every step takes page
faults (the kernel zeroes its pages) and an munmap, where a heap block would be reused warm. On
small fast steps that is most of the step: shakespeare-char's bf16 step 43 -> 73 ms, multi30k-en-de's
866 -> 1,266 ms (bench/train_step.py, AMD EPYC, 2 threads). So it is the default only in a run that
checkpoints its activations, which has chosen memory over speed already.

Every other run keeps its heap (`fix_mmap_threshold(MAX, keep_heap=True)`): blocks below 32 MiB come
from the heap from the first step, and the trim threshold is fixed at KEEP_TRIM (1 GiB), so what a
step frees at the heap's top stays resident for the next step instead of going back to the system
and faulting in again. glibc's dynamic rule trims whenever the free top passes twice the largest
mapped block freed so far (a few MB), and the next step faulted the pages in again, each ~2 µs on
an AMD EPYC Zen 5 (a throwaway mmap-and-touch loop): the translation step (multi30k-en-de, bf16,
2,000-token batches) 26,000-30,000 minor faults a step, ~3,500 kept, 328-369 -> 281-322 ms in three
alternated pairs (bench/train_step.py with and without --malloc-mmap-threshold 0,
bench/results/train_step_heap_kept_zen5.jsonl); the Mamba recipe alone 1,976-2,790 a step, 12-15 kept
(..._heap_kept_mamba_zen5.jsonl). The resident memory is then the heap's high-water mark, which a
training process reaches every step anyway (410 MB both for the Mamba run; 1.23-1.27 GB against 1.26-1.27 GB for the translation run).

`heap_setup(setting, checkpointing)` says which (TrainConfig.malloc_mmap_threshold, applied by
tasks/base.py before anything is built, for every recipe; the benches call it the same way): None =
by checkpointing as above; 0 = glibc's dynamic threshold always; N = N bytes always (trimmed at
glibc's 128 KiB). Where the environment sets glibc's own MALLOC_MMAP_THRESHOLD_ (or
MALLOC_TRIM_THRESHOLD_), that stands. It
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

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
GLIBC_ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc's own tunable, read when the process starts
GLIBC_TRIM_ENV = "MALLOC_TRIM_THRESHOLD_"  # likewise for the trim threshold (also GLIBC_TUNABLES' malloc ones)
DEFAULT = 128 << 10  # bytes: glibc's initial threshold (DEFAULT_MMAP_THRESHOLD_MIN), kept fixed
MAX = 32 << 20  # bytes: glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit); mallopt refuses more
KEEP_TRIM = 1 << 30  # bytes: the trim threshold of a kept heap: its free top goes back only past 1 GiB


def is_glibc() -> bool:
    """Whether this process runs on Linux with glibc (where mallopt's M_MMAP_THRESHOLD exists)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def mmap_threshold(setting: int | None, checkpointing: bool) -> int:
    """The threshold a run fixes (bytes; 0 = none): `setting` (TrainConfig.malloc_mmap_threshold)
    when given, else DEFAULT for a run that checkpoints its activations and MAX (with its heap kept:
    heap_setup) for one that does not (module docstring)."""
    if setting is not None:
        return setting
    return DEFAULT if checkpointing else MAX


def fix_mmap_threshold(nbytes: int, keep_heap: bool = False) -> bool:
    """Serve blocks of `nbytes` bytes and more with their own mappings, unmapped when freed, from now
    on in this process, and stop glibc's thresholds from rising (module docstring); the trim threshold
    fixed with it: KEEP_TRIM with keep_heap (the heap keeps what the steps free), else glibc's 128 KiB
    (also after an earlier keep_heap call in this process), unless the environment sets glibc's own.

    Args:
        nbytes: the threshold in bytes, 0 < nbytes <= MAX; 0 = do nothing (glibc's dynamic default).
        keep_heap: the trim threshold KEEP_TRIM (else DEFAULT, glibc's initial one).
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
        libc = ctypes.CDLL("libc.so.6")
        fixed = bool(libc.mallopt(M_MMAP_THRESHOLD, int(nbytes)))
        if fixed and not _trim_set_by_environment():
            libc.mallopt(M_TRIM_THRESHOLD, KEEP_TRIM if keep_heap else DEFAULT)
        return fixed
    except (OSError, AttributeError):
        return False


def _trim_set_by_environment() -> bool:
    """Whether glibc's own trim threshold is set for this process (MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES)."""
    return GLIBC_TRIM_ENV in os.environ or "glibc.malloc.trim_threshold" in os.environ.get("GLIBC_TUNABLES", "")


def heap_setup(setting: int | None, checkpointing: bool) -> dict:
    """Set up this process's heap for a training run, before it builds anything (module docstring).

    Args:
        setting: TrainConfig.malloc_mmap_threshold (None, 0 or bytes). checkpointing: whether the run
            checkpoints its activations.
    Returns:
        what was done, for a bench's JSON: {"malloc_mmap_threshold": bytes (0: glibc's dynamic),
        "heap_kept": whether the trim threshold is KEEP_TRIM, "mmap_threshold_fixed": whether mallopt
        took it (False for 0, under MALLOC_MMAP_THRESHOLD_, off glibc)}.
    Raises:
        ValueError: for a setting < 0 or > MAX.
    """
    nbytes = mmap_threshold(setting, checkpointing)
    keep = setting is None and not checkpointing
    fixed = fix_mmap_threshold(nbytes, keep_heap=keep)
    return {"malloc_mmap_threshold": nbytes, "heap_kept": keep and fixed and not _trim_set_by_environment(),
            "mmap_threshold_fixed": fixed}


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
