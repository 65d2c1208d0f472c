"""Benchmark: the multi30k-en-de recipe trained for wall-clock budgets on this machine.

For each budget (--minutes 2 4 10 trains three runs, one after the other) it prints test BLEU
(sacreBLEU, test_2016_flickr, beam 4 and greedy), the curve of validation BLEU against wall-clock
time, training throughput (target tokens/s, over the whole budget and over the optimizer steps
alone), where the budget went (optimizer steps, evaluations, checkpoints, the average's evaluation:
the loop's time_s), the fraction of this machine's measured fp32 matmul rate that training reaches,
and, with --peer, the plain torch.nn.Transformer baseline of ../shared/peers trained for the same
budget in the same run, side by side as ratios. With --concurrent ours and the peer train at the
same time, one thread and one CPU each (same machine, same moment, half the wall time; each at about
half its 2-thread speed). The host (lscpu's model name and flags) and its measured peaks are in the
JSON, so runs on different hosts compare at equal steps as well as at equal time. With --plot FILE
it also draws the BLEU curves (needs matplotlib).

--clock-scale F emulates a host F times slower than this one in every part of the run (steps,
evaluations, checkpoints): the budget's clock reads F × the real seconds, so the learning-rate
schedule, the warm-up and the end of the run fall where that host's would (F < 1: a faster host).
The JSON's steps, BLEU and tgt_tokens_per_s are the emulated host's; tgt_tokens_per_s_in_steps and
the seconds of evaluations and checkpoints are this host's (the budget's train_steps_s: the
emulated clock's total less those).

    python bench/translation.py --minutes 10 [2 4 ...] [--peer [--concurrent]] [--set key=value ...]
        [--out DIR] [--plot FILE] [--clock-scale F]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from _common import lscpu, machine_peaks, save_figure
from _translation_peer import finish_peer, start_peer

from attnlab.data.translation import ParallelCorpus, read_parallel, token_batches
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.recipes import get_recipe
from attnlab.tasks.registry import get_task
from attnlab.tokenizers import ByteLevelBPE
from attnlab.train.loop import Trainer


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


def budget_record(minutes: float, summary: dict, records: list[dict]) -> dict:
    """Where a run's seconds went: the loop's time_s, each evaluation's seconds, and how far the end
    of the run (final evaluation, average, checkpoints) went past the budget."""
    total = sum(summary["time_s"].values())
    return {"budget_s": minutes * 60, "total_s": round(total, 1), **{f"{k}_s": v for k, v in summary["time_s"].items()},
            "past_budget_s": round(total - minutes * 60, 1),
            "evaluations": [[r["step"], r["eval_s"]] + (["averaged"] if "averaged" in r else [])
                            for r in records if "val_bleu" in r and "eval_s" in r]}


def scale_clock(factor: float) -> None:
    """Make every Trainer's clock run `factor` times as fast as the real one (a bench-only stand-in for
    a host `factor` times slower: the seconds of steps, evaluations and checkpoints all count
    `factor` times against the budget). Raises ValueError unless factor > 0."""
    if not factor > 0:
        raise ValueError(f"--clock-scale must be > 0, got {factor}")
    Trainer.elapsed = lambda self: self.state.elapsed_s + factor * (time.perf_counter() - self._clock)


def run_ours(recipe, out: Path, resume: bool, limit: int | None = None) -> dict:
    """Train `recipe` into `out`, then test BLEU with beam 4 and greedy (on the first `limit` test
    sentences when given): the bench's record of ours."""
    task = get_task("seq2seq")
    summary = task.train(recipe, out, resume=resume)
    beam = task.evaluate(out, "test", limit, beam=4)
    greedy = task.evaluate(out, "test", limit, beam=1)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [[r["elapsed_s"], r["val_bleu"]] for r in records if "val_bleu" in r and "averaged" not in r]
    averaged = [r["val_bleu"] for r in records if "averaged" in r]
    flops_tok = flops_per_target_token(out)
    tokens = summary["tokens_per_s"] * sum(summary["time_s"].values())
    step_rate = tokens / max(summary["time_s"]["train_steps"], 1e-9)
    return {
        "out": str(out), "parameters": summary["parameters"], "steps": summary["steps"],
        "test_bleu_beam4": beam["bleu"], "test_bleu_greedy": greedy["bleu"],
        "test_beam4_s": beam["seconds"], "test_greedy_s": greedy["seconds"],
        "kept_by": recipe.data.best_metric, "best": summary["best"], "best_step": summary["best_step"], "val_bleu_curve_s": curve,
        "val_bleu_greedy_averaged_last": averaged[-1] if averaged else None,
        "tgt_tokens_per_s": summary["tokens_per_s"], "tgt_tokens_per_s_in_steps": round(step_rate, 1),
        "s_per_step": round(summary["time_s"]["train_steps"] / max(summary["steps"], 1), 3),
        "flops_per_target_token": round(flops_tok), "train_gflops": round(flops_tok * step_rate / 1e9, 1),
        "budget": budget_record(recipe.train.minutes, summary, records),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, nargs="+", default=[10.0])
    ap.add_argument("--out", default="runs/bench-translation", help="run directory (DIR-<M>min with several budgets)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--peer", action="store_true", help="also train the torch.nn.Transformer peer")
    ap.add_argument("--concurrent", action="store_true", help="ours and the peer at once, one thread and CPU each")
    ap.add_argument("--plot", help="write the BLEU-vs-time curves to this PNG")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--limit", type=int, help="score only the first N test sentences (a quick check of the bench)")
    ap.add_argument("--clock-scale", type=float, default=1.0,
                    help="emulate a host this many times slower (the budget's clock reads F × real seconds)")
    args = ap.parse_args()
    if args.concurrent and not args.peer:
        ap.error("--concurrent needs --peer")
    if args.clock_scale <= 0:
        ap.error(f"--clock-scale must be > 0, got {args.clock_scale}")
    if args.clock_scale != 1.0:
        if args.peer:
            ap.error("--clock-scale emulates a host for ours only; leave out --peer")
        scale_clock(args.clock_scale)
    peaks = machine_peaks()
    cpus = sorted(os.sched_getaffinity(0))
    if args.concurrent:
        if len(cpus) < 2:
            ap.error("--concurrent needs two CPUs")
        torch.set_num_threads(1)
        os.sched_setaffinity(0, {cpus[0]})
    result = {"bench": "translation", "recipe": "multi30k-en-de", "minutes": args.minutes, "overrides": args.set,
              "test_sentences": args.limit or "all",
              "mode": "concurrent: ours and the peer at the same time, 1 thread and 1 CPU each" if args.concurrent
              else "sequential: ours, then the peer, each with the machine's threads",
              "host": lscpu(), "machine": peaks, "threads": torch.get_num_threads(), "clock_scale": args.clock_scale,
              "runs": []}
    for minutes in args.minutes:
        out = Path(args.out) if len(args.minutes) == 1 else Path(f"{args.out}-{minutes:g}min")
        recipe = get_recipe("multi30k-en-de").with_overrides(args.set + [f"minutes={minutes}", "max_steps=none"])
        peer_proc = start_peer(minutes, threads=1, cpus={cpus[1]}) if args.concurrent else None
        run = {"minutes": minutes, "ours": run_ours(recipe, out, args.resume, args.limit)}
        if peaks:
            run["ours"]["fraction_of_fp32_matmul_peak"] = round(
                run["ours"]["train_gflops"] / peaks["fp32_matmul_gflops"] * (2 if args.concurrent else 1), 3)
        if args.peer:
            peer = finish_peer(peer_proc if peer_proc else start_peer(minutes))
            run["peer"] = peer
            run["ratio_bleu_greedy_vs_peer"] = round(run["ours"]["test_bleu_greedy"] / max(peer["bleu"], 1e-9), 2)
            run["ratio_bleu_beam4_vs_peer_greedy"] = round(run["ours"]["test_bleu_beam4"] / max(peer["bleu"], 1e-9), 2)
            run["ratio_tokens_per_s_vs_peer"] = round(run["ours"]["tgt_tokens_per_s"] / max(peer["tgt_tok_per_s"], 1e-9), 2)
        result["runs"].append(run)
        print(side_by_side(run), file=sys.stderr, flush=True)
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result, ensure_ascii=False))


def side_by_side(run: dict) -> str:
    """One line per budget: BLEU and tokens/s of ours and the peer."""
    o, p = run["ours"], run.get("peer")
    line = (f"{run['minutes']:g} min: ours {o['steps']} steps, BLEU beam4 {o['test_bleu_beam4']} / greedy "
            f"{o['test_bleu_greedy']}, {o['tgt_tokens_per_s']:.0f} tgt tok/s")
    if p:
        line += f" | peer {p['steps']} steps, BLEU greedy {p['bleu']}, {p['tgt_tok_per_s']} tgt tok/s"
    return line


def plot(result: dict, path: str) -> None:
    import matplotlib  # optional (the viz extra)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in result["runs"]:
        o = run["ours"]
        curve = o["val_bleu_curve_s"]
        line, = ax.plot([c[0] / 60 for c in curve], [c[1] for c in curve], marker="o",
                        label=f"{run['minutes']:g} min: validation BLEU (greedy)")
        if o["val_bleu_greedy_averaged_last"] is not None:
            ax.plot([curve[-1][0] / 60], [o["val_bleu_greedy_averaged_last"]], marker="*", ms=12, ls="",
                    color=line.get_color(), label=f"{run['minutes']:g} min: last checkpoints averaged")
        ax.axhline(o["test_bleu_beam4"], ls="--", color=line.get_color(),
                   label=f"{run['minutes']:g} min: test BLEU, beam 4: {o['test_bleu_beam4']}")
    ax.set_xlabel("wall-clock minutes (2 CPU cores)")
    ax.set_ylabel("sacreBLEU")
    ax.set_title("multi30k-en-de: BLEU against training time")
    ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
