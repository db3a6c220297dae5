"""Where Hearth keeps its files: the data and log directories (the built-in model's: ``app.builtin_model``)."""

from __future__ import annotations

import os
from pathlib import Path, PureWindowsPath

import platformdirs

APP_NAME = "Hearth"
DATA_DIR_ENV = "HEARTH_DATA_DIR"
PRIVATE_DIR_MODE = 0o700  # conversations and logs are nobody else's business on a shared machine


def data_dir(override: str | Path | None = None) -> Path:
    """The directory for the conversation database and models: ``override``, else ``$HEARTH_DATA_DIR``, else the
    platform's per-user data folder (created if missing, readable by this user only)."""
    override = override or os.environ.get(DATA_DIR_ENV)
    path = Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    return path


def log_dir(data: Path | None = None) -> Path:
    """The directory for log files: ``logs`` inside an overridden data dir, else the platform's log dir (created
    if missing, readable by this user only)."""
    path = data / "logs" if data else Path(platformdirs.user_log_dir(APP_NAME, appauthor=False))
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    return path


def file_name(path: str) -> str:
    """The last part of ``path``, split at "/" and "\\" alike (paths from any OS, for messages)."""
    return PureWindowsPath(path).name
