"""TrainConfig: what the training loop reads — optimiser, schedule, budgets, cadence of evaluations and
checkpoints, precision, compiling, seed, threads and the multi-process strategy. The objective and the data (batch sizes, label smoothing,
what to decode at evaluation) belong to each task's data config (tasks/)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from attnlab.config import Config, check, check_finite, check_literals
from attnlab.train import host_memory


@dataclass
class TrainConfig(Config):
    """Optimisation, schedule, budgets and cadence of one training run (train/loop.py reads every field)."""

    lr_schedule: Literal["noam", "cosine", "constant"] = "noam"  # noam: the paper's warm-up + inverse
                                      # sqrt decay; cosine: warm-up, then cosine decay from lr to min_lr
    lr_factor: float = 1.0            # noam: lr = factor · d_model^-0.5 · min(step^-0.5, step·warmup^-1.5)
    lr: float = 5e-4                  # peak learning rate of the cosine and constant schedules
    min_lr: float = 0.0               # cosine: the learning rate after lr_decay_steps
    lr_decay_steps: Optional[int] = None  # cosine: the last step of the decay (min_lr comes one step after;
                                      # None = max_steps; with neither, the decay follows the time spent
                                      # and reaches min_lr as the minutes budget runs out)
    warmup_steps: int = 4000          # linear warm-up steps (paper: 4000)
    warmup_ratio: float = 0.0         # cosine, constant (noam ignores it): warm up over this fraction of the run when
                                      # that is shorter than warmup_steps (of its steps with a step horizon,
                                      # of the minutes budget without one); 0 = warmup_steps only
    grad_accum_steps: int = 1         # micro-batches whose gradients add up to one optimizer step
    beta1: float = 0.9                # Adam β1 (paper §5.3)
    beta2: float = 0.98               # Adam β2
    eps: float = 1e-9                 # Adam ε
    weight_decay: float = 0.0         # decoupled weight decay (AdamW), 0 = the paper's Adam
    clip_grad_norm: float = 1.0       # max global gradient norm; 0 = no clipping
    max_steps: Optional[int] = None   # step budget (None = unlimited)
    minutes: Optional[float] = None   # wall-clock budget for training, evaluations included
    eval_every: int = 1000            # steps between validations (the task's evaluate())
    log_every: int = 50               # steps between metrics.jsonl lines
    checkpoint_every: int = 500       # steps between resumable checkpoints
    average_last: int = 0             # average the weights of the last N checkpoints at the end (0 = off)
    autocast: Literal["none", "bf16"] = "none"  # bf16 autocast of the matrix products (CPU with AVX512-BF16;
                                      # attention and the loss stay fp32: train/speed.py); none = fp32
    compile: bool = False             # torch.compile the model for the training steps (inductor's CPU
                                      # backend); its compile time counts in the budget; evaluation runs eager
    optimizer_impl: Literal["for-loop", "foreach", "fused"] = "fused"  # torch's Adam/AdamW kernels:
                                      # one op per parameter, multi-tensor ops (the same numbers), or one
                                      # fused kernel (the same maths, rounded once per step: ~1 ulp apart;
                                      # the fastest on the CPU: one pass over each parameter's state)
    seed: int = 0                     # seeds the data order, initialisation and dropout
    threads: int = 0                  # torch threads; 0 = all cores (one per process under torchrun)
    parallel: Literal["ddp", "fsdp"] = "ddp"  # with several processes (torchrun): DistributedDataParallel
                                      # (replicas) or FSDP2 fully_shard (sharded); ignored in one process
    malloc_mmap_threshold: Optional[int] = None  # bytes: glibc maps blocks this large and more on their own,
                                      # fixed before the model loads, so freed tensors leave the resident memory
                                      # at once, for page faults each step (train/host_memory.py); None = 128 KiB
                                      # in a run that checkpoints its activations (memory over speed), else
                                      # 32 MiB with the heap kept (no trimming: steps reuse warm pages);
                                      # 0 = glibc's dynamic threshold always

    def __post_init__(self):
        check_literals(self)
        check_finite(self)  # lr=inf would turn every weight into NaN
        for name in ("warmup_steps", "eval_every", "log_every", "checkpoint_every"):
            check(getattr(self, name) > 0, name, "> 0", getattr(self, name))
        for name in ("beta1", "beta2"):
            check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("eps", "lr", "lr_factor"):
            check(getattr(self, name) > 0, name, "> 0", getattr(self, name))
        check(self.weight_decay >= 0, "weight_decay", ">= 0", self.weight_decay)
        check(0 <= self.min_lr <= self.lr, "min_lr", f"in [0, lr={self.lr}]", self.min_lr)
        check(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", "in [0, 1)", self.warmup_ratio)
        check(self.grad_accum_steps >= 1, "grad_accum_steps", ">= 1", self.grad_accum_steps)
        check(self.lr_decay_steps is None or self.lr_decay_steps > self.warmup_steps, "lr_decay_steps",
               f"None or > warmup_steps={self.warmup_steps}", self.lr_decay_steps)
        check(self.max_steps is None or self.max_steps > 0, "max_steps", "> 0 or None", self.max_steps)
        check(self.minutes is None or self.minutes > 0, "minutes", "> 0 or None", self.minutes)
        check(self.average_last >= 0, "average_last", ">= 0", self.average_last)
        check(self.clip_grad_norm >= 0, "clip_grad_norm", ">= 0", self.clip_grad_norm)
        check(self.threads >= 0, "threads", ">= 0", self.threads)
        check(self.malloc_mmap_threshold is None or 0 <= self.malloc_mmap_threshold <= host_memory.MAX,
              "malloc_mmap_threshold", f"None or in [0, {host_memory.MAX}] bytes (0 = glibc's dynamic threshold)",
              self.malloc_mmap_threshold)
