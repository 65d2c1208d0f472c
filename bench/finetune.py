"""Benchmark: fine-tuning SmolLM2-135M-Instruct with LoRA on Multi30k En→De, in parts that run alone.

    python bench/finetune.py --part step     [--steps 12] [--threads 2]  # our LoRA step vs peft + transformers
                                                                         # (also: no shared prefix, QLoRA, checkpointing)
    python bench/finetune.py --part curve    [--steps 100]               # the same, loss curves (1 thread each)
    python bench/finetune.py --part memory   [--steps 4]                 # peak memory: LoRA, QLoRA, full fine-tune
                                                                         # (--malloc-mmap-threshold N / 0: fixed / glibc's;
                                                                         #  --runs lora_fp32_checkpointing ...: some only)
    python bench/finetune.py --part zero-shot                            # test BLEU of SmolLM2 as it is
    python bench/finetune.py --part budget   --minutes 10 30             # LoRA and multi30k-en-de, same budgets
    python bench/finetune.py --part evaluate [--beams 1 4]               # test BLEU of the budget part's runs
    ... [--json bench/results/finetune.json]   (each part's record is merged into the file under its name)

Each part prints one JSON line with the host (lscpu model name and flags, threads, measured fp32
GFLOP/s and bandwidth). `step` and `curve` run each side in its own process (bench/_finetune_sides.py)
on the same batches (our length-bucketed batches of ~1,024 tokens), from the same initial adapters
(rank 8, α 16, all seven projections), with the same Adam settings and clipping; tokens/s counts
the input tokens without padding (and, separately, the response tokens the loss covers). `budget`
trains the smollm2-lora-multi30k recipe and our multi30k-en-de Transformer at the same time, one
thread each (same machine, same conditions, half the wall time), copying each run after every
budget (the next budget resumes it: a 30-minute run is the 10-minute run continued). Timed parts
(step, budget) want a quiet machine: `cpu-slot quiet python bench/finetune.py --part step`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, SHARED

from attnlab.jsonfile import write_json_atomic
from attnlab.recipes import get_recipe
from attnlab.tasks.finetune_base import load_base
from attnlab.tasks.instruction import translation_bleu
from attnlab.tasks.registry import evaluate_run, get_task

SIDES = Path(__file__).with_name("_finetune_sides.py")
WORK = ROOT / "runs" / "bench-finetune"
PY = sys.executable


def host(threads: int) -> dict:
    """lscpu's model name and the flags that matter, the threads, this machine's measured peaks."""
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    return {"cpu": fields.get("Model name", "?").strip(), "threads": threads,
            "flags": sorted(f for f in flags if f in ("avx512_vnni", "avx512_bf16") or f.startswith("amx")),
            **peaks(threads)}


def peaks(threads: int) -> dict:
    """../shared/tools/machine_peaks.py on `threads` threads (fp32 GFLOP/s, bandwidth), or {}."""
    tool = SHARED / "tools" / "machine_peaks.py"
    if not tool.is_file():
        return {}
    out = subprocess.run([PY, str(tool), "--threads", str(threads)], capture_output=True, text=True, check=True)
    return {k: v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items() if k != "threads"}


def start_side(name: str, threads: int, *options: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([PY, str(SIDES), name, "--threads", str(threads), *options], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(name: str, proc: subprocess.Popen) -> dict:
    stdout, stderr = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def side(name: str, threads: int, *options: str) -> dict:
    """One side in its own process, alone (bench/_finetune_sides.py)."""
    return result(name, start_side(name, threads, *options))


def optional_side(name: str, threads: int, *options: str) -> dict:
    """A variant's side: its record, or {"error": ...} when it fails (the main comparison stands)."""
    try:
        return side(name, threads, *options)
    except SystemExit as failure:
        return {"error": str(failure)[-500:]}


def hf_export() -> Path:
    """SmolLM2 as a Hugging Face directory (our export: the GGUF dequantized), made once."""
    folder = WORK / "smollm2-hf"
    if not (folder / "model.safetensors").is_file():
        subprocess.run([PY, "-m", "attnlab", "convert", "--from", "smollm2-135m", "--to", str(folder)], check=True)
    return folder


def threshold_option(args) -> list[str]:
    """Our sides' --malloc-mmap-threshold: none (as attnlab train decides: train/host_memory.py) or the one given."""
    return [] if args.malloc_mmap_threshold is None else ["--malloc-mmap-threshold", str(args.malloc_mmap_threshold)]


def rates(record: dict, warm: int) -> dict:
    """Input and response tokens per second over the steps after the first `warm`."""
    s = sum(record["seconds"][warm:])
    return {"input_tokens_per_s": round(sum(record["input_tokens"][warm:]) / s, 1),
            "response_tokens_per_s": round(sum(record["response_tokens"][warm:]) / s, 1),
            "seconds_per_step": round(s / len(record["seconds"][warm:]), 3)}


def part_step(args, curve: bool = False) -> dict:
    """Our LoRA step (the loop's, with and without the shared prefix) against peft + transformers."""
    threads = 1 if curve else args.threads
    common = ["--steps", str(args.steps), "--batch-tokens", str(args.batch_tokens), *threshold_option(args)]
    init = WORK / "init_adapters.safetensors"
    WORK.mkdir(parents=True, exist_ok=True)
    side("init", 1, "--out", str(init))
    if curve:  # losses do not depend on the machine's speed: both sides at once, one thread each
        procs = {n: start_side(n, 1, "--init", str(init), *common, *extra)
                 for n, extra in (("peft", ["--hf", str(hf_export())]), ("ours", []))}
        peft, ours = (result(n, p) for n, p in procs.items())
        ours_plain = None
    else:  # timed: one side at a time
        peft = side("peft", threads, "--init", str(init), "--hf", str(hf_export()), *common)
        ours = side("ours", threads, "--init", str(init), *common)
        ours_plain = optional_side("ours", threads, "--init", str(init), "--no-share-prefix", *common)
        ours_q = optional_side("ours", threads, "--init", str(init), "--base-dtype", "auto", *common)
        ours_ckpt = optional_side("ours", threads, "--init", str(init), "--checkpointing", *common)
        ours_dynamic = optional_side("ours", threads, "--init", str(init), *common, "--malloc-mmap-threshold", "0")
    warm = 0 if curve else min(2, args.steps - 1)
    rel = [abs(a - b) / abs(b) for a, b in zip(ours["losses"], peft["losses"])]
    record = {"steps": args.steps, "batch_tokens": args.batch_tokens, "rank": 8, "alpha": 16, "targets": 7,
              "trainable_parameters": ours["trainable_parameters"],
              "optimizer_state_bytes": {"ours": ours["optimizer_state_bytes"], "peft": peft["optimizer_state_bytes"]},
              "loss_rel_diff_last": round(rel[-1], 6), "loss_rel_diff_max": round(max(rel), 6),
              "peak_rss_mb": {"ours": ours["steps_peak_rss_mb"], "peft": peft["steps_peak_rss_mb"]}}
    if curve:
        return {**record, "losses_ours": [round(x, 5) for x in ours["losses"]],
                "losses_peft": [round(x, 5) for x in peft["losses"]]}
    r_ours, r_peft = rates(ours, warm), rates(peft, warm)
    out = {**record, "warmup_steps_excluded": warm, "ours": r_ours, "peft": r_peft,
           "speedup": round(r_ours["input_tokens_per_s"] / r_peft["input_tokens_per_s"], 3)}
    out["ours"]["mmap_threshold_fixed"] = ours["mmap_threshold_fixed"]
    out["ours"]["heap_kept"] = ours.get("heap_kept", False)
    for name, run in (("no_shared_prefix", ours_plain), ("qlora_q4_1", ours_q), ("checkpointing", ours_ckpt),
                      ("glibc_dynamic_mmap_threshold", ours_dynamic)):
        if "error" in run:
            out[f"ours_{name}"] = run
            continue
        r = {**rates(run, warm), "loss_rel_diff_last": round(abs(run["losses"][-1] - peft["losses"][-1])
                                                             / peft["losses"][-1], 5),
             "peak_rss_mb": run["steps_peak_rss_mb"]}
        out[f"ours_{name}"], out[f"speedup_{name}"] = r, round(r["input_tokens_per_s"] / r_peft["input_tokens_per_s"], 3)
    if "error" not in ours_dynamic:  # our default heap setup (heap_kept says which) over glibc's dynamic threshold
        out["default_heap_over_dynamic_tokens_per_s"] = round(
            r_ours["input_tokens_per_s"] / out["ours_glibc_dynamic_mmap_threshold"]["input_tokens_per_s"], 3)
    return out


MEMORY_RUNS = {f"{name}{suffix}": options + more  # the memory part's runs: bench/_finetune_sides.py's options
               for suffix, more in (("", []), ("_checkpointing", ["--checkpointing"]))
               for name, options in (("lora_fp32", []), ("qlora_q4_1", ["--base-dtype", "auto"]),
                                     ("full", ["--rank", "0", "--lr", "1e-5"]))}


def part_memory(args) -> dict:
    """Peak resident memory of the training steps: LoRA on the fp32 base, LoRA on the GGUF's own Q4_1
    blocks (QLoRA), and the full fine-tune, each in its own process set up as `attnlab train` sets
    up its own (glibc's mmap threshold fixed before the model loads: 128 KiB in a run that checkpoints
    its activations, else 32 MiB with the heap kept; --malloc-mmap-threshold N: N bytes in every run,
    0 = glibc's dynamic threshold in every run), without and with activation checkpointing."""
    init = WORK / "init_adapters.safetensors"
    common = ["--init", str(init), "--steps", str(args.steps), "--batch-tokens", str(args.batch_tokens),
              *threshold_option(args)]
    WORK.mkdir(parents=True, exist_ok=True)
    side("init", 1, "--out", str(init))
    runs = {name: side("ours", args.threads, *common, *MEMORY_RUNS[name]) for name in args.runs or MEMORY_RUNS}
    keys = ("steps_peak_rss_mb", "rss_before_steps_mb", "trainable_parameters", "optimizer_state_bytes",
            "malloc_mmap_threshold", "mmap_threshold_fixed", "heap_kept")
    out = {k: {**{key: r[key] for key in keys}, "process_peak_rss_mb": r["peak_rss_mb"]} for k, r in runs.items()}
    ratios = {f"{name}{suffix}_over_full{suffix}{peak}": round(out[f"{name}{suffix}"][key]
                                                               / out[f"full{suffix}"][key], 3)
              for peak, key in (("", "steps_peak_rss_mb"), ("_process_peak", "process_peak_rss_mb"))
              for suffix in ("", "_checkpointing") for name in ("lora_fp32", "qlora_q4_1")
              if f"{name}{suffix}" in out and f"full{suffix}" in out}
    given = "as attnlab train decides" if args.malloc_mmap_threshold is None else args.malloc_mmap_threshold
    return {"steps": args.steps, "batch_tokens": args.batch_tokens, "malloc_mmap_threshold": given, **out, **ratios,
            "note": "steps_peak_rss_mb: the peak resident memory of the training steps (VmHWM reset through "
                    "/proc/self/clear_refs after loading; the heap trimmed once after the model is built, as "
                    "attnlab train does, nothing more); process_peak_rss_mb: the whole process's (loading "
                    "included); mmap_threshold_fixed: whether the process fixed glibc's mmap threshold before "
                    "loading, as attnlab train does (train/host_memory.py); a process with torch imported holds "
                    "~250 MB before any model",
            "like_for_like": "every variant runs the loop's own step (Trainer._train_step) on the same batches with "
                             "the same loss implementation (InstructionObjective.loss: the output projection and "
                             "cross-entropy in chunks of positions, nn/linear_cross_entropy.py), shared prompt "
                             "prefix, Adam (foreach), the same process setup; a *_checkpointing variant and its "
                             "full_checkpointing denominator both checkpoint every layer, the others neither"}


def part_zero_shot(args) -> dict:
    """SmolLM2-135M-Instruct as it is, the recipe's prompt, greedy, on test_2016_flickr."""
    base = load_base("smollm2-135m", "fp32", get_task("gpt"))
    t0 = time.perf_counter()
    record = translation_bleu(base.model, base.tokenizer, base.chat_template, get_recipe("smollm2-lora-multi30k").data,
                              "test", args.limit)
    return {**record, "seconds": round(time.perf_counter() - t0, 1)}


RUNS = {"lora": ["--recipe", "smollm2-lora-multi30k"], "transformer": ["--recipe", "multi30k-en-de"]}


def part_budget(args) -> dict:
    """Both recipes at once, one thread each, to each budget in turn (resumed), copied after each."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    out: dict = {"concurrent": "both trainings ran at the same time, one thread each (OMP_NUM_THREADS=1)"}
    for name in RUNS:  # a fresh start: the first budget trains from step 0
        shutil.rmtree(WORK / name, ignore_errors=True)
    for i, minutes in enumerate(args.minutes):
        procs = {name: subprocess.Popen([PY, "-m", "attnlab", "train", *recipe, "--out", str(WORK / name),
                                         "--minutes", str(minutes)] + (["--resume"] if i else ["--set", "threads=1"]),
                                        env=env, stdout=subprocess.PIPE, text=True)
                 for name, recipe in RUNS.items()}
        for name, proc in procs.items():
            stdout, _ = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"{name} ({minutes} min) failed with exit code {proc.returncode}")
            final = json.loads(stdout.strip().splitlines()[-1])
            logged = [json.loads(line) for line in (WORK / name / "metrics.jsonl").read_text().splitlines()]
            trained = [r for r in logged if "loss" in r]
            out[f"{name}_{minutes:g}min"] = {
                **{k: final.get(k) for k in ("steps", "step", "elapsed_s", "best", "best_step", "val_bleu", "val_loss")},
                "last_train_loss": trained[-1]["loss"] if trained else None,
                "tokens_per_s_last_window": trained[-1].get("tokens_per_s") if trained else None}
            copy = WORK / f"{name}-{minutes:g}min"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(WORK / name, copy, ignore=shutil.ignore_patterns("checkpoint", "snapshots", ".lock"))
    return out


def part_evaluate(args) -> dict:
    """Test BLEU of the budget part's copies (LoRA and the Transformer), with each of args.beams
    (1 = greedy)."""
    out: dict = {"n": args.limit or "all (1,000)"}
    for copy in sorted(WORK.glob("*-*min")):
        out[copy.name] = {("greedy" if k == 1 else f"beam{k}"): evaluate_run(copy, "test", args.limit, beam=k)["bleu"]
                          for k in args.beams}
    return out


PARTS = {"step": part_step, "curve": lambda a: part_step(a, curve=True), "memory": part_memory,
         "zero-shot": part_zero_shot, "budget": part_budget, "evaluate": part_evaluate}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", required=True, choices=PARTS)
    ap.add_argument("--steps", type=int, help="step / curve / memory: optimizer steps (12 / 100 / 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--minutes", type=float, nargs="+", default=[10, 30], help="budget: the budgets, in order")
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="evaluate: beam sizes (1 = greedy)")
    ap.add_argument("--limit", type=int, help="zero-shot / evaluate: the first N test sentences only")
    ap.add_argument("--malloc-mmap-threshold", type=int,
                    help="step / curve / memory: our sides' TrainConfig.malloc_mmap_threshold, bytes, in every side "
                    "(default: as attnlab train decides; 0 = glibc's dynamic threshold; train/host_memory.py)")
    ap.add_argument("--runs", nargs="+", choices=MEMORY_RUNS, help="memory: only these runs (default: all six; "
                    "with --json the record goes under its own key)")
    ap.add_argument("--json", help="merge this part's record into this JSON file")
    args = ap.parse_args()
    args.steps = args.steps or {"step": 12, "curve": 100, "memory": 4}.get(args.part, 0)
    threads = 1 if args.part in ("curve", "budget") else args.threads
    record = {"part": args.part, "command": " ".join(["python", "bench/finetune.py", *sys.argv[1:]]),
              "host": host(threads), **PARTS[args.part](args)}
    print(json.dumps(record))
    if args.json:
        path = Path(args.json)
        merged = json.loads(path.read_text()) if path.is_file() else {}
        key = args.part if args.malloc_mmap_threshold is None else \
            f"{args.part}_malloc_mmap_threshold_{args.malloc_mmap_threshold}"  # a setting's record beside the default's
        if args.part == "memory" and args.runs:  # some runs only: beside the whole record, not over it
            key += "_" + "_".join(args.runs)
        merged[key] = record
        write_json_atomic(path, merged)  # a kill mid-write leaves the old file, not a part


if __name__ == "__main__":
    main()
