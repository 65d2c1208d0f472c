"""Issue 13 "Crash-safe runs": one test (or more) per numbered case, through the command line.

Whatever signal arrives at whatever moment, and whatever the disk does, the run directory afterwards
either resumes to exactly the uninterrupted result or says in one line what to do; no finished
result is lost; nothing non-finite is ever written as weights. The kill -9 matrix over every file
event is tests/train/test_crash_resume.py; the file-level kills tests/test_files.py.

The run here: `attnlab train --recipe shakespeare-char --steps 20` on tiny data (TINY_LM) with
evaluations at 15 and 20 (final), checkpoints #1 step 0, #2 step 10, #3 step 20, #4 after the final
evaluation, #5 at the end.
"""
import errno
import json
import os
import shutil
import signal
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnlab.data.datasets as datasets
import attnlab.tensorfile as tensorfile
from attnlab.cli import main
from attnlab.interop.hf import save_hf
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tasks.registry import get_task
from attnlab.train.loop import Trainer
from attnlab.train.run_dir import run_lock
from tests.conftest import TINY_LM, tiny_recipe
from tests.train.crash import assert_same_run, kill_at, reference_run, run_in_child

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons: one thread, as the forked child

SETS = [x for s in TINY_LM + ["eval_every=15"] for x in ("--set", s)]
STEPS = 20
CKPT = "*/.checkpoint.*.tmp"


def train(out, *extra, steps=STEPS):
    return main(["train", "--recipe", "shakespeare-char", "--steps", str(steps), "--out", str(out), *SETS, *extra])


def resume(out, steps=STEPS):
    return main(["train", "--recipe", "shakespeare-char", "--steps", str(steps), "--out", str(out), "--resume"])


def _check_ok(code) -> None:
    assert code == 0


def one_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines()
           if line.startswith("attnlab:")]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Tiny Shakespeare for the whole module, and the uninterrupted run."""
    yield from reference_run(tmp_path_factory, lambda out: _check_ok(train(out)))


def final_record(capsys) -> dict:
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return {k: v for k, v in record.items() if k not in ("elapsed_s", "tokens_per_s")}


# ----------------------------------------------------------------------------- 1. two renames
def test_case1_a_kill_between_the_fallback_renames_resumes(reference, tmp_path, capsys):
    """Before: `checkpoint.old` and a complete temporary but no `checkpoint/`: "nothing to resume"."""
    out = tmp_path / "run"
    kill_at(lambda: train(out), "moved-aside:*/checkpoint#2", fallback=True)
    assert not (out / "checkpoint").exists() and (out / ".checkpoint.old").is_dir()
    assert resume(out) == 0
    assert_same_run(reference, out)  # no .checkpoint.old nor temporary left either


# ----------------------------------------------------------------------------- 2. dead end
def test_case2_a_kill_in_the_first_checkpoint_after_an_evaluation_resumes(reference, tmp_path, capsys):
    """Before: model.safetensors but no checkpoint: --resume "nothing to resume", rerun "pass --resume"."""
    out = tmp_path / "run"
    kill_at(lambda: train(out), f"partial:{CKPT}/model.safetensors#3")
    assert (out / "model.safetensors").is_file()
    capsys.readouterr()
    assert train(out) == 2 and "pass --resume to continue it" in one_line(capsys)
    assert resume(out) == 0
    assert_same_run(reference, out)


def test_case2_a_kill_before_the_first_checkpoint_says_to_start_again(reference, tmp_path, capsys):
    out = tmp_path / "run"
    kill_at(lambda: train(out), f"partial:{CKPT}/model.safetensors#1")
    capsys.readouterr()
    assert resume(out) == 2
    assert "has no checkpoint (the run stopped before its first checkpoint); start it without --resume" \
        in one_line(capsys)
    assert train(out) == 0
    assert_same_run(reference, out)


# ----------------------------------------------------------------------------- 3. final checkpoint
def test_case3_a_kill_in_the_final_checkpoint_resumes_to_the_final_record(reference, tmp_path, capsys):
    """Before: "already finished" with the step-15 record while model.safetensors held step 20."""
    out = tmp_path / "run"
    kill_at(lambda: train(out), f"partial:{CKPT}/optimizer.safetensors#4")
    capsys.readouterr()
    assert resume(out) == 0
    record = final_record(capsys)
    assert record["step"] == record["best_step"] == STEPS
    assert resume(reference) == 0 and final_record(capsys) == record  # the finished reference says the same
    assert_same_run(reference, out)


# ----------------------------------------------------------------------------- 4. snapshots, averaging
@pytest.mark.parametrize("crash_at", ["swap:*/snapshots/step_00000004.safetensors", "swapped:*/checkpoint#5"],
                         ids=["while a snapshot is written", "after the final evaluation, before averaging"])
def test_case4_snapshots_and_the_average_survive_a_kill(tiny_multi30k, tmp_path, monkeypatch, crash_at):
    """Before: the average lost the snapshot being written (and a 0-byte temporary stayed); a kill
    before the averaging made the resume report "already finished" without averaging."""
    monkeypatch.setattr(datasets, "search_path", lambda: [tiny_multi30k.parent])  # not the module's data
    translation = get_task("seq2seq")
    full, out = tmp_path / "full", tmp_path / "run"
    expected = translation.train(tiny_recipe(6), full)
    assert expected["averaged"] == ["step_00000004", "step_00000006"]
    kill_at(lambda: translation.train(tiny_recipe(6), out), crash_at)
    result = translation.train(tiny_recipe(6), out, resume=True)
    timings = ("elapsed_s", "tokens_per_s")
    assert {k: v for k, v in result.items() if k not in timings} == {k: v for k, v in expected.items()
                                                                    if k not in timings}
    assert_same_run(full, out)


# ----------------------------------------------------------------------------- 5. one writer
def test_case5_a_second_training_into_the_same_out_is_refused(reference, tmp_path, capsys):
    """Before: both accepted (exit 0); config.json ended with the second run's settings."""
    out = tmp_path / "run"
    with run_lock(out):  # another training holds the directory (flock is per open file: this conflicts)
        assert train(out, "--set", "seed=1") == 2
        assert f"{out} is being written by another training (process {os.getpid()})" in one_line(capsys)
        assert not (out / "config.json").exists()
    assert train(out) == 0
    config = (out / "config.json").read_text()
    with run_lock(out):
        assert resume(out, steps=30) == 2 and "being written by another training" in one_line(capsys)
    assert (out / "config.json").read_text() == config
    assert_same_run(reference, out)


# ----------------------------------------------------------------------------- 6. disk full
def test_case6_a_full_disk_is_one_line_and_the_last_checkpoint_resumes(reference, tmp_path, capsys, monkeypatch):
    """Before: exit 1 with a SafetensorError traceback."""
    out, original, calls = tmp_path / "run", tensorfile._write, []

    def full_at_the_third_checkpoint(file, data, target):
        calls.append(target.name)
        if calls.count("optimizer.safetensors") == 3:
            with open(file, "wb") as f:
                f.write(data[:len(data) // 3])
            raise OSError(errno.ENOSPC, "No space left on device")
        original(file, data, target)

    monkeypatch.setattr(tensorfile, "_write", full_at_the_third_checkpoint)
    assert train(out) == 2
    line = one_line(capsys)
    assert line.startswith(f"attnlab: error: no space left on the device of {out}: this save needs about ")
    assert f"the last checkpoint is intact: free some space, then continue with: attnlab train --recipe " \
           f"shakespeare-char --out {out} --resume --steps {STEPS}" in line
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 10
    monkeypatch.setattr(tensorfile, "_write", original)
    assert resume(out) == 0
    assert_same_run(reference, out)


# ----------------------------------------------------------------------------- 7. NaN
@pytest.mark.parametrize("setting", ["lr=inf", "lr=nan", "lr_factor=inf", "min_lr=-inf", "label_smoothing=nan"])
def test_case7_non_finite_settings_are_refused_by_name(tmp_path, capsys, setting):
    """Before: lr=inf accepted, every weight ended NaN."""
    assert train(tmp_path / "run", "--set", setting) == 2
    assert f"{setting.split('=')[0]} must be a finite number" in one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_case7_a_saved_non_finite_setting_is_refused_on_resume(reference, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    config = json.loads((out / "config.json").read_text())
    config["train"]["lr"] = float("inf")
    (out / "config.json").write_text(json.dumps(config))  # writes Infinity
    assert resume(out, steps=30) == 2
    assert one_line(capsys) == f"attnlab: error: {out / 'config.json'}: lr must be a finite number, got inf"


def test_case7_a_non_finite_update_stops_before_anything_is_written(reference, tmp_path, capsys, monkeypatch):
    """Before: the guard checked only the loss, so checkpoints and best weights were written all-NaN."""
    out, step = tmp_path / "run", Trainer._train_step

    def poisoned(self, batch):
        if self.state.step == 12:  # the update of step 13 overflows
            original_step = self.optimizer.step
            self.optimizer.step = lambda: (original_step(), self.model.embed_tokens.weight.data.fill_(float("inf")))
        return step(self, batch)

    monkeypatch.setattr(Trainer, "_train_step", poisoned)
    assert train(out) == 2
    assert "the update of step 13 made embed_tokens.weight non-finite (NaN or inf)" in one_line(capsys)
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 10
    for path in out.rglob("*.safetensors"):
        assert all(torch.isfinite(t).all() for t in load_file(str(path)).values()), path


def test_case7_no_save_path_writes_non_finite_weights(tmp_path):
    model = GPT(GPTConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_seq_len=8))
    with torch.no_grad():
        model.norm.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"refusing to write .*model\.safetensors: tensor .* holds 16 non-fin"):
        save_hf(model, tmp_path / "hf")
    assert os.listdir(tmp_path) == []


def test_case7_a_huge_lr_gives_no_math_range_error(reference, tmp_path, capsys):
    """Before: --set lr=1e6 ended with "attnlab: error: math range error"."""
    code = train(tmp_path / "run", "--set", "lr=1e6", "--set", "eval_every=1", steps=3)
    err = capsys.readouterr().err
    assert "math range error" not in err and (code == 0 or "non-finite" in err or "diverged" in err)


# ----------------------------------------------------------------------------- 8. damaged files
def _edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_tensors(path, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def _garble(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(range(64))
    path.write_bytes(bytes(data))


def _first(tensors):
    return next(iter(tensors))


DAMAGE = {  # name -> (evaluate or resume, damage(run dir), what the one line says)
    "config.json block_size 'x'": ("evaluate", lambda d: _edit_json(d / "config.json", lambda c: c["data"].update(
        block_size="x")), "config.json: block_size must be int, got 'x'"),
    "config.json block_size 'x' (resume)": ("resume", lambda d: _edit_json(d / "config.json", lambda c: c[
        "data"].update(block_size="x")), "config.json: block_size must be int, got 'x'"),
    "state.json step 'abc'": ("resume", lambda d: _edit_json(d / "checkpoint/state.json", lambda s: s.update(
        step="abc")), "state.json: step must be an int >= 0, got 'abc'"),
    "state.json without step": ("resume", lambda d: _edit_json(d / "checkpoint/state.json", lambda s: s.pop("step")),
                                "state.json: missing field(s) ['step']"),
    "state.json without optimizer": ("resume", lambda d: _edit_json(d / "checkpoint/state.json", lambda s: s.pop(
        "optimizer")), "state.json: missing field(s) ['optimizer']"),
    "state.json position 1e9": ("resume", lambda d: _edit_json(d / "checkpoint/state.json", lambda s: s.update(
        position=10**9)), "state.json: position must be in 0.."),
    "state.json position -5": ("resume", lambda d: _edit_json(d / "checkpoint/state.json", lambda s: s.update(
        position=-5)), "state.json: position must be an int >= 0, got -5"),
    "rng.safetensors of another shape": ("resume", lambda d: save_file(
        {"torch": torch.zeros(7, dtype=torch.uint8)}, str(d / "checkpoint/rng.safetensors")),
        "rng.safetensors: tensor 'torch' has shape (7,), expected (5056,)"),
    "an optimizer tensor of another shape": ("resume", lambda d: _edit_tensors(
        d / "checkpoint/optimizer.safetensors", lambda t: t.update({"0.exp_avg": torch.zeros(3)})),
        "optimizer.safetensors: tensor '0.exp_avg' has shape (3,), expected"),
    "64 garbled bytes in model.safetensors": ("evaluate", lambda d: _garble(d / "model.safetensors"),
                                              "model.safetensors is damaged: its tensor data does not match"),
    "NaN weights": ("evaluate", lambda d: _edit_tensors(d / "model.safetensors", lambda t: [
        v.fill_(float("nan")) for v in t.values()]), "non-finite values (NaN or inf); the file is damaged"),
    "a float64 tensor": ("evaluate", lambda d: _edit_tensors(d / "model.safetensors", lambda t: t.update(
        {_first(t): t[_first(t)].double()})), "is float64, the model's weights are float32"),
    "NaN checkpoint weights": ("resume", lambda d: _edit_tensors(d / "checkpoint/model.safetensors", lambda t: [
        v.fill_(float("nan")) for v in t.values()]), "checkpoint/model.safetensors: tensor"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_case8_a_damaged_file_is_one_line_naming_the_file_and_field(reference, tmp_path, capsys, case):
    """Before: tracebacks (TypeError, RuntimeError), bare keys ("error: step"), or exit 0 with NaN."""
    how, damage, says = DAMAGE[case]
    out = tmp_path / "run"
    shutil.copytree(reference, out)  # copies: the reference's hard links stay undamaged
    damage(out)
    code = main(["evaluate", "--model", str(out)]) if how == "evaluate" else resume(out, steps=30)
    assert code == 2 and says in one_line(capsys)


def test_case8_a_deleted_model_gets_advice_that_works(reference, tmp_path, capsys):
    """Before: the advice (--resume) said "already finished" and wrote nothing."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    assert main(["evaluate", "--model", str(out)]) == 0
    scores = {k: v for k, v in json.loads(capsys.readouterr().out).items() if k != "seconds"}
    (out / "model.safetensors").unlink()
    assert main(["evaluate", "--model", str(out)]) == 2
    advice = one_line(capsys).split("restore it from the checkpoint with: ")[1]
    assert advice == f"attnlab train --recipe shakespeare-char --out {out} --resume --steps {STEPS}"
    assert main(advice.split()[1:]) == 0
    assert main(["evaluate", "--model", str(out)]) == 0
    assert {k: v for k, v in json.loads(capsys.readouterr().out.splitlines()[-1]).items() if k != "seconds"} == scores


# ----------------------------------------------------------------------------- 9. other bad input
def test_case9_a_batch_that_cannot_fit_is_refused_before_allocating(tmp_path, capsys):
    """Before: 26 s, then "you tried to allocate 520000000000 bytes" (a traceback)."""
    assert train(tmp_path / "run", "--set", "batch_size=1000000000", steps=1) == 2
    line = one_line(capsys)
    assert line.startswith("attnlab: error: batch_size=1000000000: one batch of 16,000,000,000 tokens needs at least")
    assert line.endswith("lower batch_size") and not (tmp_path / "run").exists()


@pytest.mark.parametrize("recipe", ["shakespeare-char", "digits-vit"])
def test_case9_init_is_refused_by_name_outside_bert(tmp_path, capsys, recipe):
    """Before: --set init=/nonexistent trained from random weights (exit 0)."""
    args = ["train", "--recipe", recipe, "--steps", "1", "--out", str(tmp_path / "run"), "--set", "init=/nonexistent"]
    assert main(args) == 2 and "unknown setting 'init'" in one_line(capsys)


# ----------------------------------------------------------------------------- 10. signals
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_case10_a_stop_signal_checkpoints_the_step_and_resumes(reference, tmp_path, monkeypatch, signum):
    """Before: SIGTERM wrote no checkpoint; the "interrupted" line went to stdout."""
    out, step = tmp_path / "run", Trainer._train_step

    def signal_at_step_3(self, batch):
        result = step(self, batch)
        if self.state.step == 3:
            os.kill(os.getpid(), signum)  # as if sent by a scheduler (or Ctrl-C) during step 3
        return result

    def work():
        sys.stdout, sys.stderr = open(tmp_path / "stdout", "w"), open(tmp_path / "stderr", "w")
        return train(out)

    monkeypatch.setattr(Trainer, "_train_step", signal_at_step_3)
    status = run_in_child(work)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 128 + signum
    name = signal.Signals(signum).name
    err = (tmp_path / "stderr").read_text()
    assert f"interrupted ({name}): finishing this step and writing a checkpoint" in err
    assert f"attnlab: interrupted; continue with: attnlab train --recipe shakespeare-char --out {out} --resume " \
           f"--steps {STEPS}" in err
    assert (tmp_path / "stdout").read_text() == ""
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 3
    monkeypatch.setattr(Trainer, "_train_step", step)
    assert resume(out) == 0
    assert_same_run(reference, out)
