"""JSON files: read a JSON object with clear errors, write atomically (files.atomic_write)."""
from __future__ import annotations

import json
from pathlib import Path

from attnlab.errors import UserError
from attnlab.files import atomic_write


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
        raise UserError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} must hold a JSON object, found {type(obj).__name__}")
    return obj


def write_json_atomic(path: str | Path, obj) -> None:
    """Write `obj` as JSON (UTF-8, indented) to `path` atomically (files.atomic_write): readers see the
    old file or the new one, never a part."""
    text = json.dumps(obj, ensure_ascii=False, indent=2) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
