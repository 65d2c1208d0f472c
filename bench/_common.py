"""Helpers shared by the benchmark scripts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def machine_peaks() -> dict:
    """This machine's measured fp32 matmul GFLOP/s and memory bandwidth (../shared/tools), or {}."""
    tool = SHARED / "tools" / "machine_peaks.py"
    if not tool.is_file():
        return {}
    out = subprocess.run([sys.executable, str(tool)], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def lscpu() -> dict:
    """This host's CPU: lscpu's model name, the instruction sets that matter for the kernels (VNNI,
    BF16, AMX) and the cores; {} where lscpu is missing."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    wanted = ["avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"]
    return {"model_name": fields.get("Model name", "").strip(), "flags": [f for f in wanted if f in flags],
            "cpus": int(fields.get("CPU(s)", "0").strip() or 0)}


def host(threads: int) -> dict:
    """lscpu() and machine_peaks() in one record, with the torch threads the figures used."""
    return {**lscpu(), "threads": threads, **{k: v for k, v in machine_peaks().items() if k != "threads"}}


def save_figure(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
