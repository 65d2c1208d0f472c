"""JSON files: read a JSON object with clear errors, write atomically (temp file + os.replace)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def read_json(path: str | Path) -> dict:
    """The JSON object stored at `path`.

    Raises:
        FileNotFoundError: naming the path. ValueError: naming the file when it is not valid JSON
            or not a JSON object.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path} must hold a JSON object, found {type(obj).__name__}")
    return obj


def write_json_atomic(path: str | Path, obj) -> None:
    """Write `obj` as JSON (UTF-8, indented) to `path` through a temporary file in the same folder;
    readers see the old file or the new one, never a part. The file gets mode 0644."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
