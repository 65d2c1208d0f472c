"""Benchmark: the Vision Transformer on MNIST (10 minutes, 2 CPU cores) and on the UCI digits.

Trains mnist-vit for its 10-minute budget on a seeded 8,000 / 2,000 split of the 10,000 MNIST
images and digits-vit for its budget, in one run, and prints one JSON line: held-out accuracy,
steps, training images/s, the accuracy curve against wall-clock time. --plot draws the curve.

    python bench/vit.py [--minutes 10] [--set key=value ...] [--plot FILE]
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from _common import save_figure

from attnlab.recipes import get_recipe
from attnlab.tasks.registry import get_task


def run(name: str, out: Path, overrides: list[str]) -> tuple[dict, list]:
    shutil.rmtree(out, ignore_errors=True)
    summary = get_task("vit").train(get_recipe(name).with_overrides(overrides), out)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [[r["elapsed_s"], r["accuracy"]] for r in records if "accuracy" in r]
    final = get_task("vit").evaluate(out, "test")
    seconds = max(r["elapsed_s"] for r in records)
    return {"held_out_accuracy": final["accuracy"], "n_test": final["n"], "steps": summary["steps"],
            "parameters": summary["parameters"], "train_seconds": seconds,
            "images_per_s": summary.get("images_per_s")}, curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="mnist-vit's wall-clock budget")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default="runs/bench-vit")
    ap.add_argument("--plot")
    args = ap.parse_args()
    out = Path(args.out)
    mnist, curve = run("mnist-vit", out / "mnist-vit", args.set + [f"minutes={args.minutes}"])
    digits, digits_curve = run("digits-vit", out / "digits-vit", args.set)
    print(json.dumps({"bench": "vit", "minutes": args.minutes, "overrides": args.set, "mnist_vit": mnist,
                      "mnist_accuracy_curve_s": curve, "digits_vit": digits, "threads": torch.get_num_threads()}))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([c[0] / 60 for c in curve], [100 * c[1] for c in curve], marker="o", label="mnist-vit, held-out 2,000")
        ax.axhline(98, ls="--", color="gray", label="98%")
        ax.set_xlabel("wall-clock minutes (2 CPU cores)")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(90, 100)
        ax.set_title("Vision Transformer on MNIST")
        ax.legend()
        save_figure(fig, args.plot)


if __name__ == "__main__":
    main()
