"""The emit work-around keeps True's reference count steady, whatever the installed PySide6 does."""

import sys

from PySide6.QtCore import QObject, Signal

from app.qt_compat import emit


class Emitter(QObject):
    """Signals:
        fired(int): test signal.
    """

    fired = Signal(int)


def test_many_emits_leave_the_reference_count_of_true_unchanged():
    source, got = Emitter(), []
    source.fired.connect(got.append)
    before = sys.getrefcount(True)
    for i in range(2000):
        emit(source.fired, i)
    lost = before - sys.getrefcount(True)  # computed outside the assert, whose rewriting holds references
    assert lost == 0 and got == list(range(2000))
