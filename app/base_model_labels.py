"""Which model is a base model (no chat template), for the window's label: known at once from the loaded model's
facts or the metadata cache, else read from the file on a worker thread so the GUI thread never parses a GGUF."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal, Slot

from .model_choices import ModelChoices
from .qt_compat import emit


class BaseModelLabels(QObject):
    """Answers "is the model at this path a base model?" without blocking; a file not known yet is read off the
    GUI thread and ``learned`` follows.

    Signals:
        learned(str): the answer for this path became known (it was read from the file).
        _read(str, bool): a worker thread's answer, delivered queued to the GUI thread.
    """

    learned = Signal(str)
    _read = Signal(str, bool)

    def __init__(self, choices: ModelChoices, parent: QObject | None = None):
        super().__init__(parent)
        self.choices = choices
        self._known: dict[str | None, bool] = {}
        self._reading: set[str] = set()
        self.threads: list[threading.Thread] = []
        self._read.connect(self._on_read)

    def is_base_model(self, path: str | None, loaded: dict) -> bool:
        """The answer if known (``loaded`` is the loaded model's info), else False until ``learned(path)``."""
        if path in self._known:
            return self._known[path]
        try:
            known = self.choices.base_model_if_known(path, loaded)
        except Exception:  # noqa: BLE001 - an unreadable cache or file is reported elsewhere; no label then
            known = False
        if known is not None:
            self._known[path] = known
            return known
        if path not in self._reading:
            self._reading.add(path)
            thread = threading.Thread(target=self._read_file, args=(path,), name="hearth-base-model", daemon=True)
            self.threads.append(thread)
            thread.start()
        return False

    def _read_file(self, path: str) -> None:
        try:
            answer = self.choices.is_base_model(path)
        except Exception:  # noqa: BLE001 - an unreadable file is reported when it loads; no label then
            answer = False
        emit(self._read, path, answer)

    @Slot(str, bool)
    def _on_read(self, path: str, answer: bool) -> None:
        self._reading.discard(path)
        self._known[path] = answer
        emit(self.learned, path)
