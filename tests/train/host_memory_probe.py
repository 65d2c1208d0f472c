"""Run as `python tests/train/host_memory_probe.py ATTNLAB_TRAIN_ARGS...`: `attnlab train` as a user runs
it, stopped when the task starts to prepare the run (before any model or data is loaded), where one
JSON line says whether glibc then maps a large block on its own, and whether its heap keeps a freed
block at its top (tests/train/test_host_memory.py)."""
from __future__ import annotations

import ctypes
import json
import sys

from attnlab.cli import main
from attnlab.recipes import get_recipe
from attnlab.tasks.registry import task_of_recipe

PROBE = 24 << 20  # bytes: more than any free heap space a process has before its model loads


class MallInfo2(ctypes.Structure):  # glibc >= 2.33, mallinfo(3)
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]


def maps_a_large_block() -> bool:
    """Whether a PROBE-byte malloc gets a mapping of its own after a larger mapped block was freed
    (which raises glibc's dynamic threshold past PROBE; a fixed threshold stays where it was set)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    libc.mallinfo2.restype = MallInfo2
    libc.free(libc.malloc(PROBE + (6 << 20)))
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(PROBE)
    mapped = libc.mallinfo2().hblkhd - before >= PROBE
    libc.free(block)
    return mapped


SMALL = 120 << 10  # bytes: below every mmap threshold (128 KiB and up), so from the heap whatever the setting


def keeps_a_freed_heap_top() -> bool:
    """Whether the heap keeps 600 freed SMALL blocks at its top (70 MiB, past glibc's largest dynamic
    trim threshold, twice 32 MiB): not trimmed when freed. The blocks come from the heap under any mmap
    threshold, so what this sees is the trim threshold alone."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    libc.mallinfo2.restype = MallInfo2
    blocks = [libc.malloc(SMALL) for _ in range(600)]
    held = libc.mallinfo2().arena
    for block in reversed(blocks):
        libc.free(block)
    return libc.mallinfo2().arena >= held


def stop_at_prepare(task_class) -> None:
    def prepare(self, spec):
        kept = keeps_a_freed_heap_top()  # first: maps_a_large_block's blocks would leave a free top
        print(json.dumps({"maps_a_large_block": maps_a_large_block(), "keeps_a_freed_heap_top": kept}))
        sys.stdout.flush()
        raise SystemExit(0)
    task_class.prepare = prepare


if __name__ == "__main__":
    argv = sys.argv[1:]
    stop_at_prepare(type(task_of_recipe(get_recipe(argv[argv.index("--recipe") + 1]))))
    sys.exit(main(argv))
