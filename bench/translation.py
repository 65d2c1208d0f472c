"""Benchmark: the multi30k-en-de recipe trained for a wall-clock budget on this machine.

Prints one JSON line: test BLEU (sacreBLEU, test_2016_flickr, beam 4 and greedy), the curve of
validation BLEU against wall-clock time, training throughput (target tokens/s), the fraction of this
machine's measured fp32 matmul rate that training reaches, and, with --peer, the plain
torch.nn.Transformer baseline of ../shared/peers trained for the same budget in the same run, as ratios.
With --plot FILE it also draws the BLEU curve (needs matplotlib).

    python bench/translation.py --minutes 10 [--peer] [--set key=value ...] [--out DIR] [--plot FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from _common import SHARED, machine_peaks

from attnlab.data.translation import ParallelCorpus, read_parallel, token_batches
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.recipes import get_recipe
from attnlab.tasks.registry import get_task
from attnlab.tokenizers import ByteLevelBPE


def forward_flops(cfg: Seq2SeqConfig, b: int, s: int, t: int, n_labels: int) -> float:
    """Matmul FLOPs of one teacher-forced forward pass on a (B, S) source and (B, T) target batch,
    with the output projection on the n_labels real target positions (as the training loss does)."""
    d, f = cfg.d_model, cfg.ffn_dim
    enc = cfg.n_encoder_layers * (2 * b * s * (4 * d * d + 2 * d * f) + 4 * b * s * s * d)
    dec = cfg.n_decoder_layers * (2 * b * t * (4 * d * d + 2 * d * d + 2 * d * f) + 2 * b * s * 2 * d * d
                                  + 4 * b * t * t * d + 4 * b * t * s * d)
    return enc + dec + 2 * n_labels * d * cfg.vocab_size


def flops_per_target_token(run: Path) -> float:
    """Training FLOPs (3 × forward: forward + backward) per real target token, averaged over an epoch
    of the run's own batches."""
    saved = json.loads((run / "config.json").read_text())
    cfg, data = Seq2SeqConfig.from_dict(saved["model"]), {**saved["train"], **saved["data"]}  # older runs kept batch_tokens in "train"
    tok = ByteLevelBPE.load(run / "tokenizer.json")
    src, tgt = read_parallel(data["dataset"], "train", data["src_lang"], data["tgt_lang"])
    corpus = ParallelCorpus.encode(tok, src, tgt, min(data["max_len"], cfg.max_seq_len))
    total = 0.0
    for batch in token_batches(corpus, data["batch_tokens"], seed=0):
        s = max(len(corpus.src[i]) for i in batch)
        t = max(len(corpus.tgt[i]) + 1 for i in batch)
        total += 3 * forward_flops(cfg, len(batch), s, t, sum(len(corpus.tgt[i]) + 1 for i in batch))
    return total / corpus.target_tokens()


def run_peer(minutes: float) -> dict:
    """The torch.nn.Transformer baseline with its README's tuned settings, same budget."""
    script = SHARED / "peers" / "nn_transformer_multi30k.py"
    env = {**os.environ, "BT": "1500", "WARM": "200", "FACTOR": "0.7"}
    out = subprocess.run([sys.executable, str(script), str(SHARED / "data"), str(minutes)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--out", default="runs/bench-translation")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--peer", action="store_true", help="also train the torch.nn.Transformer peer")
    ap.add_argument("--plot", help="write the BLEU-vs-time curve to this PNG")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    peaks = machine_peaks()
    recipe = get_recipe("multi30k-en-de").with_overrides(args.set + [f"minutes={args.minutes}", "max_steps=none"])
    task = get_task("seq2seq")
    summary = task.train(recipe, out, resume=args.resume)
    beam = task.evaluate(out, "test", beam=4)
    greedy = task.evaluate(out, "test", beam=1)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [[r["elapsed_s"], r["val_bleu"]] for r in records if "val_bleu" in r and "averaged" not in r]
    averaged = [r["val_bleu"] for r in records if "averaged" in r]
    flops_tok = flops_per_target_token(out)
    achieved = flops_tok * summary["tokens_per_s"] / 1e9
    result = {
        "bench": "translation", "recipe": recipe.name, "minutes": args.minutes, "overrides": args.set,
        "parameters": summary["parameters"], "steps": summary["steps"],
        "test_bleu_beam4": beam["bleu"], "test_bleu_greedy": greedy["bleu"],
        "best_val_bleu_greedy": summary["best"], "val_bleu_curve_s": curve,
        "val_bleu_greedy_averaged_last": averaged[-1] if averaged else None,
        "tgt_tokens_per_s": summary["tokens_per_s"], "train_gflops": round(achieved, 1),
        "machine": peaks, "threads": torch.get_num_threads(),
    }
    if peaks:
        result["fraction_of_fp32_matmul_peak"] = round(achieved / peaks["fp32_matmul_gflops"], 3)
    if args.peer:
        peer = run_peer(args.minutes)
        result["peer"] = peer
        result["ratio_bleu_greedy_vs_peer"] = round(greedy["bleu"] / max(peer["bleu"], 1e-9), 2)
        result["ratio_tokens_per_s_vs_peer"] = round(summary["tokens_per_s"] / max(peer["tgt_tok_per_s"], 1e-9), 2)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([c[0] / 60 for c in curve], [c[1] for c in curve], marker="o", label="validation BLEU (greedy)")
        if averaged:
            ax.plot([curve[-1][0] / 60], [averaged[-1]], marker="*", ms=12, ls="",
                    label="validation BLEU, last checkpoints averaged")
        ax.axhline(beam["bleu"], ls="--", color="gray", label=f"test BLEU, beam 4: {beam['bleu']}")
        ax.set_xlabel("wall-clock minutes (2 CPU cores)")
        ax.set_ylabel("sacreBLEU")
        ax.set_title("multi30k-en-de: BLEU against training time")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
