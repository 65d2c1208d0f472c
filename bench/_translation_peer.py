"""The torch.nn.Transformer peer of bench/translation.py (../shared/peers/nn_transformer_multi30k.py,
run unchanged with its README's tuned settings), started as a subprocess; optionally on fewer
threads than the 2 its script sets, and on chosen CPUs, so that it can train beside our run."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from _common import SHARED

SCRIPT = SHARED / "peers" / "nn_transformer_multi30k.py"
TUNED = {"BT": "1500", "WARM": "200", "FACTOR": "0.7"}  # the peer README's tuned settings

# The peer's script calls torch.set_num_threads(2); this runs it as __main__ with that call pinned to
# the number asked for (the file itself stays as its author wrote it).
_PINNED = ("import runpy, sys, torch; n = int(sys.argv.pop(1)); torch.set_num_threads(n); "
           "torch.set_num_threads = lambda _: None; sys.argv = sys.argv[1:]; "
           "runpy.run_path(sys.argv[0], run_name='__main__')")


def start_peer(minutes: float, threads: int | None = None, cpus: set[int] | None = None) -> subprocess.Popen:
    """Start the peer for a `minutes` budget: its own thread count (2) unless `threads`, pinned to
    `cpus` when given. Its stdout (one JSON line at the end) is piped."""
    env = {**os.environ, **TUNED}
    args = [str(SCRIPT), str(SHARED / "data"), str(minutes)]
    cmd = [sys.executable, *args] if threads is None else [sys.executable, "-c", _PINNED, str(threads), *args]
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=preexec)


def finish_peer(proc: subprocess.Popen) -> dict:
    """Wait for the peer and return its JSON line (raises RuntimeError when it failed)."""
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the peer {SCRIPT} exited with {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])
