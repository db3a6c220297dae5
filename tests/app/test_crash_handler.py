"""The crash handler: reports for unhandled exceptions on any thread, one dialog at a time, hard crashes kept."""

import faulthandler
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from app.crash_handler import FAULT_LOG, REPORT_PREFIX, CrashHandler, ask_to_open_log_folder

ROOT = Path(__file__).resolve().parents[2]


class FakePrompt:
    """Stands in for the QMessageBox: records the reports it was shown and answers ``answer``."""

    def __init__(self, answer=True, on_call=None):
        self.answer, self.on_call, self.reports, self.threads = answer, on_call, [], []

    def __call__(self, report: Path) -> bool:
        self.reports.append(report)
        self.threads.append(threading.current_thread())
        if self.on_call:
            self.on_call()
        return self.answer


@pytest.fixture
def installed(qtbot, tmp_path):
    """A handler installed with a fake prompt and folder opener; uninstalled (hooks restored) afterwards."""
    handlers = []

    def install(answer=True, on_call=None):
        opened = []
        handler = CrashHandler(tmp_path / "logs", "9.9.9", prompt=FakePrompt(answer, on_call),
                               open_folder=opened.append).install()
        handler.opened = opened
        handlers.append(handler)
        return handler

    hooks = (sys.excepthook, threading.excepthook, faulthandler.is_enabled())
    yield install
    for handler in handlers:
        handler.uninstall()
    assert (sys.excepthook, threading.excepthook) == hooks[:2]
    if hooks[2]:
        faulthandler.enable(sys.__stderr__)


def _raise(exc: BaseException):
    try:
        raise exc
    except BaseException:  # noqa: BLE001 - the test hands the exception to the hook itself
        return sys.exc_info()


def test_install_takes_over_both_hooks_and_uninstall_gives_them_back(installed):
    handler = installed()
    assert sys.excepthook == handler.handle_exception
    assert threading.excepthook == handler.handle_thread_exception
    assert (handler.log_dir / FAULT_LOG).is_file() and faulthandler.is_enabled()
    handler.uninstall()
    assert not (handler.log_dir / FAULT_LOG).exists()  # empty: nothing crashed


def test_exception_writes_a_report_and_offers_the_folder(installed):
    handler = installed(answer=True)
    sys.excepthook(*_raise(ValueError("the thing broke")))
    (report,) = handler.reports
    text = report.read_text()
    assert report.name.startswith(REPORT_PREFIX) and report.parent == handler.log_dir
    assert text.startswith("Hearth 9.9.9 crash report")
    assert "ValueError: the thing broke" in text and "_raise" in text
    assert handler.prompt.reports == [report]
    assert handler.opened == [handler.log_dir]


def test_declining_the_dialog_opens_nothing(installed):
    handler = installed(answer=False)
    sys.excepthook(*_raise(RuntimeError("x")))
    assert len(handler.prompt.reports) == 1 and handler.opened == []


def test_an_error_while_the_dialog_is_open_is_reported_without_a_second_dialog(installed):
    handler = installed(on_call=lambda: sys.excepthook(*_raise(KeyError("again"))))
    sys.excepthook(*_raise(ValueError("first")))
    assert len(handler.reports) == 2
    assert len(handler.prompt.reports) == 1
    assert "KeyError: 'again'" in handler.reports[1].read_text()


def test_keyboard_interrupt_is_not_a_crash(installed, capsys):
    handler = installed()
    sys.excepthook(*_raise(KeyboardInterrupt()))
    assert handler.reports == [] and handler.prompt.reports == []


def test_thread_exception_is_reported_and_the_dialog_runs_on_the_gui_thread(installed, qtbot):
    handler = installed()

    def work():
        raise OSError("disk on fire")

    thread = threading.Thread(target=work, name="downloader")
    thread.start()
    thread.join()
    qtbot.waitUntil(lambda: len(handler.prompt.reports) > 0, timeout=5000)
    (report,) = handler.reports
    assert "thread: downloader" in report.read_text() and "OSError: disk on fire" in report.read_text()
    assert handler.prompt.threads == [threading.main_thread()]


def test_exception_in_a_qt_slot_reaches_the_handler(installed, qtbot):
    handler = installed()

    def slot():
        raise ZeroDivisionError("in a slot")

    QTimer.singleShot(0, slot)
    qtbot.waitUntil(lambda: len(handler.reports) > 0, timeout=5000)
    assert "ZeroDivisionError: in a slot" in handler.reports[0].read_text()


def test_without_a_prompt_only_the_report_is_written(qtbot, tmp_path):
    handler = CrashHandler(tmp_path, "1.0", prompt=None)
    path = handler.write_report(*_raise(ValueError("quiet")), "MainThread")
    handler._report(*_raise(ValueError("quiet")), "MainThread")
    assert path.is_file() and len(handler.reports) == 2


@pytest.mark.gui
@pytest.mark.qt_log_ignore("does not support propagateSizeHints")  # the offscreen plugin
def test_real_prompt_returns_true_when_open_log_folder_is_clicked(qtbot, tmp_path):
    def click_open():
        box = QApplication.activeModalWidget()
        assert isinstance(box, QMessageBox)
        assert "crash-x.txt" in box.informativeText()
        (button,) = [b for b in box.buttons() if b.text() == "Open Log Folder"]
        button.click()

    QTimer.singleShot(50, click_open)
    assert ask_to_open_log_folder(tmp_path / "crash-x.txt") is True


@pytest.mark.gui
@pytest.mark.qt_log_ignore("does not support propagateSizeHints")  # the offscreen plugin
def test_real_prompt_returns_false_when_closed(qtbot, tmp_path):
    QTimer.singleShot(50, lambda: QApplication.activeModalWidget().button(QMessageBox.StandardButton.Close).click())
    assert ask_to_open_log_folder(tmp_path / "crash-y.txt") is False


def _run_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen"}
    env.pop("PYTHONFAULTHANDLER", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_uncaught_exception_at_top_level_leaves_a_report(tmp_path):
    result = _run_python(f"""
        from pathlib import Path
        from app.crash_handler import CrashHandler
        CrashHandler(Path({str(tmp_path / 'logs')!r}), "1.2.3").install()
        raise RuntimeError("start-up went wrong")
    """, tmp_path)
    assert result.returncode == 1
    (report,) = (tmp_path / "logs").glob(f"{REPORT_PREFIX}*.txt")
    assert "RuntimeError: start-up went wrong" in report.read_text()
    assert str(report) in result.stderr


def test_hard_crash_stacks_are_kept_and_become_a_report_at_the_next_start(qtbot, tmp_path):
    logs = tmp_path / "logs"
    result = _run_python(f"""
        import faulthandler
        from pathlib import Path
        from app.crash_handler import CrashHandler
        CrashHandler(Path({str(logs)!r}), "1.2.3").install()
        def deep_in_native_code():
            faulthandler._sigsegv()
        deep_in_native_code()
    """, tmp_path)
    assert result.returncode == -signal.SIGSEGV
    assert "deep_in_native_code" in (logs / FAULT_LOG).read_text()
    handler = CrashHandler(logs, "1.2.3")
    kept = handler.keep_previous_fault()
    assert kept is not None and kept.name.endswith("-fault.txt")
    assert "Segmentation fault" in kept.read_text() and not (logs / FAULT_LOG).exists()
    assert handler.keep_previous_fault() is None
