"""Beam search's stopping rule on a trained translation run: sacreBLEU and decoding time of the exact
bound (the default) against the heuristic one, side by side in one run.

    python bench/beam.py --model runs/demo [--limit N] [--beam 4]

The exact rule never drops a hypothesis that could still win under the length-penalised score
(generate.beam_search); the heuristic stops a sentence once its best live hypothesis, scored at its
current length, cannot enter the beam (huggingface/transformers#20901). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from attnlab.data.translation import read_parallel
from attnlab.tasks.registry import load_run
from attnlab.tasks.translation import TranslationDataConfig, corpus_bleu, translate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="runs/demo")
    ap.add_argument("--limit", type=int, help="only the first N test sentences")
    ap.add_argument("--beam", type=int, default=4)
    args = ap.parse_args()
    run = load_run(args.model)
    data = TranslationDataConfig.from_dict(run.config["data"])
    src, refs = read_parallel(data.dataset, data.test_split, data.src_lang, data.tgt_lang)
    src, refs = src[:args.limit], refs[:args.limit]
    results = {}
    for rule in ("exact", "heuristic"):
        t0 = time.perf_counter()
        hyps = translate(run.model, run.tokenizer, src, args.beam, data.length_penalty, rule)
        results[rule] = {"bleu": round(corpus_bleu(hyps, refs), 2), "seconds": round(time.perf_counter() - t0, 1),
                         "hypotheses": hyps}
    same = sum(a == b for a, b in zip(results["exact"].pop("hypotheses"), results["heuristic"].pop("hypotheses")))
    print(json.dumps({"bench": "beam_stopping", "model": args.model, "split": data.test_split, "n": len(src),
                      "beam": args.beam, "length_penalty": data.length_penalty, **results,
                      "identical_outputs": same, "time_ratio_exact_over_heuristic":
                      round(results["exact"]["seconds"] / max(results["heuristic"]["seconds"], 1e-9), 2),
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
