"""First start: assemble the built-in model from its part packages on a background thread, reporting progress."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, QThread, Signal, Slot

from .builtin_model import AssemblyCancelled, BuiltinModel, BuiltinModelError
from .qt_compat import emit

PROGRESS_STEPS = 200  # signals per assembly at most: the GUI needs no more than one per half percent


class _AssemblyWorker(QObject):
    """Runs ``BuiltinModel.ensure`` on the assembly thread.

    Signals:
        progress(object, object): bytes written and total bytes.
        done(str): the verified file's path.
        failed(str): why it could not be assembled, in words for the user.
    """

    progress = Signal(object, object)
    done = Signal(str)
    failed = Signal(str)

    def __init__(self, builtin: BuiltinModel, stop: threading.Event):
        super().__init__()
        self.builtin = builtin
        self.stop = stop
        self._last_step = -1

    @Slot()
    def run(self) -> None:
        try:
            path = self.builtin.ensure(self._progress, self.stop.is_set)
        except AssemblyCancelled:
            return
        except BuiltinModelError as e:
            emit(self.failed, str(e))
        except Exception as e:  # noqa: BLE001 - a failure here must reach the window, not kill the thread silently
            emit(self.failed, f"{type(e).__name__}: {e}")
        else:
            emit(self.done, str(path))

    def _progress(self, done: int, total: int) -> None:
        step = done * PROGRESS_STEPS // max(total, 1)
        if step != self._last_step:
            self._last_step = step
            emit(self.progress, done, total)


class BuiltinAssembly(QObject):
    """Owns the assembly thread; the window shows ``progress`` and the session loads the model on ``finished``.

    Signals:
        progress(object, object): bytes written and total bytes.
        finished(str): the built-in model's verified path.
        failed(str): why it could not be assembled.
    """

    progress = Signal(object, object)
    finished = Signal(str)
    failed = Signal(str)

    def __init__(self, builtin: BuiltinModel, parent: QObject | None = None):
        super().__init__(parent)
        self.builtin = builtin
        self._stop = threading.Event()
        self._thread: QThread | None = None
        self._worker: _AssemblyWorker | None = None

    def start(self) -> None:
        """Start assembling on a new thread (once)."""
        if self._thread is not None:
            return
        self._thread = QThread()
        self._thread.setObjectName("hearth-builtin-assembly")
        self._worker = _AssemblyWorker(self.builtin, self._stop)
        self._worker.moveToThread(self._thread)
        self._worker.progress.connect(self.progress)
        self._worker.done.connect(self._on_done)
        self._worker.failed.connect(self._on_failed)
        self._thread.started.connect(self._worker.run)
        self._thread.start()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.isRunning()

    def stop(self) -> None:
        """Cancel (the partial file is removed) and wait for the thread to end."""
        self._stop.set()
        self._end_thread()

    def _on_done(self, path: str) -> None:
        self._end_thread()
        emit(self.finished, path)

    def _on_failed(self, message: str) -> None:
        self._end_thread()
        emit(self.failed, message)

    def _end_thread(self) -> None:
        if self._thread is not None:
            self._thread.quit()
            self._thread.wait()
            self._thread = None
            self._worker = None
