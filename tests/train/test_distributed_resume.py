"""Distributed runs stop cleanly and resume: a rank killed (kill -9) stops the job in bounded time
with the failed rank named, and --resume gives the uninterrupted result; a checkpoint written by two
processes resumes on one and one written by one resumes on two (DCP's full state dicts; the files
do not depend on the number of processes); a rank killed in the middle of a checkpoint write leaves
the previous checkpoint loadable."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from attnlab.train.checkpoint import read_state
from tests.train.distributed_runs import TRANSLATION, env, max_difference, one_process, torchrun, weights


def test_a_killed_rank_stops_the_job_and_resume_equals_the_uninterrupted_run(runs, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "attnlab", "train", "--nproc", "2", *TRANSLATION, "--steps", "5", "--out", str(out)]
    t0 = time.monotonic()
    killed = subprocess.run(cmd, env=env(runs.data, ATTNLAB_CRASH_AT="step:*rank1/step_3"), capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == 1 and time.monotonic() - t0 < 60
    assert "attnlab: error: rank 1 of 2" in killed.stderr and "killed by SIGKILL" in killed.stderr
    assert read_state(out / "checkpoint").step == 2  # the last checkpoint before the kill
    resume = [sys.executable, "-m", "attnlab", "train", "--nproc", "2", "--recipe", "multi30k-en-de", "--steps", "5",
              "--out", str(out), "--resume"]
    done = subprocess.run(resume, env=env(runs.data), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    uninterrupted, _ = runs.two("translation", "ddp")
    assert max_difference(weights(out), weights(uninterrupted)) == 0.0  # bit for bit
    strip = lambda run: [{k: v for k, v in json.loads(line).items() if k not in ("elapsed_s", "tokens_per_s")}  # noqa: E731
                         for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert strip(out) == strip(uninterrupted)


def test_two_processes_killed_mid_checkpoint_resume_on_one(runs, tmp_path, monkeypatch, one_thread):
    out = tmp_path / "run"
    # rank 0 dies half-way through writing the third checkpoint (step 4) of an FSDP run
    killed = torchrun(runs.data, [*TRANSLATION, "--set", "parallel=fsdp", "--steps", "5", "--out", str(out)],
                      extra_env={"ATTNLAB_CRASH_AT": "partial:*checkpoint*model.safetensors#3"})
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr
    assert read_state(out / "checkpoint").step == 2
    one_process(monkeypatch, runs.data, ["--recipe", "multi30k-en-de", "--steps", "5", "--out", str(out), "--resume"])
    assert max_difference(weights(out), weights(runs.one("translation"))) < 1e-5


def test_one_process_run_resumes_on_two(runs, tmp_path, monkeypatch, one_thread):
    out = tmp_path / "run"
    one_process(monkeypatch, runs.data, [*TRANSLATION, "--set", "parallel=fsdp", "--steps", "3", "--out", str(out)])
    resumed = torchrun(runs.data, ["--recipe", "multi30k-en-de", "--steps", "5", "--out", str(out), "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert max_difference(weights(out), weights(runs.one("translation"))) < 1e-5
