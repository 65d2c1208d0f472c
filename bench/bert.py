"""Benchmark: BERT on SST-2 — what masked-LM pretraining buys, and fine-tuning the real MiniLM.

Runs, in one go, into --out: bert-mlm (masked-LM pretraining from scratch), sst2 fine-tuned from
that run, sst2 from random initialisation with the same budget (init=none), and sst2-minilm
(all-MiniLM-L6-v2 fine-tuned). Prints one JSON line: SST-2 dev accuracy of each, the MLM figures,
steps and seconds, and the gain of pretraining as a difference and a ratio. A run directory that
already holds a finished run with the same budget is reported, not retrained (resume is exact).

    python bench/bert.py [--out runs/bench-bert] [--set key=value ...] [--skip-minilm]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from attnlab.recipes import get_recipe
from attnlab.tasks.registry import get_task


def run(name: str, out: Path, overrides: list[str]) -> dict:
    recipe = get_recipe(name).with_overrides(overrides)
    resume = (out / "checkpoint" / "state.json").is_file()
    summary = get_task("bert").train(recipe, out, resume=resume)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = max((r.get("elapsed_s", 0) for r in records), default=0)
    return {"steps": summary["steps"], "parameters": summary["parameters"], "train_seconds": seconds,
            **get_task("bert").evaluate(out, "dev")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench-bert")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applied to every run")
    ap.add_argument("--skip-minilm", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    results = {"bert-mlm": run("bert-mlm", out / "bert-mlm", args.set)}
    results["sst2-from-bert-mlm"] = run("sst2", out / "sst2-pretrained", args.set + [f"init={out / 'bert-mlm'}"])
    results["sst2-from-scratch"] = run("sst2", out / "sst2-scratch", args.set + ["init=none"])
    if not args.skip_minilm:
        results["sst2-minilm"] = run("sst2-minilm", out / "sst2-minilm", args.set)
    pre, scratch = results["sst2-from-bert-mlm"]["accuracy"], results["sst2-from-scratch"]["accuracy"]
    print(json.dumps({"bench": "bert", "overrides": args.set, "results": results,
                      "pretraining_gain_accuracy": round(pre - scratch, 4),
                      "ratio_accuracy_pretrained_vs_scratch": round(pre / scratch, 3),
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
