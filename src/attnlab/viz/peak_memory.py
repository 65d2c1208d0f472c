"""Peak extra memory of causal attention, measured from the process's resident set (Linux).

Run in its own process (`python -m attnlab.viz.peak_memory HEADS HEAD_DIM T ...` prints one JSON
line {"math": {"T": bytes, ...}, "sdpa": {...}}) because measuring changes how this process allocates: glibc is told to
serve every block over 64 KiB with mmap, so that each tensor's pages are fresh when allocated and
returned when freed; then the kernel's peak-RSS counter (VmHWM, reset through /proc/self/clear_refs)
minus the RSS before the call is the call's peak extra memory.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.train.host_memory import fix_mmap_threshold


def _status(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


def supported() -> bool:
    """Whether this system can measure it (Linux with glibc and a writable /proc/self/clear_refs)."""
    return sys.platform.startswith("linux") and Path("/proc/self/clear_refs").exists()


def peak_bytes(impl: str, heads: int, head_dim: int, lengths: list[int]) -> dict[int, int]:
    """{T: peak extra bytes of one causal attention call over T tokens} (batch 1, fp32)."""
    fix_mmap_threshold(1 << 16)  # train/host_memory.py (glibc's own MALLOC_MMAP_THRESHOLD_ stands)
    out = {}
    for t in lengths:
        q, k, v = (torch.randn(1, heads, t, head_dim) for _ in range(3))  # (B, H, T, Dh)
        scaled_dot_product_attention(q, k, v, impl=impl, is_causal=True)  # warm-up
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _status("VmRSS")
        result = scaled_dot_product_attention(q, k, v, impl=impl, is_causal=True)
        out[t] = max(0, _status("VmHWM") - before)
        del result
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    heads_, dim_, *ts = (int(a) for a in sys.argv[1:])
    print(json.dumps({impl: peak_bytes(impl, heads_, dim_, ts) for impl in ("math", "sdpa")}))
