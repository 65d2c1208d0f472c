"""The extension's build lock (nn/quant_kernel.py build_lock): a build killed half-way must not
make every later load of the same version wait forever on torch's leftover `lock` file."""
import fcntl
import re
import signal
import subprocess
import sys
import time

import pytest

from attnlab.nn import quant_kernel


def _held(path) -> bool:
    """Whether another open file description holds an exclusive flock on path."""
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_a_leftover_torch_baton_is_removed_under_the_lock(tmp_path, capsys):
    (tmp_path / "lock").touch()  # what a builder killed inside cpp_extension.load leaves
    with quant_kernel.build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
        assert _held(tmp_path / "attnlab.lock")
    assert not _held(tmp_path / "attnlab.lock")
    assert "did not finish" in capsys.readouterr().err


def test_the_lock_of_a_killed_builder_is_released(tmp_path):
    code = ("import sys, time; from pathlib import Path; from attnlab.nn.quant_kernel import build_lock\n"
            "with build_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        assert _held(tmp_path / "attnlab.lock")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _held(tmp_path / "attnlab.lock") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _held(tmp_path / "attnlab.lock")
    finally:
        child.kill()


def test_the_build_runs_inside_the_lock_in_its_own_directory(tmp_path, monkeypatch):
    from torch.utils import cpp_extension
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("ATTNLAB_QUANT_KERNEL", raising=False)
    monkeypatch.setattr(quant_kernel, "instruction_set", lambda: "avx512")
    seen = {}

    def fake_load(name, build_directory, **kwargs):
        seen["dir"] = build_directory
        seen["held"] = _held(tmp_path / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / name / "attnlab.lock")
        raise RuntimeError("no compiler in this test")

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    reason = quant_kernel._build()
    assert reason is not None and "no compiler in this test" in reason
    assert seen["held"] is True
    assert seen["dir"] == str(quant_kernel.build_directory(quant_kernel._extension_name()))
    assert seen["dir"].startswith(str(tmp_path))


@pytest.mark.skipif(sys.platform != "linux", reason="the default directory is torch's Linux one")
def test_the_default_directory_is_torchs(monkeypatch):
    from torch.utils import cpp_extension
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    name = quant_kernel._extension_name()
    assert str(quant_kernel.build_directory(name)) == cpp_extension._get_build_directory(name, verbose=False)


def test_each_checkout_builds_in_its_own_directory(tmp_path, monkeypatch):
    """Regression: two checkouts of one version shared a build directory, and torch's build file names
    the sources by path, so each rebuilt the extension (~1 min) whenever the other had loaded it."""
    files = quant_kernel.SOURCES + quant_kernel.HEADERS
    names = []
    for checkout in ("one", "two", "one"):
        folder = tmp_path / checkout
        folder.mkdir(exist_ok=True)
        for path in files:
            (folder / path.name).write_bytes(path.read_bytes())
        monkeypatch.setattr(quant_kernel, "SOURCES", [folder / p.name for p in quant_kernel.SOURCES])
        monkeypatch.setattr(quant_kernel, "HEADERS", [folder / p.name for p in quant_kernel.HEADERS])
        names.append(quant_kernel._extension_name())
        monkeypatch.undo()
    assert names[0] != names[1] and names[0] == names[2]


def test_every_header_the_sources_include_is_in_the_build_digest():
    """Regression: decode_attention_avx2.h, included by decode_attention.h, was missing from a hand-made
    HEADERS list, so a change to it alone left the old build's name and the stale build loaded."""
    named = {p.name for p in quant_kernel.HEADERS}
    for path in quant_kernel.SOURCES + quant_kernel.HEADERS:
        for include in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), flags=re.M):
            assert include in named, f"{path.name} includes {include}, not in quant_kernel.HEADERS"
    assert "decode_attention_avx2.h" in named


def test_a_changed_header_changes_the_build_name(tmp_path, monkeypatch):
    files = quant_kernel.SOURCES + quant_kernel.HEADERS
    for path in files:
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(quant_kernel, "SOURCES", [tmp_path / p.name for p in quant_kernel.SOURCES])
    monkeypatch.setattr(quant_kernel, "HEADERS", [tmp_path / p.name for p in quant_kernel.HEADERS])
    before = quant_kernel._extension_name("avx2")
    header = tmp_path / "decode_attention_avx2.h"
    header.write_text(header.read_text() + "\n// changed\n")
    assert quant_kernel._extension_name("avx2") != before
