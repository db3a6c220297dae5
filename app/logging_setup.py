"""Hearth's log file: rotating, in the platform's log directory, and without conversation text unless debugging.

Privacy rule: what the user types and what the model answers is wrapped in ``Private`` before it reaches a log
call (``log.info("sent %s", Private(text))``). The file handler writes such arguments as ``<private: N chars>``
unless debug logging is on (``HEARTH_DEBUG=1``), and debug records themselves are dropped unless it is on.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from pathlib import Path

LOG_FILENAME = "hearth.log"
MAX_BYTES = 2 * 1024 * 1024
BACKUP_COUNT = 4
DEBUG_ENV = "HEARTH_DEBUG"
FORMAT = "%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"


class Private:
    """Text that may be logged only when debug logging is on (conversation content, prompts, file contents)."""

    __slots__ = ("text",)

    def __init__(self, text: object):
        self.text = text

    def __str__(self) -> str:
        return str(self.text)

    def __repr__(self) -> str:
        return repr(self.text)


class RedactPrivate(logging.Filter):
    """Replaces ``Private`` arguments of a record with their length, unless ``reveal`` is set."""

    def __init__(self, reveal: bool):
        super().__init__()
        self.reveal = reveal

    def filter(self, record: logging.LogRecord) -> bool:
        if self.reveal:
            return True
        record.msg = _redacted(record.msg)
        if isinstance(record.args, dict):
            record.args = {k: _redacted(v) for k, v in record.args.items()}
        elif record.args:
            record.args = tuple(_redacted(v) for v in record.args)
        return True


def _redacted(value: object) -> object:
    return f"<private: {len(str(value.text))} chars>" if isinstance(value, Private) else value


def debug_requested(environ: dict[str, str] | None = None) -> bool:
    """True when ``HEARTH_DEBUG`` is set to something other than empty or 0."""
    value = (os.environ if environ is None else environ).get(DEBUG_ENV, "")
    return value not in ("", "0")


def setup_logging(directory: Path, debug: bool = False, root: logging.Logger | None = None,
                  max_bytes: int = MAX_BYTES, backup_count: int = BACKUP_COUNT) -> Path:
    """Send log records of ``root`` (the root logger by default) to a rotating file in ``directory``.

    Args:
        directory: the log directory (created if missing); ``app.paths.log_dir`` gives the platform's one.
        debug: log DEBUG records and the text wrapped in ``Private`` too.
        root: the logger to configure; tests pass their own.
        max_bytes: the size at which the file is rotated (hearth.log → hearth.log.1 → ...).
        backup_count: how many rotated files are kept.

    Returns:
        The path of the current log file.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOG_FILENAME
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backup_count,
                                                   encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(RedactPrivate(reveal=debug))
    logger = root or logging.getLogger()
    for old in [h for h in logger.handlers if getattr(h, "hearth_log", False)]:
        logger.removeHandler(old)
        old.close()
    handler.hearth_log = True  # so a second call replaces it instead of writing every line twice
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    logging.captureWarnings(True)
    return path
