"""Training-step speed of multi30k-en-de candidates, side by side in one process: the recipe and each
`--candidate "key=value ..."` train on their own real batches, one step each in turn, so that a
shared, drifting machine slows them alike; prints one JSON line with target tokens/s and seconds
per step of each, and their ratios to the recipe (the first entry).

The ratios turn a fixed-token tuning budget (bench/translation_sweep.py) into what a candidate
reaches in the same minutes: a candidate at ratio r trains r × the recipe's target tokens.

    python bench/translation_steps.py [--steps 12] [--warmup 2] [--set key=value ...]
        [--candidate "batch_tokens=1500" --candidate "d_ff=512 tokenizer_vocab_size=4000" ...]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from _common import lscpu

from attnlab.recipes import get_recipe
from attnlab.tasks.base import RunSpec
from attnlab.tasks.registry import get_task
from attnlab.train.loop import Trainer


def make_trainer(overrides: list[str], out: Path) -> tuple[Trainer, list]:
    """A Trainer of the recipe with `overrides` (nothing written) and its first epoch's batches."""
    recipe = get_recipe("multi30k-en-de").with_overrides(overrides)
    task = get_task("seq2seq")
    prepared = task.prepare(RunSpec(out, False, recipe.name, recipe.model, recipe.data, recipe.train, None))
    torch.manual_seed(recipe.train.seed)
    model = task.build_model(prepared.model_cfg)
    trainer = Trainer(model, prepared.objective, recipe.train, out, prepared.model_cfg.d_model)
    return trainer, prepared.objective.batches(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per candidate")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per candidate first")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applies to every candidate")
    ap.add_argument("--candidate", action="append", default=[], help='space-separated key=value settings')
    args = ap.parse_args()
    names = ["recipe"] + args.candidate
    with tempfile.TemporaryDirectory() as tmp:
        built = [make_trainer(args.set + c.split(), Path(tmp) / str(i)) for i, c in enumerate([""] + args.candidate)]
        spent, tokens = [0.0] * len(built), [0] * len(built)
        accum = [t.cfg.grad_accum_steps for t, _ in built]
        for step in range(args.warmup + args.steps):
            for i, (trainer, batches) in enumerate(built):
                group = batches[step * accum[i]:(step + 1) * accum[i]]
                t0 = time.perf_counter()
                _, n = trainer._train_step(group)
                if step >= args.warmup:
                    spent[i] += time.perf_counter() - t0
                    tokens[i] += n
    rates = [tok / max(s, 1e-9) for tok, s in zip(tokens, spent)]
    result = {"bench": "translation_steps", "overrides": args.set, "steps": args.steps, "candidates": [
        {"settings": name, "tgt_tokens_per_s": round(r, 1), "s_per_step": round(s / args.steps, 3),
         "tgt_tokens_per_step": round(tok / args.steps, 1), "ratio_tokens_per_s": round(r / rates[0], 3),
         "parameters": t.model.num_parameters()}
        for name, r, s, tok, (t, _) in zip(names, rates, spent, tokens, built)],
        "threads": torch.get_num_threads(), "host": lscpu()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
