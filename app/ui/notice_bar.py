"""A slim banner at the top of the chat for errors, warnings and undo offers."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from ..qt_compat import emit
from .theme import icon

AUTO_HIDE_MS = {"info": 8000, "warning": 15000, "error": 0}  # errors stay until closed


class NoticeBar(QFrame):
    """Shows one notice at a time, optionally with an action button.

    Signals:
        action_triggered(): the action button (e.g. Undo) was pressed.
    """

    action_triggered = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("noticeBar")
        self.kind = "info"
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.action = QPushButton()
        self.action.clicked.connect(self._act)
        self.close_button = QToolButton()
        self.close_button.setAutoRaise(True)
        self.close_button.setToolTip("Dismiss")
        self.close_button.setIcon(icon("close"))
        self.close_button.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 6, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action)
        layout.addWidget(self.close_button)
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.hide)
        self.hide()

    def show_notice(self, kind: str, text: str, action: str | None = None) -> None:
        self.kind = kind if kind in AUTO_HIDE_MS else "info"
        self.setProperty("kind", self.kind)
        self.style().unpolish(self)
        self.style().polish(self)
        self.label.setText(text)
        self.action.setText(action or "")
        self.action.setVisible(bool(action))
        self.show()
        delay = 10000 if action else AUTO_HIDE_MS[self.kind]
        if delay:
            self._timer.start(delay)
        else:
            self._timer.stop()

    def _act(self) -> None:
        self.hide()
        emit(self.action_triggered)

