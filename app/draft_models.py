"""Which library models can draft for a model: the engine's vocabulary check, remembered per pair of files.

No Qt. Reading a GGUF's tokenizer takes 0.1-0.6 s for a 50k-260k vocabulary, so an answer is kept while
neither file changes (path, size and modification time) and each file is read at most once per ``compatible``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from engine.config import ModelConfig
from engine.gguf_file import read_gguf
from engine.speculative import check_same_vocabulary
from engine.tokenizer import Tokenizer

from .model_choices import ModelChoice

FileKey = tuple[str, int, int]  # path, size, mtime_ns


class DraftCompatibility:
    """Answers whether one GGUF can draft for another, with ``engine.speculative.check_same_vocabulary``."""

    def __init__(self):
        self._problems: dict[tuple[FileKey, FileKey], str | None] = {}

    def problem(self, target: str, draft: str) -> str | None:
        """Why ``draft`` cannot draft for ``target`` (a readable reason), or None when it can."""
        return self._problem(target, draft, {})

    def compatible(self, target: str, choices: Iterable[ModelChoice]) -> list[ModelChoice]:
        """The usable ``choices`` that can draft for ``target``, in their order (``target`` itself left out:
        drafting with the model being verified is never faster)."""
        vocabularies: dict[str, tuple] = {}  # each file is read once here even when many pairs are new
        return [c for c in choices if c.usable and c.path != target
                and self._problem(target, c.path, vocabularies) is None]

    def _problem(self, target: str, draft: str, vocabularies: dict[str, tuple]) -> str | None:
        if target == draft:
            return None  # a token id always means the same to a model as to itself
        try:
            key = (_file_key(target), _file_key(draft))
        except OSError as exc:
            return f"cannot read {exc.filename}: {exc.strerror or exc}"
        if key not in self._problems:
            try:
                check_same_vocabulary(*_vocabulary(target, vocabularies), *_vocabulary(draft, vocabularies))
                self._problems[key] = None
            except Exception as exc:  # noqa: BLE001 - a file that cannot be read cannot draft; the reason is kept
                self._problems[key] = str(exc).strip() or type(exc).__name__
        return self._problems[key]


def _file_key(path: str) -> FileKey:
    st = os.stat(path)
    return path, st.st_size, st.st_mtime_ns


def _vocabulary(path: str, vocabularies: dict[str, tuple]) -> tuple[Tokenizer, ModelConfig]:
    if path not in vocabularies:
        with read_gguf(path) as gguf:
            vocabularies[path] = (Tokenizer.from_gguf(gguf), ModelConfig.from_gguf(gguf))
    return vocabularies[path]
