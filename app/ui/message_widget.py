"""One message in the chat: who said it, the rendered text, actions (copy, edit, delete, regenerate) and stats."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton, QVBoxLayout,
                               QWidget)

from ..qt_compat import emit
from ..speculation import speculation_text
from ..store import Message
from .markdown_view import MarkdownView
from .theme import icon

STATE_NOTES = {"stopped": "stopped", "interrupted": "interrupted — the app closed while answering"}


def stats_text(message: Message) -> str:
    """The line under an answer: tokens, time to first token, speed, speculative decoding, and how it ended."""
    s = message.stats
    parts = []
    if "generated_tokens" in s and "prefill_s" in s:
        parts.append(f"{s['generated_tokens']} tokens")
        parts.append(f"{s['prefill_s']:.2f} s to first token")
        if s.get("decode_tps"):
            parts.append(f"{s['decode_tps']:.1f} tok/s")
    if s.get("cached_tokens"):  # the KV cache of the history was reused (restored from a snapshot: where from)
        where = {"memory": "memory", "disk": "disk", "file": "a saved state"}.get(s.get("restored_from"))
        parts.append(f"{s['cached_tokens']:,} of {s.get('prompt_tokens', 0):,} prompt tokens cached"
                     + (f" (restored from {where})" if where else ""))
    drafted, accepted, speedup = s.get("drafted_tokens", 0), s.get("accepted_tokens", 0), s.get("speedup_estimate")
    # (an imported conversation's stats are kept as they came: show only well-formed figures)
    if s.get("speculation") and _is_count(drafted) and _is_count(accepted) and (speedup is None or _is_number(speedup)):
        parts.append(speculation_text(str(s["speculation"]), drafted, accepted, speedup))
    if s.get("finish_reason") in ("length", "context"):
        parts.append("hit the length limit" if s["finish_reason"] == "length" else "context full")
    if s.get("dropped"):
        parts.append(f"{s['dropped']} old messages left out")
    if message.state in STATE_NOTES:
        parts.append(STATE_NOTES[message.state])
    return " · ".join(parts)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value) -> bool:
    return _is_number(value) and value >= 0 and float(value).is_integer()


class MessageWidget(QFrame):
    """Shows one message and emits what the user wants done with it.

    Signals:
        edit_submitted(int, str): message id and the new text (user messages; resend from there).
        delete_requested(int): message id.
        regenerate_requested(): answer the last question again (shown on the last answer only).
        copied(int): message id whose text went to the clipboard.
    """

    edit_submitted = Signal(int, str)
    delete_requested = Signal(int)
    regenerate_requested = Signal()
    copied = Signal(int)

    def __init__(self, message: Message, assistant_name: str = "Assistant", parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self.setObjectName("userMessage" if message.role == "user" else "assistantMessage")
        self._author = QLabel("You" if message.role == "user" else assistant_name)
        self._author.setObjectName("author")
        self._author.setMinimumWidth(1)  # a long model name is clipped rather than widening the chat
        self.body = MarkdownView()
        self._stats = QLabel()
        self._stats.setObjectName("stats")
        self._stats.setWordWrap(True)
        self._error = QLabel()
        self._error.setObjectName("messageError")
        self._error.setWordWrap(True)
        self._error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._editor: QWidget | None = None
        self.copy_button = self._tool("copy", "Copy the message", self._copy)
        self.edit_button = self._tool("edit", "Edit and send again", self.start_editing)
        self.regenerate_button = self._tool("regenerate", "Regenerate the answer", self.regenerate_requested)
        self.delete_button = self._tool("delete", "Delete the message",
                                        lambda: emit(self.delete_requested, self.message.id))
        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.setSpacing(2)
        header.addWidget(self._author)
        header.addStretch(1)
        for button in (self.copy_button, self.edit_button, self.regenerate_button, self.delete_button):
            header.addWidget(button)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(14, 8, 14, 10)
        self._layout.setSpacing(4)
        self._layout.addLayout(header)
        self._layout.addWidget(self.body)
        self._layout.addWidget(self._error)
        self._layout.addWidget(self._stats)
        self.edit_button.setVisible(message.role == "user")
        self.regenerate_button.setVisible(False)
        self.set_message(message)

    def _tool(self, name: str, tip: str, slot) -> QToolButton:
        button = QToolButton()
        button.setObjectName(name)
        button.setAutoRaise(True)
        button.setToolTip(tip)
        button.setAccessibleName(tip)
        button.setIcon(icon(name, "muted"))
        button.clicked.connect(slot)
        return button

    def set_message(self, message: Message, streaming: bool = False) -> None:
        self.message = message
        text = message.content
        if streaming and not text:
            text = "*Thinking…*"
        self.body.set_markdown(text)
        self.body.setVisible(bool(text))
        error = message.stats.get("error") if message.state == "error" else None
        self._error.setText(f"Could not answer: {error}" if error else "")
        self._error.setVisible(bool(error))
        stats = "" if streaming else stats_text(message)
        self._stats.setText(stats)
        self._stats.setVisible(bool(stats))
        for button in (self.copy_button, self.edit_button, self.delete_button):
            button.setEnabled(not streaming)

    def set_author(self, assistant_name: str) -> None:
        if self.message.role == "assistant":
            self._author.setText(assistant_name)

    def set_regenerate_visible(self, visible: bool) -> None:
        self.regenerate_button.setVisible(visible)

    def set_text(self, text: str) -> None:
        """New streamed text for this (assistant) message."""
        self.body.set_markdown(text or "*Thinking…*")
        self.body.setVisible(True)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.message.content)
        emit(self.copied, self.message.id)

    # -- inline editing (user messages) ---------------------------------------------------------------
    def start_editing(self) -> None:
        if self._editor is not None:
            return
        editor = QWidget()
        box = QVBoxLayout(editor)
        box.setContentsMargins(0, 0, 0, 0)
        self.edit_box = QPlainTextEdit(self.message.content)
        self.edit_box.setMinimumHeight(80)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        cancel = QPushButton("Cancel")
        send = QPushButton("Save and send")
        send.setDefault(True)
        cancel.clicked.connect(self._stop_editing)
        send.clicked.connect(self._submit_edit)
        buttons.addWidget(cancel)
        buttons.addWidget(send)
        box.addWidget(self.edit_box)
        box.addLayout(buttons)
        self._layout.insertWidget(2, editor)
        self.body.hide()
        self._editor = editor
        self.edit_box.setFocus()

    def _submit_edit(self) -> None:
        text = self.edit_box.toPlainText().strip()
        if text:
            self._stop_editing()
            emit(self.edit_submitted, self.message.id, text)

    def _stop_editing(self) -> None:
        if self._editor is not None:
            self._editor.deleteLater()
            self._editor = None
            self.body.show()


