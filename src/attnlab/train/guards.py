"""What stops a training cleanly, and what refuses to start one: stop signals (Ctrl-C, SIGTERM) that
let the current step finish and be checkpointed, the check that an update left the weights finite,
and the refusal of a batch whose activations cannot fit in this machine's memory.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

import torch
from tqdm import tqdm

from attnlab.errors import NonFiniteError, UserError
from attnlab.files import format_bytes

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; what schedulers and `docker stop` send


class TrainingInterrupted(KeyboardInterrupt):
    """A stop signal ended training; `signum` is the signal (SIGINT or SIGTERM). After the first
    signal the run directory holds a checkpoint of the last complete step."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """While active (in the main thread), the first SIGINT or SIGTERM only sets `signum` and says so on
    stderr: the loop finishes its step, writes a checkpoint and raises TrainingInterrupted; a second
    one raises TrainingInterrupted at once (the last checkpoint stays valid)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            raise TrainingInterrupted(signum)
        self.signum = signum
        again = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        tqdm.write(f"interrupted ({signal.Signals(signum).name}): finishing this step and writing a checkpoint "
                   f"({again} again to abort)", file=sys.stderr)

    def check(self) -> None:
        """Raise TrainingInterrupted when a stop signal has arrived."""
        if self.signum is not None:
            raise TrainingInterrupted(self.signum)


def _local(p: torch.Tensor) -> torch.Tensor:
    """This process's values of a parameter (its shard, for FSDP's DTensors)."""
    return p.to_local() if hasattr(p, "to_local") else p


def check_finite_weights(model: torch.nn.Module, step: int, agree: Callable[[bool], bool] = lambda ok: ok) -> None:
    """Stop when the update of `step` left a trained parameter non-finite (an lr too high, an
    overflow): before anything of it is written.

    Args:
        agree: turns this process's verdict into the verdict of all (several processes: finite
            only when finite on every process, train/distributed.py).
    Raises:
        FloatingPointError: naming the parameter (where this process holds it) and the step.
    """
    # One fp32 sum per trained parameter, then the sum of those: non-finite whenever a parameter holds
    # a NaN or an inf (a sum keeps both). The fp32 sums are the cheapest reduction here (a float64
    # sum costs ~6× as much, a multi-tensor max-norm more still), and the rare finite weights whose sum
    # overflows are told apart by the exact isfinite check below. Frozen parameters (a LoRA model's
    # base) are not updated and not looked at.
    named = [(name, _local(p.detach())) for name, p in model.named_parameters() if p.requires_grad]
    ok = not named or bool(torch.isfinite(torch.stack([p.sum() for _, p in named]).sum()))
    if not ok:  # a non-finite weight, or finite ones whose fp32 sum overflowed
        ok = all(bool(torch.isfinite(p).all()) for _, p in named)
    if agree(ok):
        return
    bad = next((name for name, p in named if not bool(torch.isfinite(p).all())), "a parameter of another process")
    raise NonFiniteError(
        f"the update of step {step} made {bad} non-finite (NaN or inf): training diverged (lower lr / "
        f"lr_factor or raise warmup_steps); stopped before writing it, the last checkpoint is intact")


def physical_memory() -> int | None:
    """Bytes of memory of this machine (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def activation_bytes(tokens: int, d_model: int, n_layers: int) -> int:
    """A lower bound on one batch's training memory: each layer keeps at least its (tokens, d_model)
    float32 output for the backward pass."""
    return tokens * d_model * max(n_layers, 1) * 4


def check_batch_memory(field: str, value, tokens: int, need: int) -> None:
    """Refuse, before anything is allocated, a batch whose activations (`need` bytes, a lower bound
    for `tokens` tokens, images or patches) exceed the machine's memory.

    Raises:
        ValueError: naming the setting `field` and its `value`.
    """
    total = physical_memory()
    if total and need > total:
        raise UserError(f"{field}={value}: one batch of {tokens:,} tokens needs at least {format_bytes(need)} of "
                        f"activations (tokens × d_model × layers × 4 bytes), more than this machine's "
                        f"{format_bytes(total)} of memory; lower {field}")
