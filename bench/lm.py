"""Benchmark: the Tiny Shakespeare language-model recipes at nanoGPT's CPU budget, side by side.

Trains each recipe for its 2,000 steps (nanoGPT's "baby GPT": 4 layers, 4 heads, d_model 128,
block 64, batch 12; nanoGPT reports a validation loss of about 1.88) in one run and prints one JSON
line: final and best validation loss (one exact pass over the whole validation text), bits per byte
(comparable across tokenizers), parameters, training tokens/s, the fraction of this machine's
measured fp32 matmul rate, and for character models the spread of nanoGPT's own 20-batch estimate
on the final weights; ratios against the first recipe. --plot draws the validation-loss curves
(character-level recipes only: nats per BPE token are on another scale). --workers N trains N of the
(recipe, seed) runs at a time, each in its own process on cores/N threads (the losses do not depend
on it; the tokens/s are then those of a run sharing the machine, as the JSON's "threads_per_run" says).

    python bench/lm.py [--recipes shakespeare-char shakespeare-char-llama ...] [--steps N] [--seeds 0 1 2 3]
                       [--set KEY=VALUE] [--workers N] [--plot FILE]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from _common import machine_peaks, save_figure

from attnlab.data.text import TokenStream, read_text, split_text
from attnlab.models.gpt import GPTConfig
from attnlab.recipes import get_recipe
from attnlab.tasks.language_model import TextDataConfig
from attnlab.models.mamba import MambaConfig
from attnlab.tasks.registry import load_run, task_of_recipe
from attnlab.train.checkpoint import load_weights

NANOGPT_VAL_LOSS = 1.88  # nanoGPT README, CPU "baby GPT" after 2,000 iterations


def mamba_train_flops_per_token(cfg: MambaConfig) -> float:
    """Matmul FLOPs of forward + backward (3 × forward) per token of a Mamba: 2 per weight of
    in_proj (D → 2·Di), x_proj (Di → R + 2N), dt_proj (R → Di), out_proj (Di → D) and the output
    projection, plus the depthwise convolution (2·Di·K) and the scan's ~6·Di·N (discretise, update,
    read out); linear in the block length, so no term grows with T."""
    d, di, n, r, k = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.delta_rank, cfg.d_conv
    per_layer = 2 * (d * 2 * di + di * (r + 2 * n) + r * di + di * d) + 2 * di * k + 6 * di * n
    return 3 * (cfg.n_layers * per_layer + 2 * d * cfg.vocab_size)


def train_flops_per_token(cfg: GPTConfig, block: int) -> float:
    """Matmul FLOPs of forward + backward (3 × forward) per token: 2 per active weight, plus
    QKᵀ and AV over the block (4·T·D per layer, the full T×T scores that SDPA computes)."""
    d, dh = cfg.d_model, cfg.head_dim
    attn = d * cfg.n_heads * dh * 2 + d * cfg.kv_heads * dh * 2
    ffn = d * cfg.ffn_dim * (3 if cfg.activation == "swiglu" else 2)
    if cfg.n_experts:
        ffn = ffn * cfg.moe_top_k + d * cfg.n_experts
    per_layer = 2 * (attn + ffn) + 4 * block * d
    return 3 * (cfg.n_layers * per_layer + 2 * d * cfg.vocab_size)


@torch.no_grad()
def nanogpt_estimates(run: Path, draws: int = 50, eval_iters: int = 20) -> dict:
    """nanoGPT's CPU validation estimate (the mean loss of eval_iters random batches of 12 × block
    from the validation text), drawn `draws` times on the final weights: its mean, spread and range,
    to put nanoGPT's single reading beside our one exact pass over the whole validation text."""
    loaded = load_run(run)
    model, tokenizer, saved = loaded.model, loaded.tokenizer, loaded.config
    load_weights(model, run / "checkpoint" / "model.safetensors")  # the last step's weights
    data = TextDataConfig.from_dict(saved["data"])
    val = TokenStream(torch.tensor(tokenizer.encode(split_text(read_text(data.dataset), data.train_fraction)[1])))
    g = torch.Generator().manual_seed(0)
    values = []
    for _ in range(draws):
        offsets = val.random_offsets(eval_iters, data.batch_size, data.block_size, g)
        losses = [torch.nn.functional.cross_entropy(model(x).logits.flatten(0, 1), y.flatten()).item()
                  for x, y in (val.blocks(o, data.block_size) for o in offsets)]
        values.append(sum(losses) / len(losses))
    t = torch.tensor(values)
    return {"draws": draws, "eval_iters": eval_iters, "mean": round(t.mean().item(), 4),
            "sd": round(t.std().item(), 4), "min": round(t.min().item(), 4), "max": round(t.max().item(), 4)}


def train_one(name: str, overrides: list[str], out: Path) -> dict:
    """Train recipe `name` with `overrides` into a fresh `out`; its summary (tasks.base.Task.train)."""
    recipe = get_recipe(name).with_overrides(overrides)
    shutil.rmtree(out, ignore_errors=True)
    return task_of_recipe(recipe).train(recipe, out)


def train_all(jobs: list[tuple[str, list[str], Path]], workers: int) -> list[dict]:
    """The summaries of `jobs` (train_one's arguments), `workers` at a time in spawned processes (or
    here, one after another, with 1 worker)."""
    if workers == 1:
        return [train_one(*job) for job in jobs]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(train_one, *zip(*jobs)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["shakespeare-char", "shakespeare-char-llama", "shakespeare-bpe"])
    ap.add_argument("--steps", type=int, help="override the recipes' step budget (and decay length)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applied to every recipe")
    ap.add_argument("--seeds", type=int, nargs="+",
                    help="train each recipe once per seed (default: once, with its own seed); the figures are "
                         "the first seed's, with every seed's final validation loss, their mean and standard "
                         "deviation beside them")
    ap.add_argument("--workers", type=int, default=1, help="train this many runs at a time, on cores/N threads each")
    ap.add_argument("--out", default="runs/bench-lm")
    ap.add_argument("--plot", help="write the validation-loss curves to this PNG")
    args = ap.parse_args()
    peaks = machine_peaks()
    threads = max(1, (os.cpu_count() or 1) // args.workers) if args.workers > 1 else torch.get_num_threads()
    common = list(args.set) + ([f"max_steps={args.steps}", f"lr_decay_steps={args.steps}"] if args.steps else [])
    common += [f"threads={threads}"] if args.workers > 1 else []
    seeds = args.seeds or [None]
    jobs = [(name, common + ([f"seed={seed}"] if seed is not None else []),
             Path(args.out) / (name if i == 0 else f"{name}-seed{seed}"))
            for name in args.recipes for i, seed in enumerate(seeds)]
    summaries = dict(zip(((job[0], job[2]) for job in jobs), train_all(jobs, args.workers)))
    results, curves = {}, {}
    for name in args.recipes:
        recipe = get_recipe(name).with_overrides(common + ([f"seed={seeds[0]}"] if seeds[0] is not None else []))
        task = task_of_recipe(recipe)
        out = Path(args.out) / name
        summary = summaries[(name, out)]
        by_seed = {recipe.train.seed: summary["val_loss"]}
        for seed in seeds[1:]:
            by_seed[seed] = summaries[(name, out.with_name(f"{name}-seed{seed}"))]["val_loss"]
        cfg = task.model_config.from_dict(json.loads((out / "config.json").read_text())["model"])
        records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
        flops = (mamba_train_flops_per_token(cfg) if isinstance(cfg, MambaConfig)
                 else train_flops_per_token(cfg, recipe.data.block_size))
        gflops = flops * summary["tokens_per_s"] / 1e9
        results[name] = {"parameters": summary["parameters"], "steps": summary["steps"],
                         "val_loss": summary["val_loss"], "best_val_loss": summary["best"],
                         "perplexity": summary["perplexity"], "bits_per_byte": summary.get("bits_per_byte"),
                         "train_tokens_per_s": summary["tokens_per_s"], "train_gflops": round(gflops, 1)}
        if len(by_seed) > 1:
            losses = torch.tensor(list(by_seed.values()), dtype=torch.float64)
            results[name]["val_loss_by_seed"] = by_seed
            results[name]["val_loss_seed_mean"] = round(losses.mean().item(), 4)
            results[name]["val_loss_seed_sd"] = round(losses.std().item(), 4)
        if peaks:
            results[name]["fraction_of_fp32_matmul_peak"] = round(gflops / peaks["fp32_matmul_gflops"], 3)
        if recipe.data.tokenizer == "char":
            results[name]["nanogpt_style_estimate_final_weights"] = nanogpt_estimates(out)
    first = results[args.recipes[0]]
    for name in args.recipes[1:]:
        r = results[name]
        r["ratio_bits_per_byte_vs_first"] = round(r["bits_per_byte"] / first["bits_per_byte"], 3)
        r["ratio_tokens_per_s_vs_first"] = round(r["train_tokens_per_s"] / first["train_tokens_per_s"], 2)
    print(json.dumps({"bench": "lm", "reference_nanogpt_val_loss": NANOGPT_VAL_LOSS, "overrides": args.set,
                      "results": results, "machine": peaks, "workers": args.workers,
                      "threads_per_run": threads}))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, curve in curves.items():
            if get_recipe(name).data.tokenizer != "char":
                continue
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
