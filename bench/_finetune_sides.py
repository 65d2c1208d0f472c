"""The two sides bench/finetune.py compares, each run in its own process (its peak memory is its own):
our LoRA (or full) fine-tuning step, and peft + transformers on the same batches, from the same
initial adapters, with the same optimizer settings.

    python bench/_finetune_sides.py init   --out FILE  [common options]    # our initial adapters (PEFT names)
    python bench/_finetune_sides.py ours   --init FILE [--no-share-prefix] [--rank 0] [common options]
    python bench/_finetune_sides.py peft   --init FILE --hf DIR [common options]

Each prints one JSON line: per-step losses and seconds, tokens (input tokens without padding, and
the response tokens the loss covers) and the process's peak resident memory. Our side sets up its
process as `attnlab train` does (train/host_memory.py heap_setup): glibc's mmap threshold fixed before
it loads the model as TrainConfig.malloc_mmap_threshold says (by default 128 KiB in a run that
checkpoints its activations, else 32 MiB with the heap kept; it says what it did), and the heap's
free pages handed back (malloc_trim) once the
model is built, before the steps; peft's side keeps glibc's default, as peft's users run it.
"""
from __future__ import annotations

import argparse
import gc
import json
import resource
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.data.instructions import InstructionExamples, collate, length_batches
from attnlab.data.translation import read_parallel
from attnlab.interop.hf_config import gpt_config_from_hf
from attnlab.interop.peft import adapter_tensors
from attnlab.jsonfile import read_json
from attnlab.nn.lora import TARGETS, apply_lora, lora_layers, trainable_parameters
from attnlab.tasks.finetune_base import load_base, read_chat_template
from attnlab.tasks.language_model import special_strings
from attnlab.tasks.registry import get_task
from attnlab.tokenizers import ByteLevelBPE
from attnlab.tasks.instruction import InstructionObjective, render_pair
from attnlab.train.config import TrainConfig
from attnlab.train.host_memory import heap_setup, release_free_memory
from attnlab.train.loop import Trainer, learning_rate
from safetensors.torch import load_file, save_file


def examples(base, n: int) -> InstructionExamples:
    src, tgt = read_parallel("multi30k", "train", "en", "de")
    texts = [render_pair(base.chat_template, base.special, f"Translate to German: {s}", t, None)
             for s, t in zip(src[:n], tgt[:n])]
    return InstructionExamples.encode(base.tokenizer, [p for p, _ in texts], [r for _, r in texts],
                                      base.model.cfg.eos_id, 256)[0]


def train_config(args) -> TrainConfig:
    return TrainConfig(lr_schedule="constant", lr=args.lr, warmup_steps=args.warmup, beta1=0.9, beta2=0.999,
                       eps=1e-8, weight_decay=0.0, clip_grad_norm=1.0, max_steps=args.steps, autocast=args.autocast,
                       malloc_mmap_threshold=args.malloc_mmap_threshold)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, MB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def reset_peak() -> None:
    """Start measuring the peak resident memory anew (Linux: clear_refs 5 resets VmHWM to the resident
    memory now), so that the training steps' peak is not the loading's. The heap is as a user's run
    leaves it: trimmed once after the model is built (side_ours, as tasks/base.py), nothing more."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")


def steps_peak_mb() -> float:
    """VmHWM: the peak resident memory since reset_peak(), MB."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return round(int(status["VmHWM"].split()[0]) / 1024, 1)


def adapted(args):
    """Our base (fp32) with fresh adapters, seeded as a run seeds them (tasks/base.py: seed, then build)."""
    base = load_base("smollm2-135m", getattr(args, "base_dtype", "fp32"), get_task("gpt"))
    torch.manual_seed(args.seed)
    if args.rank:
        apply_lora(base.model, TARGETS, args.rank, args.alpha)
    else:
        base.model.requires_grad_(True)
    return base


def side_init(args) -> dict:
    base = adapted(args)
    save_file({k: v.contiguous() for k, v in adapter_tensors(base.model).items()}, args.out)
    return {"adapters": len(lora_layers(base.model)), "trainable_parameters": trainable_parameters(base.model)}


def _timed(steps: list, run_step) -> dict:
    """Run the steps: their losses and seconds, and the peak memory while they ran."""
    losses, seconds = [], []
    reset_peak()
    before = steps_peak_mb()
    for batch in steps:
        t0 = time.perf_counter()
        losses.append(run_step(batch))
        seconds.append(time.perf_counter() - t0)
    return {"losses": losses, "seconds": seconds, "rss_before_steps_mb": before, "steps_peak_rss_mb": steps_peak_mb()}


def _counts(ex: InstructionExamples, steps: list) -> dict:
    return {"input_tokens": [sum(ex.lengths()[i] - 1 for i in b) for b in steps],
            "response_tokens": [sum(len(ex.responses[i]) for i in b) for b in steps]}


def side_ours(args) -> dict:
    base = adapted(args)
    model = base.model
    if args.rank:
        tensors = load_file(args.init)
        with torch.no_grad():
            for key, t in adapter_tensors(model).items():
                t.copy_(tensors[key])  # the same initial adapters as the peft side
        del tensors  # a benchmark's copy, which a run does not hold through its steps
    model.checkpoint_layers = args.checkpointing
    ex = examples(base, args.examples)
    steps = length_batches(ex.lengths(), args.batch_tokens, args.seed)[:args.steps]
    data = argparse.Namespace(batch_tokens=args.batch_tokens, share_prefix=not args.no_share_prefix,
                              label_smoothing=0.0)
    objective = InstructionObjective(ex, ex, [], base.tokenizer, data, args.seed, 0, [])
    release_free_memory()  # as `attnlab train` does once the model is built (tasks/base.py)
    trainer = Trainer(model, objective, train_config(args), Path(args.workdir), model.cfg.d_model)
    model.train()
    record = _timed(steps, lambda batch: trainer._train_step([batch])[0])  # the loop's own step
    return {**record, **_counts(ex, steps), "trainable_parameters": trainable_parameters(model),
            "optimizer_state_bytes": sum(t.numel() * t.element_size() for s in trainer.optimizer.state.values()
                                         for t in s.values() if torch.is_tensor(t)),
            "peak_rss_mb": peak_rss_mb()}


def side_peft(args) -> dict:
    import peft  # optional heavy packages: the peer of this benchmark
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32)
    config = peft.LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, target_modules=list(TARGETS),
                             task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, config)
    tensors = load_file(args.init)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(tensors[name.replace(".default", "")])
    ex = examples(base_tokenizer(args.hf), args.examples)  # the same tokens as ours (no second model loaded)
    steps = length_batches(ex.lengths(), args.batch_tokens, args.seed)[:args.steps]
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trained, lr=0.0, betas=(0.9, 0.999), eps=1e-8)
    cfg = train_config(args)
    state = {"step": 0}
    model.train()

    def step(batch):
        b = collate(ex, batch, 0, share_prefix=False)
        lengths = torch.tensor([ex.lengths()[i] - 1 for i in batch])
        mask = (torch.arange(b.ids.size(1))[None] < lengths[:, None]).long()
        labels = torch.where(b.keep, b.targets, -100)
        state["step"] += 1
        for g in optimizer.param_groups:
            g["lr"] = learning_rate(cfg, state["step"], 0)
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=b.ids, attention_mask=mask).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        return loss.item()

    record = _timed(steps, step)
    return {**record, **_counts(ex, steps), "trainable_parameters": sum(p.numel() for p in trained),
            "optimizer_state_bytes": sum(t.numel() * t.element_size() for s in optimizer.state.values()
                                         for t in s.values() if torch.is_tensor(t)),
            "peak_rss_mb": peak_rss_mb()}


def base_tokenizer(hf: str):
    """The tokenizer, chat template and eos of the HF export, as load_base gives them (no weights)."""
    folder = Path(hf)
    tokenizer = ByteLevelBPE.load(folder / "tokenizer.json")
    cfg = gpt_config_from_hf(read_json(folder / "config.json"))[1]
    return argparse.Namespace(tokenizer=tokenizer, chat_template=read_chat_template(folder),
                              special=special_strings(tokenizer, cfg), model=argparse.Namespace(cfg=cfg))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("side", choices=["init", "ours", "peft"])
    ap.add_argument("--init", help="initial adapters (safetensors, PEFT names)")
    ap.add_argument("--out", help="init: where to write them")
    ap.add_argument("--hf", help="peft: the Hugging Face export of SmolLM2")
    ap.add_argument("--workdir", default="/tmp", help="ours: the Trainer's run directory (nothing is written)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--examples", type=int, default=4000, help="training pairs the batches are drawn from")
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-share-prefix", action="store_true")
    ap.add_argument("--base-dtype", default="fp32", help="ours: the frozen base's precision (auto = the GGUF's blocks)")
    ap.add_argument("--autocast", default="none", choices=["none", "bf16"], help="ours: TrainConfig.autocast")
    ap.add_argument("--checkpointing", action="store_true", help="ours: activation checkpointing of every layer")
    ap.add_argument("--malloc-mmap-threshold", type=int,
                    help="ours: TrainConfig.malloc_mmap_threshold, bytes (default: as attnlab train, 128 KiB with "
                    "--checkpointing, else 32 MiB with the heap kept; 0 = glibc's dynamic threshold)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # as `attnlab train` does (tasks/base.py), before the model loads; peft's side as peft's users run it
    process = (heap_setup(args.malloc_mmap_threshold, args.checkpointing) if args.side == "ours" else
               {"malloc_mmap_threshold": 0, "heap_kept": False, "mmap_threshold_fixed": False})
    print(json.dumps({**{"init": side_init, "ours": side_ours, "peft": side_peft}[args.side](args), **process}))


if __name__ == "__main__":
    main()
