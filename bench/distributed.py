"""Benchmark: one recipe trained by 1 process × 2 threads, and by 2 processes × 1 thread with DDP and
with FSDP2 (torchrun, gloo), side by side in one run (and 1 process × 1 thread for scale); training tokens/s of each (the median of the
logged windows, evaluations left out), ratios against the one process, and the equivalence figure:
the largest absolute difference of any parameter from the one-process run after the same steps.

On a machine with 2 cores this is a correctness feature, not a speed-up: the same 2 cores do the same
arithmetic, plus the gradient all-reduce (DDP) or the all-gathers and reduce-scatters (FSDP).

    python bench/distributed.py [--recipe shakespeare-char] [--steps 100] [--set KEY=VALUE ...]
                                [--json bench/results/distributed.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT

from attnlab.tensorfile import read_tensors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(nproc: int, threads: int, argv: list[str], out: Path) -> dict:
    """Train in `nproc` processes of `threads` threads each; the run's figures."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
    launch = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(free_port())] if nproc > 1 else [sys.executable])
    t0 = time.perf_counter()
    done = subprocess.run([*launch, "-m", "attnlab", "train", *argv, "--out", str(out)], env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"training failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rates = [r["tokens_per_s"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if "tokens_per_s" in r][1:]  # the first window holds start-up costs
    return {"processes": nproc, "threads_per_process": threads, "steps": result["steps"],
            "train_tokens_per_s": round(statistics.median(rates), 1), "val_loss": result.get("val_loss"),
            "wall_s": round(wall, 1)}


def max_difference(a: Path, b: Path) -> float:
    x, y = (read_tensors(p / "checkpoint" / "model.safetensors") for p in (a, b))
    return max((x[k] - y[k]).abs().max().item() for k in x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="shakespeare-char")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applied to every run")
    ap.add_argument("--out", default="runs/bench-distributed")
    ap.add_argument("--json", help="also write the JSON line to this file")
    args = ap.parse_args()
    overrides = ["dropout=0.0", "log_every=10", f"eval_every={args.steps}", f"checkpoint_every={args.steps}",
                 f"lr_decay_steps={args.steps}", "warmup_steps=10", *args.set]
    argv = ["--recipe", args.recipe, "--steps", str(args.steps), *(a for s in overrides for a in ("--set", s))]
    out = Path(args.out)
    runs = {"1 process x 2 threads": (1, 2, []), "1 process x 1 thread": (1, 1, []),
            "2 processes x 1 thread, DDP": (2, 1, ["parallel=ddp"]),
            "2 processes x 1 thread, FSDP2": (2, 1, ["parallel=fsdp"])}
    results, first = {}, None
    for i, (name, (nproc, threads, extra)) in enumerate(runs.items()):
        run = out / f"run{i}"
        results[name] = train(nproc, threads, argv + [a for s in extra for a in ("--set", s)], run)
        if first is None:
            first = (run, results[name])
        else:
            results[name]["max_abs_param_diff_vs_1_process"] = max_difference(first[0], run)
            results[name]["ratio_tokens_per_s_vs_1_process"] = round(
                results[name]["train_tokens_per_s"] / first[1]["train_tokens_per_s"], 2)
    line = json.dumps({"bench": "distributed", "recipe": args.recipe, "steps": args.steps, "overrides": overrides,
                       "cpu_cores": os.cpu_count(), "results": results})
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")


if __name__ == "__main__":
    main()
