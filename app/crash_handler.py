"""Unhandled errors: a crash report in the log folder, faulthandler for hard crashes, and an offer to open the folder.

``CrashHandler.install()`` takes over ``sys.excepthook`` (which PySide6 also calls for exceptions raised in slots,
on any thread) and ``threading.excepthook``, and points ``faulthandler`` at ``faults.log`` so a segfault or an
abort in native code still leaves the Python stacks of every thread behind. A fault file left by the previous run
is turned into a crash report at start-up. When a QApplication exists, the person is told in a QMessageBox and
may open the log folder; the prompt and the folder opener are parameters so tests can fake them.
"""

from __future__ import annotations

import datetime
import faulthandler
import logging
import os
import platform
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

FAULT_LOG = "faults.log"
REPORT_PREFIX = "crash-"

log = logging.getLogger(__name__)


class CrashHandler:
    """Writes a report for every unhandled exception and shows one dialog at a time on the GUI thread.

    Args:
        log_dir: where reports and ``faults.log`` go (the folder the dialog offers to open).
        version: the app version written into each report.
        prompt: shows the report to the person; returns True when they asked to open the log folder.
            None means never ask (smoke tests, CI, no display). ``ask_to_open_log_folder`` is the real one.
        open_folder: opens a folder in the desktop's file manager.
    """

    def __init__(self, log_dir: Path, version: str, prompt: Callable[[Path], bool] | None = None,
                 open_folder: Callable[[Path], None] | None = None):
        self.log_dir = Path(log_dir)
        self.version = version
        self.prompt = prompt
        self.open_folder = open_folder or open_in_file_manager
        self.reports: list[Path] = []
        self._showing = False
        self._fault_file = None
        self._bridge = None
        self._previous_hooks = None

    def install(self) -> CrashHandler:
        """Take over the exception hooks and faulthandler; returns self."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.keep_previous_fault()
        self._fault_file = open(self.log_dir / FAULT_LOG, "w", encoding="utf-8")  # noqa: SIM115 - open for the run
        faulthandler.enable(self._fault_file, all_threads=True)
        self._previous_hooks = (sys.excepthook, threading.excepthook)
        sys.excepthook = self.handle_exception
        threading.excepthook = self.handle_thread_exception
        if self.prompt is not None:
            self._bridge = _make_bridge(self._show)
        return self

    def uninstall(self) -> None:
        """Give the hooks back and close ``faults.log`` (an empty one is removed)."""
        if self._previous_hooks:
            sys.excepthook, threading.excepthook = self._previous_hooks
            self._previous_hooks = None
        if self._fault_file:
            faulthandler.disable()
            self._fault_file.close()
            path = Path(self._fault_file.name)
            if path.exists() and path.stat().st_size == 0:
                path.unlink()
            self._fault_file = None

    def keep_previous_fault(self) -> Path | None:
        """Turn a non-empty ``faults.log`` of an earlier run (a hard crash) into a crash report."""
        faults = self.log_dir / FAULT_LOG
        if not faults.is_file() or faults.stat().st_size == 0:
            return None
        stamp = datetime.datetime.fromtimestamp(faults.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
        report = self.log_dir / f"{REPORT_PREFIX}{stamp}-fault.txt"
        faults.replace(report)
        log.warning("the previous run crashed in native code; its stacks are in %s", report.name)
        return report

    # -- the hooks --------------------------------------------------------------------------------
    def handle_exception(self, exc_type: type[BaseException], exc: BaseException,
                         tb: TracebackType | None) -> None:
        """``sys.excepthook``: report, then tell the person (Ctrl+C in a terminal stays quiet)."""
        if issubclass(exc_type, KeyboardInterrupt):
            sys.__excepthook__(exc_type, exc, tb)
            return
        self._report(exc_type, exc, tb, threading.current_thread().name)

    def handle_thread_exception(self, args: threading.ExceptHookArgs) -> None:
        """``threading.excepthook``: the same for exceptions that end a ``threading.Thread``."""
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread else "unknown thread"
        self._report(args.exc_type, args.exc_value, args.exc_traceback, name)

    def _report(self, exc_type, exc, tb, thread_name: str) -> None:
        try:
            path = self.write_report(exc_type, exc, tb, thread_name)
        except OSError as e:  # a full or read-only disk: stderr is all that is left
            print(f"Hearth: could not write a crash report ({e})", file=sys.stderr)
            traceback.print_exception(exc_type, exc, tb)
            return
        log.critical("unhandled %s in %s; report: %s", exc_type.__name__, thread_name, path.name)
        print(f"Hearth: unhandled {exc_type.__name__}; the report is in {path}", file=sys.stderr)
        if self._bridge is not None:
            self._bridge.report_ready.emit(str(path))  # queued to the GUI thread when raised elsewhere

    def write_report(self, exc_type, exc, tb, thread_name: str) -> Path:
        """Write one crash report; returns its path."""
        now = datetime.datetime.now()
        path = self.log_dir / f"{REPORT_PREFIX}{now:%Y%m%d-%H%M%S}-{os.getpid()}-{len(self.reports)}.txt"
        header = [
            f"Hearth {self.version} crash report, {now.isoformat(timespec='seconds')}",
            f"platform: {platform.platform()} ({platform.machine()})",
            f"python: {sys.version.split()[0]}; frozen: {bool(getattr(sys, 'frozen', False))}",
            f"thread: {thread_name}",
            "",
        ]
        body = "".join(traceback.format_exception(exc_type, exc, tb))
        path.write_text("\n".join(header) + body, encoding="utf-8")
        self.reports.append(path)
        return path

    def _show(self, report: str) -> None:
        if self._showing or self.prompt is None or not _has_widget_app():
            return
        self._showing = True  # an error raised while the dialog runs its own event loop gets a report, no 2nd dialog
        try:
            if self.prompt(Path(report)):
                self.open_folder(self.log_dir)
        finally:
            self._showing = False


def _make_bridge(show: Callable[[str], None]):
    """A QObject on the current (GUI) thread whose signal carries report paths to ``show`` there."""
    from PySide6.QtCore import QObject, Signal

    class ReportBridge(QObject):
        """Moves crash reports to the GUI thread.

        Signals:
            report_ready(str): a report was written (emitted on any thread, delivered on the GUI thread).
        """

        report_ready = Signal(str)

    bridge = ReportBridge()
    bridge.report_ready.connect(show)
    return bridge


def _has_widget_app() -> bool:
    if "PySide6.QtWidgets" not in sys.modules:
        return False
    from PySide6.QtWidgets import QApplication

    return isinstance(QApplication.instance(), QApplication)


def ask_to_open_log_folder(report: Path) -> bool:
    """The real prompt: a QMessageBox naming the report, with an "Open Log Folder" button."""
    from PySide6.QtWidgets import QMessageBox

    box = QMessageBox(QMessageBox.Icon.Critical, "Hearth", "Hearth ran into a problem it did not expect.")
    box.setInformativeText(f"A report was saved as {report.name} in the log folder. Hearth may keep working, "
                           "but restarting it is safest.")
    open_button = box.addButton("Open Log Folder", QMessageBox.ButtonRole.ActionRole)
    box.addButton(QMessageBox.StandardButton.Close)
    box.exec()
    return box.clickedButton() is open_button


def open_in_file_manager(folder: Path) -> None:
    from PySide6.QtCore import QUrl
    from PySide6.QtGui import QDesktopServices

    QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))
