"""Benchmark: the Tiny Shakespeare language-model recipes at nanoGPT's CPU budget, side by side.

Trains each recipe for its 2,000 steps (nanoGPT's "baby GPT": 4 layers, 4 heads, d_model 128,
block 64, batch 12; nanoGPT reports a validation loss of about 1.88) in one run and prints one JSON
line: final and best validation loss, bits per byte, parameters, training tokens/s, and the fraction
of this machine's measured fp32 matmul rate; ratios against the first recipe. --plot draws the
validation-loss curves.

    python bench/lm.py [--recipes shakespeare-char shakespeare-char-llama ...] [--steps N] [--plot FILE]
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from _common import machine_peaks, save_figure

from attnlab.config import GPTConfig
from attnlab.lm import train_lm
from attnlab.recipes import get_recipe

NANOGPT_VAL_LOSS = 1.88  # nanoGPT README, CPU "baby GPT" after 2,000 iterations


def train_flops_per_token(cfg: GPTConfig, block: int) -> float:
    """Matmul FLOPs of forward + backward (3 × forward) per token: 2 per active weight, plus
    QKᵀ and AV over the block (4·T·D per layer, the full T×T scores that SDPA computes)."""
    d, dh = cfg.d_model, cfg.head_dim
    attn = d * cfg.n_heads * dh * 2 + d * cfg.n_kv_heads * dh * 2
    ffn = d * cfg.d_ff * (3 if cfg.activation == "swiglu" else 2)
    if cfg.n_experts:
        ffn = ffn * cfg.moe_top_k + d * cfg.n_experts
    per_layer = 2 * (attn + ffn) + 4 * block * d
    return 3 * (cfg.n_layers * per_layer + 2 * d * cfg.vocab_size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["shakespeare-char", "shakespeare-char-llama"])
    ap.add_argument("--steps", type=int, help="override the recipes' step budget (and decay length)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applied to every recipe")
    ap.add_argument("--out", default="runs/bench-lm")
    ap.add_argument("--plot", help="write the validation-loss curves to this PNG")
    args = ap.parse_args()
    peaks = machine_peaks()
    results, curves = {}, {}
    for name in args.recipes:
        overrides = list(args.set) + ([f"max_steps={args.steps}", f"lr_decay_steps={args.steps}"] if args.steps else [])
        recipe = get_recipe(name).with_overrides(overrides)
        out = Path(args.out) / name
        shutil.rmtree(out, ignore_errors=True)
        summary = train_lm(recipe, out)
        cfg = GPTConfig.from_dict(json.loads((out / "config.json").read_text())["model"])
        records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
        gflops = train_flops_per_token(cfg, recipe.data.block_size) * summary["tokens_per_s"] / 1e9
        results[name] = {"parameters": summary["parameters"], "steps": summary["steps"],
                         "val_loss": summary["val_loss"], "best_val_loss": summary["best"],
                         "perplexity": summary["perplexity"], "bits_per_byte": summary.get("bits_per_byte"),
                         "train_tokens_per_s": summary["tokens_per_s"], "train_gflops": round(gflops, 1)}
        if peaks:
            results[name]["fraction_of_fp32_matmul_peak"] = round(gflops / peaks["fp32_matmul_gflops"], 3)
    first = results[args.recipes[0]]
    for name in args.recipes[1:]:
        r = results[name]
        r["ratio_val_loss_vs_first"] = round(r["val_loss"] / first["val_loss"], 3)
        r["ratio_tokens_per_s_vs_first"] = round(r["train_tokens_per_s"] / first["train_tokens_per_s"], 2)
    print(json.dumps({"bench": "lm", "reference_nanogpt_val_loss": NANOGPT_VAL_LOSS, "overrides": args.set,
                      "results": results, "machine": peaks, "threads": torch.get_num_threads()}))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, curve in curves.items():
            ax.plot([c[0] for c in curve], [c[1] for c in curve], marker="o", label=name)
        ax.axhline(NANOGPT_VAL_LOSS, ls="--", color="gray", label=f"nanoGPT CPU baby GPT ({NANOGPT_VAL_LOSS})")
        ax.set_xlabel("optimizer step (batch 12 × 64 tokens)")
        ax.set_ylabel("validation loss (nats per token)")
        ax.set_title("Tiny Shakespeare, character level")
        ax.set_ylim(top=min(3.5, ax.get_ylim()[1]))
        ax.legend()
        save_figure(fig, args.plot)


if __name__ == "__main__":
    main()
