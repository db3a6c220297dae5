"""``HEARTH_STARTUP_PROBE=1``: print the moment the main window first paints, so start-up can be timed from outside.

The line is ``hearth-startup-probe window-painted epoch=<time.time()> since_process_start=<seconds>``; a harness
compares ``epoch`` with the wall clock it read just before launching (packaging/measure_startup.py does).
``HEARTH_STARTUP_PROBE=quit`` also quits right after, for repeated measurements.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QTimer, Signal
from PySide6.QtWidgets import QApplication, QWidget

PROBE_ENV = "HEARTH_STARTUP_PROBE"
PREFIX = "hearth-startup-probe"


def probe_mode(environ: dict[str, str] | None = None) -> str | None:
    """"print", "quit" or None (no probe) from ``HEARTH_STARTUP_PROBE``."""
    value = (os.environ if environ is None else environ).get(PROBE_ENV, "")
    if value in ("", "0"):
        return None
    return "quit" if value == "quit" else "print"


def seconds_since_process_start() -> float | None:
    """How long this process has run, from the OS; None when it cannot tell.

    On Linux from the start time in /proc (clock ticks since boot) against CLOCK_BOOTTIME, which is exact to a
    tick; psutil's create_time elsewhere (on Linux it rounds the boot time to whole seconds).
    """
    try:
        if sys.platform.startswith("linux"):
            fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
            started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat(5), counted after "(comm)"
            return time.clock_gettime(time.CLOCK_BOOTTIME) - started
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - the probe is a measurement aid and must never stop the app
        return None


class StartupProbe(QObject):
    """Watches a window for its first paint event and reports it once.

    Signals:
        painted(float): the epoch time of the window's first paint.
    """

    painted = Signal(float)

    def __init__(self, window: QWidget, quit_after: bool = False, out=None):
        super().__init__(window)
        self.quit_after = quit_after
        self.out = out or sys.stdout
        self.reported = False
        window.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if not self.reported and event.type() == QEvent.Type.Paint:
            self.reported = True
            watched.removeEventFilter(self)
            self._report(time.time())
        return False

    def _report(self, now: float) -> None:
        running = seconds_since_process_start()
        since = f"{running:.3f}" if running is not None else "unknown"
        print(f"{PREFIX} window-painted epoch={now:.6f} since_process_start={since}", file=self.out, flush=True)
        self.painted.emit(now)
        if self.quit_after:
            QTimer.singleShot(0, QApplication.quit)
