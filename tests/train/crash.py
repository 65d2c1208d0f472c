"""Crash injection for training runs: kill a short training with SIGKILL at a named file event, then
check that the run directory resumes to exactly the uninterrupted result.

The kill comes from the write helpers themselves (files.crash_point): the child process sets
$ATTNLAB_CRASH_AT=EVENT:GLOB[#N] and dies at the N-th matching event (partial, written, swap,
moved-aside, swapped; files.py's docstring), inside a file write, between renames, after a swap.

The training runs in a forked child rather than a fresh interpreter: no start-up cost, and the
test's fixtures (tiny data through $ATTNLAB_DATA, monkeypatches) and sources apply in it as in the
test. The child uses one torch thread (an OpenMP pool does not survive fork) and never returns into
pytest (os._exit).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import pytest
import torch

import attnlab.data.datasets as datasets
import attnlab.files as files
from attnlab.tensorfile import read_tensors
from tests.conftest import tiny_text

TIMINGS = {"elapsed_s", "tokens_per_s", "metrics_bytes", "seconds", "eval_s", "spent_s", "time_s"}  # differ between two identical runs


def run_in_child(work: Callable[[], object], crash_at: str | None = None, fallback: bool = False,
                 before: Callable[[int], None] | None = None, timeout: float = 120.0) -> int:
    """Run work() in a forked child and return its wait status (os.waitpid's); the child exits with
    work()'s int result (cli.main's exit code), a SystemExit's code, or 0.

    Args:
        crash_at: $ATTNLAB_CRASH_AT for the child: it SIGKILLs itself at that file event.
        fallback: directory swaps use the two-rename fallback (as on a file system without
            renameat2's exchange), so a kill can fall between the renames.
        before: called in the parent with the child's pid, e.g. to send it a signal.
    """
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            torch.set_num_threads(1)
            if crash_at:
                os.environ[files.CRASH_ENV] = crash_at
            if fallback:
                files._exchange = lambda a, b: False
            result = work()
            code = result if isinstance(result, int) else 0  # cli.main returns its exit code
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except KeyboardInterrupt as e:
            code = 128 + getattr(e, "signum", signal.SIGINT)
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()  # os._exit does not
            os._exit(code)
    if before is not None:
        before(pid)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the child training did not end within {timeout} s")
        time.sleep(0.02)


def kill_at(work: Callable[[], object], crash_at: str, fallback: bool = False) -> None:
    """Run work() in a child that dies by SIGKILL at file event `crash_at`; fail if it did not."""
    status = run_in_child(work, crash_at, fallback)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"no kill at {crash_at}: the child " + (f"exited with {os.WEXITSTATUS(status)}" if os.WIFEXITED(status)
                                                else f"died by signal {os.WTERMSIG(status)}"))


def _without_timings(obj):
    if isinstance(obj, dict):
        return {k: _without_timings(v) for k, v in obj.items() if k not in TIMINGS}
    if isinstance(obj, list):
        return [_without_timings(v) for v in obj]
    return obj


def run_contents(out: Path) -> dict:
    """What a run directory holds, timings left out: every tensor of the checkpoint (weights, Adam,
    RNG, best), of model.safetensors and of the snapshots; state.json; every metrics record; and
    the names of all files (so a leftover temporary shows)."""
    out = Path(out)
    tensors = {str(p.relative_to(out)): read_tensors(p) for p in sorted(out.rglob("*.safetensors"))}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"files": sorted(str(p.relative_to(out)) for p in out.rglob("*")),
            "tensors": tensors,
            "state": _without_timings(json.loads((out / "checkpoint" / "state.json").read_text())),
            "metrics": _without_timings(records)}


def assert_same_run(a: Path, b: Path) -> None:
    """Two run directories hold the same run: same files, bit-identical tensors, same state and
    the same metrics records (timings aside)."""
    x, y = run_contents(a), run_contents(b)
    assert x["files"] == y["files"]
    assert x["state"] == y["state"]
    assert x["metrics"] == y["metrics"]
    for name, tensors in x["tensors"].items():
        other = y["tensors"][name]
        assert tensors.keys() == other.keys(), name
        for key, t in tensors.items():
            assert torch.equal(t, other[key]), f"{name}: {key}"


def reference_run(tmp_path_factory, train: Callable[[Path], object]):
    """For a module-scoped fixture (`yield from`): tiny Shakespeare as the only data set while the
    module runs, and the uninterrupted run `train(out)` made on one thread, as every run it is
    compared with (the one_thread fixture, the forked child)."""
    root = tmp_path_factory.mktemp("data")
    (root / "tinyshakespeare").mkdir()
    (root / "tinyshakespeare" / "input.txt").write_text(tiny_text(), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_DATA", str(root))
        mp.setattr(datasets, "search_path", lambda: [root])
        out = tmp_path_factory.mktemp("reference") / "run"
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            train(out)
        finally:
            torch.set_num_threads(threads)
        yield out
