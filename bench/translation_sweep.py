"""Tuning the multi30k-en-de recipe for a short budget, on the validation set, at a fixed amount of
training instead of a fixed time: losses and BLEU after N steps do not depend on the machine's
speed, so these runs need no quiet machine (run them with OMP_NUM_THREADS=1, one or two at a time).

The budget is in target tokens (--target-tokens, default 1.02 M: ~1,700 target tokens/s for 600 s,
this machine's slow hour for the recipe's fp32 loop) and becomes a step count from the batches of
the run's own first epoch, so candidates with other batch sizes or vocabularies see the same data.
Each candidate trains into its own run directory, then validation BLEU is measured on the whole
validation split (1,014 sentences) with greedy decoding (and beam 4 with --beam). Appends one JSON
line per candidate to --jsonl and prints it.

    python bench/translation_sweep.py --name noam-bt3000 [--set key=value ...] [--target-tokens 1.02e6]
        [--steps N] [--beam] [--averages] [--jsonl bench/results/translation_sweep.jsonl]

--clock-steps N replays the recipe's wall-clock schedule (a cosine over the minutes budget, and a
warmup_ratio of it) at a fixed N steps: the clock reads (steps done / N) of the budget, as at a
steady step rate, so a budget's schedule is tuned at the steps that fit in it (e.g. 54 for 2 minutes
on one thread) on a shared machine.

--averages also scores (greedy, whole validation split) the trained weights and the average of the
last k snapshots for k = 2 .. average_last, from the snapshots the run kept; --evaluate-only
scores an existing run directory again instead of training it.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from _common import lscpu

from attnlab.data.translation import ParallelCorpus, read_parallel, token_batches
from attnlab.recipes import get_recipe
from attnlab.seeding import mix_seed
from attnlab.tasks.registry import get_task
from attnlab.tasks.translation import SPECIAL_TOKENS, TranslationDataConfig, corpus_bleu, translate
from attnlab.train.end_of_run import average_snapshots
from attnlab.train.loop import Trainer
from attnlab.train.run_dir import snapshot_path, snapshot_steps
from attnlab.tokenizers import ByteLevelBPE


def steps_for_tokens(recipe, target_tokens: float) -> tuple[int, float]:
    """(steps, target tokens per step) for `target_tokens` of training under the recipe's tokenizer
    vocabulary, max_len and batch_tokens, from its first epoch's batches."""
    data, model = recipe.data, recipe.model
    src, tgt = read_parallel(data.dataset, "train", data.src_lang, data.tgt_lang)
    tok = ByteLevelBPE.train(src + tgt, data.tokenizer_vocab_size, SPECIAL_TOKENS)
    corpus = ParallelCorpus.encode(tok, src, tgt, min(data.max_len, model.max_seq_len))
    batches = token_batches(corpus, data.batch_tokens, seed=mix_seed(recipe.train.seed, 0))
    per_step = corpus.target_tokens() / len(batches) * recipe.train.grad_accum_steps
    return max(1, math.ceil(target_tokens / per_step)), per_step


def average_scores(out: Path) -> dict:
    """Validation BLEU (greedy, all sentences) of the run's last weights and of the average of its last
    k snapshots, k = 2 .. all it kept: {"last": bleu, "2": bleu, ...}."""
    task = get_task("seq2seq")
    run = task.load(out)
    steps = snapshot_steps(out)
    data = TranslationDataConfig.from_dict(run.config["data"])
    src, refs = read_parallel(data.dataset, "val", data.src_lang, data.tgt_lang)
    scores = {}
    for k in range(1, len(steps) + 1):
        average_snapshots(run.model, [snapshot_path(out, s) for s in steps[-k:]])
        hyps = translate(run.model, run.tokenizer, src, beam_size=1)
        scores["last" if k == 1 else str(k)] = round(corpus_bleu(hyps, refs), 2)
    return scores


def replay_clock(steps: int) -> None:
    """Make every Trainer's clock read (steps done / steps) of its minutes budget: the wall-clock
    schedule of a run at a steady step rate, which stops after `steps` steps (a bench-only stand-in
    for the real clock, so that the run does not depend on the machine's speed)."""
    Trainer.elapsed = lambda self: self.state.step / steps * self.cfg.minutes * 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True, help="the candidate's name (its run directory under --runs)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--target-tokens", type=float, default=1.02e6)
    ap.add_argument("--steps", type=int, help="a step budget instead of --target-tokens")
    ap.add_argument("--clock-steps", type=int, help="the recipe's clock schedule replayed over this many steps")
    ap.add_argument("--beam", action="store_true", help="also validation BLEU with beam 4")
    ap.add_argument("--averages", action="store_true", help="also the averages of the last k snapshots")
    ap.add_argument("--evaluate-only", action="store_true", help="score the existing run directory")
    ap.add_argument("--runs", default="runs/sweep")
    ap.add_argument("--jsonl", default="bench/results/translation_sweep.jsonl")
    args = ap.parse_args()
    recipe = get_recipe("multi30k-en-de").with_overrides(args.set)
    if args.clock_steps:
        steps, per_step = args.clock_steps, None
        replay_clock(steps)
    else:
        recipe = recipe.with_overrides(["minutes=none"])
        steps, per_step = (args.steps, None) if args.steps else steps_for_tokens(recipe, args.target_tokens)
        recipe = recipe.with_overrides([f"max_steps={steps}"])
    out = Path(args.runs) / args.name
    task = get_task("seq2seq")
    t0 = time.perf_counter()
    summary = task.train(recipe, out, resume=args.evaluate_only)
    wall = time.perf_counter() - t0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "val_bleu" in r]
    averaged = [r for r in evals if "averaged" in r]
    val = task.evaluate(out, "val", beam=1)
    result = {
        "bench": "translation_sweep", "name": args.name, "overrides": args.set, "steps": summary["steps"],
        "schedule": f"clock replayed over {steps} steps" if args.clock_steps else "steps",
        "val_loss": evals[-1 - bool(averaged)]["val_loss"],  # of the trained (not averaged) weights
        "val_bleu_greedy_full": val["bleu"], "kept": "average" if summary["best_step"] == summary["steps"]
        and averaged and averaged[-1][recipe.data.best_metric] == summary["best"] else f"step {summary['best_step']}",
        "val_bleu_curve": [[r["step"], r["val_bleu"]] for r in evals if "averaged" not in r],
        "val_bleu_averaged": averaged[-1]["val_bleu"] if averaged else None,
        "time_s": {k: v for k, v in summary["time_s"].items() if not (args.clock_steps and k == "train_steps")},
        "wall_s": round(wall, 1), "threads": torch.get_num_threads(),  # (--clock-steps: no train_steps seconds,
        # the loop's count is the replayed clock's)
        "host": lscpu().get("model_name", "unknown"),
    }
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    result["target_tokens"] = state["tokens"]
    result["target_tokens_per_step"] = round(state["tokens"] / max(summary["steps"], 1), 1)
    if per_step:
        result["budget_target_tokens"] = args.target_tokens
    if args.beam:
        result["val_bleu_beam4_full"] = task.evaluate(out, "val", beam=4)["bleu"]
    if args.averages:
        result["val_bleu_greedy_full_by_average"] = average_scores(out)
    line = json.dumps(result)
    with open(args.jsonl, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
