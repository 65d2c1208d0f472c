"""`attnlab train --nproc N`: the same training as `torchrun --standalone --nproc_per_node N -m attnlab
train ...`, started through torch.distributed.run (its elastic agent) on this host, with the agent's
failure report turned into one line naming the rank that failed.
"""
from __future__ import annotations

import logging
import signal
import sys

import torch.distributed.run as torchrun
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


def describe_exit(code: int) -> str:
    """"exit code 2", or "killed by SIGKILL" for a negative (signal) code."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def launch(nproc: int, argv: list[str], monitor_interval: float = 0.5) -> int:
    """Run `python -m attnlab ARGV` in `nproc` processes on this host under torchrun's elastic agent
    (a standalone rendezvous on a free port, no restarts); when one process fails the agent stops
    the others.

    Args:
        nproc: processes (>= 1). argv: the attnlab arguments, e.g. ["train", "--recipe", "R"].
        monitor_interval: seconds between the agent's checks of its processes.
    Returns:
        0, or the failed process's exit code (1 for a killed one), after one line on stderr naming
        its rank.
    """
    args = torchrun.parse_args(["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
                                f"--monitor-interval={monitor_interval}", "-m", "attnlab", *argv])
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)  # our one line instead
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        others = sorted(set(e.failures) - {rank})
        also = f" (also stopped: ranks {others})" if others else ""
        print(f"attnlab: error: rank {rank} of {nproc} (pid {failure.pid}) failed: {describe_exit(failure.exitcode)}"
              f"{also}; its message is above", file=sys.stderr)
        return failure.exitcode if failure.exitcode > 0 else 1
    return 0
