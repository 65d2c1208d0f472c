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


def save_figure(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
