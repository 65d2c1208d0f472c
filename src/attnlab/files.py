"""Atomic writes: of one file, and of a whole directory. Every save of attnlab goes through here
(checkpoints, best weights, snapshots, HF and BERT exports, tokenizer.json, config.json).

A reader, or a process that dies at any instant, sees the old content or the new one, never a mix:
    file:       write a temporary file in the same folder, fsync it, rename it over the target.
    directory:  fill a temporary directory beside the target, fsync it, then swap it with the target
                in one renameat2(RENAME_EXCHANGE) (Linux); where the file system lacks that call,
                move the old directory aside to `.NAME.old` and the new one in, and
                `recover_directory` puts the old one back if a crash fell between the two renames.
Temporary files and directories are removed when the write fails. New files get mode 0644 and
directories 0755 (tempfile makes them private).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_LIBC = ctypes.CDLL(None, use_errno=True)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Create or replace the file `path` with what `write(tmp)` writes to a temporary path.

    Raises:
        whatever `write` raises (e.g. OSError when the disk is full); the target is then unchanged
        and the temporary file removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        _fsync_file(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _backup(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step; False when the system or file system can't."""
    if not hasattr(_LIBC, "renameat2"):
        return False
    if _LIBC.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_directory(new: Path, target: Path) -> None:
    """Put directory `new` in the place of `target` (which may not exist), atomically where possible
    (module docstring); the old content is deleted afterwards."""
    if target.exists() and _exchange(new, target):
        shutil.rmtree(new)  # `new` now holds the old content
    elif target.exists():
        backup = _backup(target)
        shutil.rmtree(backup, ignore_errors=True)
        os.rename(target, backup)
        os.rename(new, target)  # a crash before this line is undone by recover_directory
        shutil.rmtree(backup)
    else:
        os.rename(new, target)
    fsync_dir(target.parent)


def recover_directory(path: str | Path) -> None:
    """Undo a replacement interrupted between its two renames: when `path` is missing and its
    backup exists, move the backup back. Call before reading a directory written by
    atomic_directory."""
    path = Path(path)
    backup = _backup(path)
    if not path.exists() and backup.is_dir():
        os.rename(backup, path)


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Write a directory as a whole: yields a temporary directory beside `path` to fill; when the
    block ends without an error it replaces `path` (replace_directory), else it is removed.

    Example:
        with atomic_directory(out) as tmp:
            save_file(tensors, tmp / "model.safetensors")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_directory(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        for child in tmp.iterdir():
            if child.is_file():
                os.chmod(child, 0o644)
                _fsync_file(child)
        os.chmod(tmp, 0o755)
        fsync_dir(tmp)
        replace_directory(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
