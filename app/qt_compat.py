"""Work-arounds for defects of the installed Qt binding, detected by behaviour at import (not by version)."""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, Signal


class _Probe(QObject):
    """Signals:
        fired(): emitted to measure the binding.
    """

    fired = Signal()


def _emit_drops_a_reference_to_true() -> bool:
    # PySide6 6.12.0 returns True from SignalInstance.emit() without a new reference, so every emit from Python
    # whose result is discarded takes one reference from True; after a few hundred the interpreter aborts.
    probe = _Probe()
    before = sys.getrefcount(True)
    for _ in range(8):
        probe.fired.emit()
    lost = before - sys.getrefcount(True)
    if lost > 0:
        for _ in range(lost):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(True))
    return lost >= 8


EMIT_DROPS_TRUE = _emit_drops_a_reference_to_true()


def emit(signal, *args) -> None:
    """``signal.emit(*args)``, giving back the reference the binding takes from True when it has that defect.

    Connections of signal to signal run in C++ and need none of this; only emits from Python go through here.
    """
    signal.emit(*args)
    if EMIT_DROPS_TRUE:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(True))
