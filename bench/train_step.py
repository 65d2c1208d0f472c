"""Benchmark: ways to run one training step, side by side on the same batches, for each family.

Every candidate is a set of TrainConfig fields (train/speed.py) and runs the loop's own step
(train/loop.py Trainer._train_step: forward, backward, token-weighted scaling, clipping, the
optimizer, the finiteness guard) on the recipe's model, data and batches:

    fp32           the reference: fp32, eager, for-loop AdamW (torch's CPU default)
    foreach        multi-tensor AdamW (the same numbers)
    fused          fused AdamW (one kernel per step)
    bf16           bf16 autocast of the matrix products, fused AdamW
    bf16_sdpa      the same with attention by torch's SDPA instead of nn/short_attention.py's kernel
                   (what the kernel gains, in the same rotation)
    fused_sdpa     fused, with attention by SDPA (the kernel's gain in fp32: CPUs without native bf16)
    fused_composed_loss  fused, with the output projection and the loss composed of autograd's ops
                   instead of nn/linear_cross_entropy.py's chunks (what the fused loss gains, fp32)
    bf16_composed_loss   the same under bf16 autocast (what the fused loss gains there)
    compile        torch.compile of the model (inductor), fused AdamW
    compile_bf16   both

    nanogpt        (with --nanogpt, shakespeare-char only) the reference peer: nanoGPT's own model.py
                   and the body of its train.py loop (bench/_nanogpt_step.py), in the same rotation

Each candidate starts from the same initial weights; its first steps (which include compiling)
are timed apart, then the candidates take turns, `--steps` steps each per round for `--rounds`
rounds (the order rotates), so a drift of the machine's speed touches them alike. Prints one JSON
line per run: per recipe and candidate the median ms per step, its ratio to fp32 (speed-up), the
minor page faults per timed step (fresh pages the heap took from the system: train/host_memory.py),
the first steps' extra seconds (compile time: inductor's cache starts empty unless
--warm-compile-cache), the steps after which compiling has paid for itself (against the same
settings eager) and the steps each fits in 10 minutes, the loss after the timed steps; and the host
(lscpu, threads, measured fp32 matmul GFLOP/s and bandwidth, a bf16 against fp32 GEMM probe at
the step's shapes and square ones, attention forward + backward in both). With --nanogpt each
candidate's rate is also given as a ratio of nanoGPT's. --profile N profiles N more steps of each
(torch.profiler): operator calls per step, autograd nodes of one forward, and the operators with
the most self CPU time (ms per step), to say where a step's time goes.

    python bench/train_step.py [--recipes shakespeare-char ...] [--candidates fp32 bf16 ...]
                               [--steps 4] [--rounds 6] [--first-step N] [--threads 2] [--nanogpt]
                               [--profile 10] [--malloc-mmap-threshold BYTES]

The process is set up as `attnlab train` sets up its own before building a model (glibc's heap as
TrainConfig.malloc_mmap_threshold says: these recipes do not checkpoint activations, so the heap is
kept, blocks below 32 MiB reused from one step to the next, unless --malloc-mmap-threshold N fixes
N bytes, 0 = glibc's dynamic threshold; train/host_memory.py heap_setup). A process-wide setting: what
it costs a step is measured by two runs, with and without; the JSON says what was set.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import host
from _nanogpt_step import NanoGPTStep
from _recipe_trainer import add_heap_argument, build_trainer, prepare, windows

from attnlab.nn import linear_cross_entropy, short_attention
from attnlab.recipes import get_recipe
from attnlab.train.host_memory import heap_setup
from attnlab.train.loop import Trainer
from attnlab.train.speed import autocast_context

BASE = {"compile": "fused", "compile_bf16": "bf16"}  # what compiling is weighed against (the same, eager)
WITHOUT_SHORT_ATTENTION = ("bf16_sdpa", "fused_sdpa")  # candidates whose steps run attention through SDPA
WITHOUT_FUSED_LOSS = ("fused_composed_loss", "bf16_composed_loss")  # candidates whose steps compose the head and the loss
CANDIDATES = {
    "fp32": {"autocast": "none", "compile": False, "optimizer_impl": "for-loop"},
    "foreach": {"autocast": "none", "compile": False, "optimizer_impl": "foreach"},
    "fused": {"autocast": "none", "compile": False, "optimizer_impl": "fused"},
    "bf16": {"autocast": "bf16", "compile": False, "optimizer_impl": "fused"},
    "bf16_sdpa": {"autocast": "bf16", "compile": False, "optimizer_impl": "fused"},
    "fused_sdpa": {"autocast": "none", "compile": False, "optimizer_impl": "fused"},
    "fused_composed_loss": {"autocast": "none", "compile": False, "optimizer_impl": "fused"},
    "bf16_composed_loss": {"autocast": "bf16", "compile": False, "optimizer_impl": "fused"},
    "compile": {"autocast": "none", "compile": True, "optimizer_impl": "fused"},
    "compile_bf16": {"autocast": "bf16", "compile": True, "optimizer_impl": "fused"},
}
DEFAULT_RECIPES = ["shakespeare-char", "shakespeare-char-llama", "shakespeare-char-mamba", "multi30k-en-de",
                   "digits-vit", "bert-mlm"]
WARMUP = 3  # first steps timed apart (the compile happens in the first one)
NANOGPT_RECIPES = ("shakespeare-char",)  # nanoGPT's baby GPT is this recipe's model and batches


def minor_faults() -> int:
    """This process's minor page faults so far (pages the kernel mapped and zeroed on first touch)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def best_ms(fn, repeats: int = 10) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def gemm_probe(rows: int, d_model: int, d_ff: int) -> dict:
    """GFLOP/s of fp32 and bf16 matrix products: square 1024 and 2048 (machine_peaks.py's way) and
    the step's (rows × d_model) · (d_model × d_ff) and (rows × d_ff) · (d_ff × d_model)."""
    out = {}
    for m, k, n in [(1024, 1024, 1024), (2048, 2048, 2048), (rows, d_model, d_ff), (rows, d_ff, d_model)]:
        row = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
            row[str(dtype).removeprefix("torch.")] = round(2 * m * k * n / best_ms(lambda: a @ b) / 1e6, 1)
        row["bf16_over_fp32"] = round(row["bfloat16"] / row["float32"], 2)
        out[f"{m}x{k}x{n}"] = row
    return out


def attention_probe(batch: int, heads: int, length: int, head_dim: int) -> dict:
    """ms of causal SDPA forward + backward at the step's shape, fp32 and bf16 (why attention stays
    fp32 under autocast: nn/attention.py)."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(batch, heads, length, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))
        out[str(dtype).removeprefix("torch.")] = round(best_ms(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()), 3)
    return {"shape": [batch, heads, length, head_dim], "ms_forward_backward": out}


def step_without(trainer: Trainer, window: list, module, rule: str):
    """One step of `trainer` with module.rule, the test of whether a fast path applies, answering
    no: short_attention.plan (attention by SDPA), linear_cross_entropy._fused (the head and the
    loss composed of autograd's ops)."""
    kept = getattr(module, rule)
    setattr(module, rule, lambda *args: None)
    try:
        return trainer._train_step(window)
    finally:
        setattr(module, rule, kept)


def trainers(name: str, candidates: list[str], root: Path, first: int = 0) -> tuple[dict, list, object]:
    """One Trainer per candidate on recipe `name` (same data, same initial weights), the batches of
    optimizer steps first, first + 1, ... of epoch 0 and the prepared run (tasks.base.Prepared)."""
    recipe = get_recipe(name)
    task, prepared = prepare(recipe, root)
    torch.manual_seed(recipe.train.seed)
    initial = task.build_model(prepared.model_cfg).state_dict()
    cfgs = {c: recipe.train.from_dict({**recipe.train.to_dict(), **CANDIDATES[c]}) for c in candidates}
    out = {c: build_trainer(task, prepared, cfg, root / c, initial) for c, cfg in cfgs.items()}
    return out, windows(recipe, prepared, first + WARMUP + 32)[first:], prepared


def autograd_nodes(loss: torch.Tensor) -> int:
    """The nodes of the backward graph behind `loss`."""
    seen, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(f for f, _ in node.next_functions)
    return len(seen)


def profile_steps(step, n: int, top: int = 15) -> dict:
    """torch.profiler over `n` calls of step(): operator calls per step and the `top` operators by
    self CPU time (ms per step, calls per step)."""
    from torch.profiler import ProfilerActivity, profile  # heavy, and only for --profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return {"events_per_step": round(sum(e.count for e in ops) / n),
            "self_cpu_ms_per_step": round(sum(e.self_cpu_time_total for e in ops) / n / 1e3, 2),
            "top_self_cpu": [{"op": e.key[:80], "ms_per_step": round(e.self_cpu_time_total / n / 1e3, 3),
                              "calls_per_step": round(e.count / n, 1)} for e in ops[:top]]}


def forward_nodes(trainer: Trainer, window: list) -> int:
    """Autograd nodes of one forward of `trainer`'s loss (no backward: the graph is dropped)."""
    with autocast_context(trainer.cfg.autocast):
        loss, _ = trainer.strategy.loss(window[0])
    return autograd_nodes(loss)


def bench_recipe(name: str, candidates: list[str], steps: int, rounds: int, nanogpt: bool = False,
                 profile: int = 0, first: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        runs, windows, prepared = trainers(name, candidates, Path(tmp), first)
        step = {c: (lambda w, t=t: t._train_step(w)) for c, t in runs.items()}
        for c in set(WITHOUT_SHORT_ATTENTION) & set(runs):
            step[c] = lambda w, t=runs[c]: step_without(t, w, short_attention, "plan")
        for c in set(WITHOUT_FUSED_LOSS) & set(runs):
            step[c] = lambda w, t=runs[c]: step_without(t, w, linear_cross_entropy, "_fused")
        names = list(candidates)
        if nanogpt and name in NANOGPT_RECIPES:
            peer = NanoGPTStep(prepared.objective.train.ids, prepared.model_cfg.vocab_size, Path(tmp))
            step["nanogpt"] = lambda w: peer()
            names.append("nanogpt")
        first, times, losses, counts, faults = {}, {c: [] for c in names}, {}, {}, dict.fromkeys(names, 0)
        for c in names:
            start = time.perf_counter()
            for w in windows[:WARMUP]:
                step[c](w)
            first[c] = time.perf_counter() - start
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for c in order:
                for i in range(steps):
                    w = windows[WARMUP + (r * steps + i) % (len(windows) - WARMUP)]
                    start, before = time.perf_counter(), minor_faults()
                    losses[c], counts[c] = step[c](w)
                    times[c].append(time.perf_counter() - start)
                    faults[c] += minor_faults() - before
        profiles = {}
        for c in names if profile else []:
            w = windows[WARMUP]
            profiles[c] = profile_steps(lambda: step[c](w), profile)
            profiles[c]["autograd_nodes_forward"] = (forward_nodes(runs[c], w) if c in runs else
                                                     autograd_nodes(peer.model(peer.x, peer.y)[1]))
    ms = {c: statistics.median(t) * 1e3 for c, t in times.items()}
    ref = ms.get("fp32", ms[candidates[0]])
    rows = {}
    for c in names:
        extra = max(0.0, first[c] - WARMUP * ms[c] / 1e3)  # what the first steps cost beyond ordinary steps
        rows[c] = {"ms_per_step": round(ms[c], 2), "speedup_vs_fp32": round(ref / ms[c], 3),
                   "first_steps_extra_s": round(extra, 1), "steps_in_10_min": int((600 - extra) / (ms[c] / 1e3)),
                   "loss_after_timed_steps": round(losses[c], 4), "units_per_step": counts[c],
                   "minor_page_faults_per_step": round(faults[c] / len(times[c]))}
        if "nanogpt" in ms:
            rows[c]["ratio_tokens_per_s_vs_nanogpt"] = round(ms["nanogpt"] / ms[c], 3)
        base = BASE.get(c)
        if base in ms:  # compiling pays for itself after this many steps, against the same settings eager
            gain = (ms[base] - ms[c]) / 1e3
            rows[c]["compile_pays_off_after_steps"] = int(extra / gain) if gain > 0 else None
        if c in profiles:
            rows[c]["profile"] = profiles[c]
    if "nanogpt" in rows:
        rows["nanogpt"]["reference"] = "nanoGPT's model.py and train.py loop body (its init and optimizer)"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=DEFAULT_RECIPES)
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    ap.add_argument("--steps", type=int, default=4, help="steps per candidate per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--first-step", type=int, default=0, metavar="N",
                    help="time the batches of optimizer step N on (e.g. past a batch-size warm-up)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--no-probes", action="store_true", help="skip the GEMM and attention probes")
    ap.add_argument("--nanogpt", action="store_true",
                    help="also time nanoGPT's own step (shakespeare-char) in the same rotation, and give ratios")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile N more steps of each candidate (operator counts, top self CPU time)")
    ap.add_argument("--warm-compile-cache", action="store_true",
                    help="keep inductor's compiled-kernel cache (default: a fresh one, the compile time of a first run)")
    add_heap_argument(ap)
    args = ap.parse_args()
    heap = heap_setup(args.malloc_mmap_threshold, checkpointing=False)  # before any model: tasks/base.py's order
    if not args.warm_compile_cache:
        cache = tempfile.TemporaryDirectory(prefix="inductor-")  # removed at exit
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name
    torch.set_num_threads(args.threads)
    record = {"bench": "train_step", "host": host(args.threads), "first_step": args.first_step,
              "steps_per_round": args.steps, "rounds": args.rounds, "compile_cache": "warm" if args.warm_compile_cache else "cold",
              **heap}
    if not args.no_probes:
        record["gemm_gflops"] = gemm_probe(768, 128, 512)
        record["attention"] = attention_probe(12, 4, 64, 32)
    record["results"] = {name: bench_recipe(name, args.candidates, args.steps, args.rounds, args.nanogpt, args.profile,
                                              args.first_step)
                         for name in args.recipes}
    print(json.dumps(record))


if __name__ == "__main__":
    main()
