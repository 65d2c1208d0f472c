"""Multi-process training on PyTorch's own engine: torchrun (torch.distributed.run) starts the
processes and sets their environment; this module reads it, sets up and tears down the process
group, and gives the loop the few collectives it needs (a sum, an agreement, a broadcast from rank 0)
and the rank-0 gate (only rank 0 writes files, logs and the progress bar).

    torchrun --nproc_per_node N -m attnlab train --recipe R ...      (or: attnlab train --nproc N ...)

Backend: gloo. attnlab trains on the CPU (every objective builds its batches there, in one process as
in several), so each process is a CPU process even on a host with GPUs; nccl and CUDA devices are
not supported yet. Each process uses one CPU thread
unless OMP_NUM_THREADS or TrainConfig.threads says otherwise. Collectives time out after
$ATTNLAB_COLLECTIVE_TIMEOUT seconds (default 300), so a process left waiting for a dead peer stops
in bounded time; torchrun's elastic agent then stops the others and names the rank that failed.
In one process (no torchrun, or WORLD_SIZE=1) every collective here is the identity.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist

from attnlab.errors import UserError

TIMEOUT_ENV = "ATTNLAB_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class World:
    """This process's place in the run: rank (0..size-1), size (processes), local_rank (on this
    host), device (the CPU: see the module docstring)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files and logs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def _env_int(name: str) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise UserError(f"${name} must be an integer (set by torchrun), got {value!r}") from None


def world_from_env() -> World:
    """The World that torchrun's environment describes (RANK, WORLD_SIZE, LOCAL_RANK); one process
    when WORLD_SIZE is unset or 1.

    Raises:
        ValueError: one line, for a mismatched world size (RANK or LOCAL_RANK outside 0..WORLD_SIZE-1,
            WORLD_SIZE < 1) or a missing MASTER_ADDR / MASTER_PORT (launch with torchrun).
    """
    if "WORLD_SIZE" not in os.environ:
        return World()
    size = _env_int("WORLD_SIZE")
    if size < 1:
        raise UserError(f"mismatched world size: $WORLD_SIZE must be >= 1, got {size}")
    if size == 1:
        return World()
    rank = _env_int("RANK") if "RANK" in os.environ else -1
    local = _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else rank
    if not 0 <= rank < size or not 0 <= local < size:
        raise UserError(f"mismatched world size: RANK={os.environ.get('RANK')} and LOCAL_RANK="
                        f"{os.environ.get('LOCAL_RANK')} must be in 0..{size - 1} for WORLD_SIZE={size}")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise UserError(f"${name} is not set: start multi-process training with torchrun "
                            f"(torchrun --nproc_per_node N -m attnlab train ...) or attnlab train --nproc N")
    return World(rank, size, local, torch.device("cpu"))


def collective_timeout() -> timedelta:
    """The collective timeout: $ATTNLAB_COLLECTIVE_TIMEOUT seconds (default 300).

    Raises:
        ValueError: for a value that is not a number > 0.
    """
    text = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise UserError(f"${TIMEOUT_ENV} must be a number of seconds > 0, got {text!r}")
    return timedelta(seconds=seconds)


_world = World()


def current_world() -> World:
    """The World of this process (set by process_group; one process outside it)."""
    return _world


@contextlib.contextmanager
def process_group() -> Iterator[World]:
    """Join the process group torchrun describes for the duration of the block (nothing in one
    process): gloo, with the collective timeout; one CPU thread per process
    unless OMP_NUM_THREADS is set; logs below WARNING only on rank 0. Destroys the group on exit.

    Raises:
        ValueError: as world_from_env and collective_timeout.
    """
    global _world
    world = world_from_env()
    if not world.distributed:
        yield world
        return
    timeout = collective_timeout()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timeout)
    if not world.is_main:
        logging.getLogger("attnlab").setLevel(logging.WARNING)
    _world = world
    try:
        yield world
        dist.barrier()  # a normal end: every process ends together
    finally:
        _world = World()
        # Free DDP / FSDP (and their reducers' threads) before their process group: one left to the
        # interpreter's shutdown outlives the group and aborts the process ("terminate called ...").
        gc.collect()
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every process (nothing in one process)."""
    if _world.distributed:
        dist.barrier()


def all_sum(*values: float) -> tuple[float, ...]:
    """The sums over the processes of `values` (in float64; the values themselves in one process)."""
    if not _world.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return tuple(t.tolist())


def any_true(flag: bool) -> bool:
    """Whether `flag` holds on at least one process."""
    return all_sum(float(flag))[0] > 0


def from_main(obj):
    """Rank 0's `obj` (a picklable value: a record, a decision), on every process."""
    if not _world.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_main(obj) -> list | None:
    """[obj of rank 0, obj of rank 1, ...] on rank 0, None elsewhere ([obj] in one process)."""
    if not _world.distributed:
        return [obj]
    out = [None] * _world.size if _world.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out
