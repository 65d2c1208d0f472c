"""Helpers shared by the benchmark scripts."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from attnlab.jsonfile import write_json_atomic
from attnlab.nn.cpu_tuning import cpu_info
from attnlab.nn.quant_kernel import instruction_set

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def machine_peaks(threads: int | None = None) -> dict:
    """This machine's measured fp32 matmul GFLOP/s and memory bandwidth (../shared/tools), or {}."""
    tool = SHARED / "tools" / "machine_peaks.py"
    if not tool.is_file():
        return {}
    extra = [] if threads is None else ["--threads", str(threads)]
    out = subprocess.run([sys.executable, str(tool), *extra], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def lscpu_model_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")


def host(threads: int) -> dict:
    """What every bench JSON records of the machine it ran on: lscpu's model name, the vendor, the
    flags that matter (avx512_vnni, avx512_bf16, amx), the C++ extension's instruction set here
    (quant_kernel.instruction_set: "avx512", "avx2" or None), the threads, and the bandwidth (GB/s)
    and fp32 matmul GFLOP/s measured now with those threads."""
    info = cpu_info()
    return {"model_name": lscpu_model_name() or info["model_name"], "vendor": info["vendor"], "flags": info["flags"],
            "kernel_instruction_set": instruction_set(), "threads": threads, **{k: v for k, v in machine_peaks(threads).items() if k != "threads"}}


def lscpu() -> dict:
    """This host's CPU without the timed probes: lscpu's model name, the vendor, the flags that
    matter (avx512_vnni, avx512_bf16, amx), the C++ extension's instruction set and the CPU count."""
    info = cpu_info()
    return {"model_name": lscpu_model_name() or info["model_name"], "vendor": info["vendor"],
            "flags": info["flags"], "kernel_instruction_set": instruction_set(), "cpus": os.cpu_count()}


def save_figure(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def spread(values: list[float]) -> dict:
    """median, min and max of a bench's repeated figures, rounded to 3 places."""
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def emit(result: dict, out: str | None) -> None:
    """Print a bench's result as its one JSON line, and write it (atomically) to `out` when given."""
    print(json.dumps(result))
    if out:
        write_json_atomic(out, result)
