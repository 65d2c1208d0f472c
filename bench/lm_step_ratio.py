"""Benchmark: the training steps of several recipes in one rotation, as ratios to the first.

bench/lm.py trains its recipes one after the other, so a drift of this shared machine's speed
between them (nanoGPT's own rate has moved 11,200-15,900 tok/s from one run to the next here)
lands on one recipe only. This bench builds each recipe's Trainer (train/loop.py, its own defaults:
`autocast` as the recipe sets it on this CPU, or `--set KEY=VALUE` for every recipe) on its own
batches, times `--warmup` steps apart, then the recipes take turns, `--steps` steps each per round for
`--rounds` rounds (the order rotating), so a drift touches them alike. The process's heap is set up
as `attnlab train` sets up its own for these recipes (train/host_memory.py heap_setup: kept), or as
`--malloc-mmap-threshold N` says (0: glibc's dynamic threshold). Prints one JSON line: per
recipe the median ms per step, tokens per step and tokens/s, its ratio to the first recipe, the
settings that matter (autocast, optimizer_impl), and the host.

    python bench/lm_step_ratio.py [--recipes shakespeare-char shakespeare-char-mamba] [--steps 4]
                                  [--rounds 10] [--threads 2] [--set KEY=VALUE]
                                  [--malloc-mmap-threshold BYTES]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import host
from _recipe_trainer import add_heap_argument, build_trainer, prepare, windows

from attnlab.recipes import get_recipe
from attnlab.train.host_memory import heap_setup
from attnlab.train.loop import Trainer


def recipe_trainer(name: str, overrides: list[str], root: Path) -> tuple[Trainer, list]:
    """Recipe `name`'s Trainer at its defaults (plus `overrides`) and its first batches, one window a step."""
    recipe = get_recipe(name).with_overrides(overrides)
    task, prepared = prepare(recipe, root)
    torch.manual_seed(recipe.train.seed)
    return build_trainer(task, prepared, recipe.train, root / "run"), windows(recipe, prepared, 40)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["shakespeare-char", "shakespeare-char-mamba"])
    ap.add_argument("--steps", type=int, default=4, help="steps per recipe per round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3, help="first steps of each recipe, not timed")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applied to every recipe")
    add_heap_argument(ap)
    args = ap.parse_args()
    heap = heap_setup(args.malloc_mmap_threshold, checkpointing=False)  # as `attnlab train` sets up its process
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: recipe_trainer(name, args.set, Path(tmp) / name) for name in args.recipes}
        times: dict[str, list[float]] = {name: [] for name in args.recipes}
        tokens = {}
        for name, (run, windows) in runs.items():
            for w in windows[:args.warmup]:
                run._train_step(w)
        for r in range(args.rounds):
            order = args.recipes[r % len(args.recipes):] + args.recipes[:r % len(args.recipes)]
            for name in order:
                run, windows = runs[name]
                for i in range(args.steps):
                    w = windows[args.warmup + (r * args.steps + i) % (len(windows) - args.warmup)]
                    start = time.perf_counter()
                    _, tokens[name] = run._train_step(w)
                    times[name].append(time.perf_counter() - start)
        settings = {name: {k: getattr(run.cfg, k) for k in ("autocast", "optimizer_impl", "compile")}
                    for name, (run, _) in runs.items()}
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    first = args.recipes[0]
    results = {name: {"ms_per_step": round(ms[name], 2), "tokens_per_step": tokens[name],
                      "tokens_per_s": round(tokens[name] / ms[name] * 1e3, 1),
                      "ratio_tokens_per_s_vs_first": round((tokens[name] / ms[name]) / (tokens[first] / ms[first]), 3),
                      "ms_per_step_min_max": [round(min(times[name]) * 1e3, 2), round(max(times[name]) * 1e3, 2)],
                      **settings[name]} for name in args.recipes}
    print(json.dumps({"bench": "lm_step_ratio", "overrides": args.set, "steps_per_round": args.steps,
                      "rounds": args.rounds, **heap, "results": results, "host": host(args.threads)}))


if __name__ == "__main__":
    main()
