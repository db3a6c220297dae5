"""Small JSON state files written atomically, so a crash never leaves half a file behind; damaged ones moved aside."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any


class DamagedFile(Exception):
    """A state file exists but cannot be read as JSON; ``moved_to`` is where it was put aside."""

    def __init__(self, path: Path, moved_to: Path):
        super().__init__(f"{path} was damaged; it was moved to {moved_to}")
        self.path, self.moved_to = path, moved_to


def read_json(path: Path, default: Any) -> Any:
    """The file's JSON value, or ``default`` when it is missing or unreadable (it is rebuilt then)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def read_json_state(path: Path, default: Any) -> Any:
    """The file's JSON value, or ``default`` when it is missing.

    Raises:
        DamagedFile: the file is there but is not JSON (truncated, garbled); it has been renamed to
            ``NAME.damaged-YYYYmmdd-HHMMSS`` beside itself (kept, never deleted), so nothing overwrites it.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is a ValueError too
        raise DamagedFile(path, move_aside(path)) from None


def move_aside(path: Path) -> Path:
    """Rename ``path`` to a ``.damaged-<time>`` name beside it (never over an earlier one); returns the new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = path.with_name(f"{path.name}.damaged-{stamp}"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    os.replace(path, target)
    return target


def salvage_objects(text: str) -> list[dict]:
    """Every complete top-level JSON object that can still be read from damaged text, in order."""
    decoder, found, i = json.JSONDecoder(), [], text.find("{")
    while i != -1:
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(value, dict):
            found.append(value)
        i = text.find("{", end)
    return found


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
