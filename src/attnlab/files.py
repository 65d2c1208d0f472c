"""Atomic writes: of one file, and of a whole directory. Every save of attnlab goes through here
(checkpoints, best weights, snapshots, HF and BERT exports, tokenizer.json, config.json).

A reader, or a process that dies at any instant, sees the old content or the new one, never a mix:
    file:       write a temporary file `.NAME.XXXX.tmp` in the same folder, fsync it, rename it over
                the target.
    directory:  fill a temporary directory `.NAME.XXXX.tmp` beside the target, fsync it, then swap it
                with the target in one renameat2(RENAME_EXCHANGE) (Linux); where the file system lacks
                that call, move the old directory aside to `.NAME.old` and the new one in, and
                `recover_directory` puts the old one back if a crash fell between the two renames.
Temporary files and directories are removed when the write fails; those a killed process leaves
behind are removed by `remove_temporaries`, which the single writer of a folder calls (a run
directory's lock holder, train/run_dir.py). New files get mode 0644 and directories 0755.

A full disk (ENOSPC) raises DiskFullError: one line naming the folder and the space the save needs,
after the temporary files are removed; the previous content is untouched.

Test hook (off unless the environment sets it): ATTNLAB_CRASH_AT=EVENT:GLOB[#N] makes the process
SIGKILL itself at the N-th (default first) file event EVENT whose target path matches GLOB
(fnmatch over the whole path, `*` crosses `/`). Events, in the order a save passes them:
    partial     half of a tensor file's bytes are written (tensorfile.py)
    written     the temporary file or directory is complete; nothing renamed yet
    swap        just before the rename (file) or the exchange / first rename (directory)
    moved-aside directory fallback: the old directory is aside, the new one not yet in place
    swapped     the new content is in place; the old one not yet deleted
    step        (not a file) a training process finished an optimizer step; the path is
                OUT/rank<R>/step_<N> (train/loop.py), so a test can kill one rank of several
tests/train/crash.py uses it to kill a training at each of these points and check the resume.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Callable, Iterator

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_LIBC = ctypes.CDLL(None, use_errno=True)
CRASH_ENV = "ATTNLAB_CRASH_AT"
_crash_counts: dict[str, int] = {}


def crash_point(event: str, path: str | Path) -> None:
    """SIGKILL this process when $ATTNLAB_CRASH_AT names this event and path (module docstring); a
    no-op otherwise. Test-only: it lets a test kill a save at an exact instant."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    want, _, rest = spec.partition(":")
    pattern, _, nth = rest.partition("#")
    if want != event or not fnmatch.fnmatchcase(str(path), pattern):
        return
    _crash_counts[spec] = _crash_counts.get(spec, 0) + 1
    if _crash_counts[spec] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def format_bytes(n: float) -> str:
    """`n` bytes for people: "3.1 MB"."""
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


class DiskFullError(OSError):
    """No space left on the device of `folder` for a save of about `need` bytes (None: unknown).
    str() is one line naming the folder, the space needed and the space free; `reason` is its first
    part, for callers that give their own advice."""

    def __init__(self, folder: Path, need: int | None):
        try:
            free = f"{format_bytes(shutil.disk_usage(folder).free)} free"
        except OSError:
            free = "free space unknown"
        needs = f"needs about {format_bytes(need)}" if need else "needs more space"
        self.reason = f"no space left on the device of {folder}: this save {needs} ({free})"
        super().__init__(f"{self.reason}; temporary files were removed and the previous files are intact: free "
                         f"some space and run it again")
        self.errno = errno.ENOSPC


@contextlib.contextmanager
def _disk_full_as_one_line(folder: Path, need: int | None) -> Iterator[None]:
    """Refuse a save of `need` bytes up front when the folder's device has less free, and turn an
    ENOSPC raised inside the block into DiskFullError (the block removes its own temporaries)."""
    try:
        free = shutil.disk_usage(folder).free if need else None
    except OSError:
        free = None
    if free is not None and free < need:
        raise DiskFullError(folder, need)
    try:
        yield
    except OSError as e:
        if e.errno == errno.ENOSPC and not isinstance(e, DiskFullError):
            raise DiskFullError(folder, need) from None
        raise


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


def atomic_write(path: str | Path, write: Callable[[Path], None], need: int | None = None) -> None:
    """Create or replace the file `path` with what `write(tmp)` writes to a temporary path.

    Args:
        need: the bytes the file will take, when known (for DiskFullError's message and its check
            before anything is written).
    Raises:
        DiskFullError: when the device is full. Whatever `write` raises. In both cases the target is
            unchanged and the temporary file removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _disk_full_as_one_line(path.parent, need):
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            write(tmp)
            crash_point("written", path)
            _fsync_file(tmp)
            os.chmod(tmp, 0o644)
            crash_point("swap", path)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        crash_point("swapped", path)
        fsync_dir(path.parent)


def link_or_copy(source: str | Path, path: str | Path) -> None:
    """Create the new file `path` as a hard link of `source` (no extra space), or as a copy where the
    file system has no hard links. Safe to share: every save replaces files by rename and never
    writes into an existing one."""
    try:
        os.link(source, path)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        shutil.copyfile(source, path)


def atomic_link(source: str | Path, path: str | Path) -> None:
    """Make `path` another name of the file `source` (link_or_copy), atomically (atomic_write)."""
    def link(tmp: Path) -> None:
        tmp.unlink()
        link_or_copy(source, tmp)
    atomic_write(path, link)


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
    crash_point("swap", target)
    if target.exists() and _exchange(new, target):
        crash_point("swapped", target)
        shutil.rmtree(new)  # `new` now holds the old content
    elif target.exists():
        backup = _backup(target)
        shutil.rmtree(backup, ignore_errors=True)
        os.rename(target, backup)
        crash_point("moved-aside", target)
        os.rename(new, target)  # a crash before this line is undone by recover_directory
        crash_point("swapped", target)
        shutil.rmtree(backup)
    else:
        os.rename(new, target)
        crash_point("swapped", target)
    fsync_dir(target.parent)


def committed_directory(path: str | Path) -> Path | None:
    """Where the last complete version of a directory written by atomic_directory is: `path`, or
    its backup when a crash fell between the fallback's two renames; None when there is none.
    Reads only (recover_directory moves the backup back)."""
    path = Path(path)
    if path.is_dir():
        return path
    backup = _backup(path)
    return backup if backup.is_dir() else None


def recover_directory(path: str | Path) -> None:
    """Undo a replacement interrupted between its two renames: when `path` is missing and its
    backup exists, move the backup back. Call before reading a directory written by
    atomic_directory, as its only writer (a concurrent fallback replacement would then fail)."""
    path = Path(path)
    backup = _backup(path)
    if not path.exists() and backup.is_dir():
        os.rename(backup, path)


def remove_temporaries(folder: str | Path) -> list[str]:
    """Recover every directory of `folder` a crash left aside, then delete what killed saves left
    behind: temporary files and directories (`.NAME.XXXX.tmp`) and old directories (`.NAME.old`)
    whose replacement completed. Only the folder's single writer may call it (a concurrent save's
    temporary would be deleted). Returns the names removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    for entry in folder.glob(".*.old"):
        recover_directory(folder / entry.name[1:-len(".old")])
    removed = []
    for entry in sorted([*folder.glob(".*.tmp"), *folder.glob(".*.old")]):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry.name)
    if removed:
        fsync_dir(folder)
    return removed


@contextlib.contextmanager
def atomic_directory(path: str | Path, need: int | None = None) -> Iterator[Path]:
    """Write a directory as a whole: yields a temporary directory beside `path` to fill; when the
    block ends without an error it replaces `path` (replace_directory), else it is removed.

    Args:
        need: the bytes the directory will take, when known (DiskFullError's message and check).
    Raises:
        DiskFullError: when the device fills up (the temporary directory removed, `path` untouched).

    Example:
        with atomic_directory(out) as tmp:
            save_file(tensors, tmp / "model.safetensors")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_directory(path)
    with _disk_full_as_one_line(path.parent, need):
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        try:
            yield tmp
            for child in tmp.iterdir():
                if child.is_file():
                    os.chmod(child, 0o644)
                    _fsync_file(child)
            os.chmod(tmp, 0o755)
            fsync_dir(tmp)
            crash_point("written", path)
            replace_directory(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
