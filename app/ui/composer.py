"""The message box: Enter sends, Shift+Enter adds a line; its button sends or stops. A long paste goes in slice by
slice, one per event-loop turn, so the window never waits on laying out all of it at once."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QProgressBar, QSizePolicy, QToolButton,
                               QVBoxLayout, QWidget)

from ..qt_compat import emit
from .theme import icon

MAX_LINES = 8
PASTE_SLICE_CHARS = 32_000  # inserted and laid out in a few ms; a longer paste goes in over several event-loop turns


class MessageEdit(QPlainTextEdit):
    """A plain-text box that grows with its text up to a few lines.

    Signals:
        submitted(): Enter (without Shift) was pressed.
        escape_pressed(): Esc was pressed.
        pasted(): a paste is all in (a long one goes in slice by slice; the box is read-only meanwhile).
    """

    submitted = Signal()
    escape_pressed = Signal()
    pasted = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setTabChangesFocus(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.viewport().setAutoFillBackground(False)
        self._unpasted = ""  # the rest of a long paste, going in slice by slice
        self._paste_cursor = self.textCursor()
        self._fit()

    def keyPressEvent(self, event) -> None:  # noqa: N802
        if event.key() == Qt.Key.Key_Escape:  # reaches here when the window's Esc shortcut did not take it
            emit(self.escape_pressed)
            return
        if self.is_pasting():  # nothing is typed or sent into half a paste
            return
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            emit(self.submitted)
            return
        if enter:  # Shift+Enter: a new line (QPlainTextEdit would insert a line separator instead)
            self.insertPlainText("\n")
            return
        super().keyPressEvent(event)

    def insertFromMimeData(self, source) -> None:  # noqa: N802 - Qt override
        text = source.text() if source.hasText() else ""
        if len(text) <= PASTE_SLICE_CHARS or self.is_pasting():
            super().insertFromMimeData(source)
            emit(self.pasted)
            return
        self._paste_cursor, self._unpasted = self.textCursor(), text
        self.setReadOnly(True)
        self._paste_slice(first=True)

    def is_pasting(self) -> bool:
        """Whether a long paste is still going in."""
        return bool(self._unpasted)

    def _paste_slice(self, first: bool = False) -> None:
        piece, self._unpasted = self._unpasted[:PASTE_SLICE_CHARS], self._unpasted[PASTE_SLICE_CHARS:]
        cursor = self._paste_cursor
        if first:  # each slice in its own edit block (one block would defer all layout to its end), undone as one
            cursor.beginEditBlock()
        else:
            cursor.joinPreviousEditBlock()
        cursor.insertText(piece)
        cursor.endEditBlock()
        if self._unpasted:
            QTimer.singleShot(0, self, self._paste_slice)
            return
        self.setReadOnly(False)
        self.setTextCursor(cursor)
        emit(self.pasted)

    def _fit(self, *_) -> None:
        document = self.document()
        # every block is one line or more: a long paste is MAX_LINES without laying out all of its lines
        lines = MAX_LINES if document.blockCount() >= MAX_LINES else min(max(1, document.lineCount()), MAX_LINES)
        margins = self.contentsMargins()
        height = lines * self.fontMetrics().lineSpacing() + 2 * int(self.document().documentMargin()) \
            + margins.top() + margins.bottom() + 4
        self.setFixedHeight(height)


class Composer(QFrame):
    """The box to write in, the Send/Stop button, and the context meter under it.

    Signals:
        send_requested(str): the text to send (already stripped, never empty).
        stop_requested(): the user wants the answer to stop.
    """

    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.generating = False
        self.edit = MessageEdit()
        self.edit.setPlaceholderText("Message Hearth…  (Shift+Enter for a new line)")
        self.edit.setAccessibleName("Message")
        self.edit.submitted.connect(self._on_submit)
        self.edit.textChanged.connect(self._update_button)
        self.edit.escape_pressed.connect(lambda: emit(self.stop_requested) if self.generating else None)
        self.button = QToolButton()
        self.button.setObjectName("sendButton")
        self.button.setIconSize(QSize(18, 18))
        self.button.setFixedSize(36, 36)
        self.button.clicked.connect(self._on_button)
        box = QFrame()
        box.setObjectName("composerBox")
        row = QHBoxLayout(box)
        row.setContentsMargins(10, 6, 6, 6)
        row.addWidget(self.edit, 1)
        row.addWidget(self.button, 0, Qt.AlignmentFlag.AlignBottom)
        self.meter = QProgressBar()
        self.meter.setObjectName("contextMeter")
        self.meter.setTextVisible(False)
        self.meter.setFixedHeight(4)
        self.meter.setFixedWidth(90)
        self.meter_label = QLabel()
        self.meter_label.setObjectName("meterLabel")
        self.model_label = QLabel()
        self.model_label.setObjectName("meterLabel")
        self.model_label.setMinimumWidth(1)  # clipped, not overlapping the meter, in a narrow window
        footer = QHBoxLayout()
        footer.setContentsMargins(6, 0, 6, 0)
        footer.addWidget(self.model_label)
        footer.addStretch(1)
        footer.addWidget(self.meter_label)
        footer.addWidget(self.meter)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 6, 16, 10)
        layout.setSpacing(4)
        layout.addWidget(box)
        layout.addLayout(footer)
        self.set_generating(False)
        self.set_context_usage(0, 0)

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self.button.setToolTip("Stop the answer (Esc)" if generating else "Send (Enter)")
        self.button.setAccessibleName("Stop" if generating else "Send")
        self.button.setIcon(icon("stop" if generating else "send", "on_accent"))
        self._update_button()

    def set_context_usage(self, used: int, n_ctx: int, reply_room: int = 0) -> None:
        """Show ``used`` of the ``n_ctx`` tokens (the context length the settings show), of which ``reply_room``
        stay free for the reply: a message must fit in the rest."""
        self.meter.setRange(0, max(n_ctx, 1))
        self.meter.setValue(min(used, max(n_ctx, 1)))
        share = used / n_ctx if n_ctx else 0.0
        room = f" ({reply_room:,} for the reply)" if reply_room else ""
        self.meter_label.setText(f"Context {used:,} / {n_ctx:,} tokens{room}" if n_ctx else "")
        tip = f"{share:.0%} of the context window is in use" if n_ctx else ""
        if n_ctx and reply_room:
            tip += (f". {reply_room:,} tokens stay free for the reply (its length limit, at most a quarter of the "
                    f"context), so the conversation can use {n_ctx - reply_room:,}; older messages are left out "
                    "when it needs more.")
        self.meter.setToolTip(tip)
        self.meter_label.setToolTip(tip)
        self.meter.setProperty("full", share > 0.85)

    def set_model_text(self, text: str) -> None:
        self.model_label.setText(text)
        self.model_label.setToolTip(text)  # the whole of it when a narrow window clips it

    def _update_button(self) -> None:
        # Stop is always there while answering; Send only when there is something to send
        self.button.setEnabled(self.generating or bool(self.edit.toPlainText().strip()))

    def _on_submit(self) -> None:
        if self.generating or self.edit.is_pasting():
            return
        text = self.edit.toPlainText().strip()
        if text:
            self.edit.clear()
            emit(self.send_requested, text)

    def _on_button(self) -> None:
        if self.generating:
            emit(self.stop_requested)
        else:
            self._on_submit()


