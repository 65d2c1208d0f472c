"""How the training step runs, the same for every family: in bf16 autocast or fp32, compiled or eager.

TrainConfig holds the choices (`autocast`, `compile`, `optimizer_impl`); the loop (train/loop.py)
applies them through this module, so a family's objective never sees them:

    autocast "bf16"   the forward runs under torch.autocast("cpu", bfloat16): matrix products and
                      convolutions in bf16 (AVX512-BF16 / AMX on CPUs that have them), accumulated in
                      fp32; the weights, their gradients and the optimizer stay fp32. Attention
                      (nn/attention.py) and the losses (objectives take .float() logits) stay fp32.
                      Evaluations run in fp32 (the loop's _evaluate): the run reports and keeps the
                      best weights by the numbers `attnlab evaluate` gives.
    compile           nn.Module.compile(): the model's forward (and so its backward) goes through
                      torch.compile (TorchDynamo + inductor, C++/OpenMP kernels on the CPU), in place,
                      so weights, state dicts and checkpoints are those of the plain model. The first
                      steps pay the compile time (tens of seconds; bench/train_step.py measures it);
                      evaluations run eager (`eager()`), so their other shapes never recompile.
    optimizer_impl    for-loop | foreach | fused (the default) Adam/AdamW (train/optim.py).

fp32 eager is the reference: bench/train_step.py measures each choice against it on the same
batches, and a recipe makes a choice its default only where it reaches the same quality at equal
steps.
"""
from __future__ import annotations

import contextlib

import torch


def autocast_context(kind: str):
    """bf16 autocast on the CPU (kind "bf16") or nothing (kind "none")."""
    if kind == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def compile_for_training(model: torch.nn.Module, enabled: bool) -> None:
    """Compile `model`'s forward in place (nn.Module.compile) when `enabled`; the first call pays
    the compile time. Its parameters, buffers and state dict are unchanged."""
    if enabled:
        model.compile()


def eager():
    """Run compiled modules eagerly inside this context (evaluation: other shapes, no recompiles)."""
    return torch.compiler.set_stance("force_eager")
