"""files.py: a process killed (SIGKILL) at any instant of an atomic save leaves the old content or the
new one, never a mix nor nothing; recovery and remove_temporaries leave only the target; a full
disk gives one line and removes the temporaries (issue 13, cases 1 and 6)."""
import errno
import os
import shutil
import signal
from collections import namedtuple

import pytest
import torch

import attnlab.files as files
from attnlab.files import (DiskFullError, atomic_directory, atomic_link, committed_directory, recover_directory,
                           remove_temporaries)
from attnlab.pretrained import resolve
from attnlab.tensorfile import read_tensors, save_tensors
from tests.train.crash import run_in_child

pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons: one thread, as the forked child

OLD, NEW = {"a.txt": "old a", "b.txt": "old b"}, {"a.txt": "new a", "b.txt": "new b", "c.txt": "new c"}


def _write_dir(target, content):
    with atomic_directory(target) as tmp:
        for name, text in content.items():
            (tmp / name).write_text(text)


def _content(folder):
    return {p.name: p.read_text() for p in folder.iterdir()}


def _killed(status):
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "two renames"])
@pytest.mark.parametrize("event", ["written", "swap", "moved-aside", "swapped"])
def test_a_directory_replacement_killed_at_any_event_keeps_old_or_new(tmp_path, event, fallback):
    if event == "moved-aside" and not fallback:
        pytest.skip("the exchange has no in-between state")
    target = tmp_path / "checkpoint"
    _write_dir(target, OLD)
    assert _killed(run_in_child(lambda: _write_dir(target, NEW), f"{event}:{target}", fallback))
    expected = NEW if event == "swapped" else OLD
    assert _content(committed_directory(target)) == expected  # what a reader finds before any recovery
    assert remove_temporaries(tmp_path)  # the killed save left a temporary (or the old directory) behind
    assert os.listdir(tmp_path) == ["checkpoint"] and _content(target) == expected
    _write_dir(target, NEW)  # and the next save works
    assert os.listdir(tmp_path) == ["checkpoint"] and _content(target) == NEW


def test_between_the_two_renames_the_backup_is_the_committed_version(tmp_path):
    """Issue 13 case 1: `checkpoint` missing, `.checkpoint.old` and a complete temporary beside it."""
    target = tmp_path / "checkpoint"
    _write_dir(target, OLD)
    assert _killed(run_in_child(lambda: _write_dir(target, NEW), f"moved-aside:{target}", fallback=True))
    assert not target.exists() and committed_directory(target) == tmp_path / ".checkpoint.old"
    assert resolve(str(target)) == tmp_path / ".checkpoint.old"  # what loaders read until it is recovered
    recover_directory(target)
    assert _content(target) == OLD


@pytest.mark.parametrize("event", ["partial", "written", "swap", "swapped"])
def test_a_file_save_killed_at_any_event_keeps_old_or_new(tmp_path, event):
    target = tmp_path / "model.safetensors"
    old, new = {"w": torch.zeros(64)}, {"w": torch.ones(64)}
    save_tensors(target, old)
    assert _killed(run_in_child(lambda: save_tensors(target, new), f"{event}:{target}"))
    expected = new if event == "swapped" else old
    assert torch.equal(read_tensors(target)["w"], expected["w"])
    remove_temporaries(tmp_path)
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_atomic_link_shares_the_file_and_survives_the_source_replacement(tmp_path):
    save_tensors(tmp_path / "a.safetensors", {"w": torch.ones(3)})
    atomic_link(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert os.path.samefile(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    save_tensors(tmp_path / "a.safetensors", {"w": torch.zeros(3)})  # replaced by rename: b keeps the old file
    assert torch.equal(read_tensors(tmp_path / "b.safetensors")["w"], torch.ones(3))


def _fill_then_fail(path):
    path.write_bytes(b"x" * 1000)
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_one_line_with_the_space_needed_and_no_temporaries(tmp_path):
    """Issue 13 case 6, at the file level (the training level is in tests/test_crash_safety.py)."""
    target = tmp_path / "checkpoint"
    _write_dir(target, OLD)
    with pytest.raises(DiskFullError) as e:
        with atomic_directory(target, need=3_100_000) as tmp:
            _fill_then_fail(tmp / "model.safetensors")
    message = str(e.value)
    assert "\n" not in message and str(tmp_path) in message and "3.1 MB" in message and e.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == ["checkpoint"] and _content(target) == OLD
    with pytest.raises(DiskFullError, match="needs about 1.0 kB"):
        files.atomic_write(tmp_path / "model.safetensors", _fill_then_fail, need=1000)
    assert os.listdir(tmp_path) == ["checkpoint"]


def test_a_save_larger_than_the_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 2_000_000, 2_000_000))
    with pytest.raises(DiskFullError, match=r"needs about 3\.1 MB \(2\.0 MB free\)"):
        save_tensors(tmp_path / "model.safetensors", {"w": torch.zeros(775_000)})
    assert os.listdir(tmp_path) == []
