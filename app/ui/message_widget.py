"""One message in the chat: who said it (for a reply, the model that wrote it), its thinking (collapsible), the
rendered text, actions (copy, edit, delete, regenerate) and stats in plain words (the engine's details in a tooltip)."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton, QVBoxLayout,
                               QWidget)

from ..model_names import reply_author
from ..qt_compat import emit
from ..speculation import speculation_text
from ..store import Message
from .markdown_view import MarkdownView
from .theme import icon

STATE_NOTES = {"stopped": "stopped", "interrupted": "interrupted — the app closed while answering"}


def stats_text(message: Message) -> str:
    """The line under an answer in plain words: tokens, time to first token, speed, and how it ended (the
    engine's details, speculation and the prompt cache, are in ``stats_details``, the line's tooltip)."""
    s = message.stats
    parts = []
    if "generated_tokens" in s and "prefill_s" in s:
        thinking = s.get("thinking_tokens")
        parts.append(f"{s['generated_tokens']} tokens"
                     + (f" ({thinking} thinking)" if _is_count(thinking) and thinking else ""))
        parts.append(f"{s['prefill_s']:.2f} s to first token")
        if s.get("decode_tps"):
            parts.append(f"{s['decode_tps']:.1f} tok/s")
    if s.get("finish_reason") in ("length", "context"):
        parts.append("hit the length limit" if s["finish_reason"] == "length" else "context full")
    if s.get("dropped"):
        parts.append(f"{s['dropped']} old messages left out")
    if message.state in STATE_NOTES:
        parts.append(STATE_NOTES[message.state])
    return " · ".join(parts)


def stats_details(message: Message) -> str:
    """The engine's details of an answer, one per line, for the stats line's tooltip: the prompt cache and
    speculative decoding; '' when there are none."""
    s = message.stats
    lines = []
    if s.get("cached_tokens"):  # the KV cache of the history was reused (restored from a snapshot: where from)
        where = {"memory": "memory", "disk": "disk", "file": "a saved state"}.get(s.get("restored_from"))
        lines.append(f"{s['cached_tokens']:,} of {s.get('prompt_tokens', 0):,} prompt tokens cached"
                     + (f" (restored from {where})" if where else ""))
    drafted, accepted, speedup = s.get("drafted_tokens", 0), s.get("accepted_tokens", 0), s.get("speedup_estimate")
    # (an imported conversation's stats are kept as they came: show only well-formed figures)
    if s.get("speculation") and _is_count(drafted) and _is_count(accepted) and (speedup is None or _is_number(speedup)):
        lines.append(speculation_text(str(s["speculation"]), drafted, accepted, speedup))
    return "\n".join(lines)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value) -> bool:
    return _is_number(value) and value >= 0 and float(value).is_integer()


def thinking_title(message: Message, thinking_now: bool) -> str:
    """The Thinking block's header: "Thinking…" while the model thinks, then its token count when known."""
    if thinking_now:
        return "Thinking…"
    tokens = message.stats.get("thinking_tokens")
    return f"Thinking · {tokens:,} tokens" if _is_count(tokens) and tokens else "Thinking"


class ThinkingBlock(QFrame):
    """The model's reasoning before its answer: a header that folds it away and the text, muted.

    It is open while the model thinks and folds itself once the answer starts; after the user opens or closes it,
    it stays as the user left it.

    Signals:
        toggled(bool): the user opened (True) or closed (False) it.
    """

    toggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("thinkingBlock")
        self.header = QToolButton()
        self.header.setObjectName("thinkingToggle")
        self.header.setCheckable(True)
        self.header.setAutoRaise(True)
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setArrowType(Qt.ArrowType.RightArrow)
        self.header.setToolTip("Show or hide the model's thinking")
        self.header.clicked.connect(self._on_click)
        self.body = MarkdownView()
        self.body.hide()
        self._user_choice: bool | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 2)
        layout.setSpacing(2)
        layout.addWidget(self.header, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.body)

    def show_thinking(self, text: str, title: str, open_by_default: bool) -> None:
        self.header.setText(title)
        self.header.setAccessibleName(title)
        # thoughts are written line by line: keep their line breaks (Markdown would join the lines of a paragraph)
        self.body.set_markdown(text if "```" in text else text.replace("\n", "  \n"))
        self._set_open(open_by_default if self._user_choice is None else self._user_choice)

    def is_open(self) -> bool:
        return self.header.isChecked()

    def _set_open(self, is_open: bool) -> None:
        self.header.setChecked(is_open)
        self.header.setArrowType(Qt.ArrowType.DownArrow if is_open else Qt.ArrowType.RightArrow)
        self.body.setVisible(is_open)

    def _on_click(self, checked: bool) -> None:
        self._user_choice = checked
        self._set_open(checked)
        emit(self.toggled, checked)


class MessageWidget(QFrame):
    """Shows one message and emits what the user wants done with it.

    Signals:
        edit_submitted(int, str): message id and the new text (user messages; resend from there).
        delete_requested(int): message id.
        regenerate_requested(): answer the last question again (shown on the last answer only).
        alternative_requested(int, int): message id and step (-1 previous, +1 next): show another answer of its turn.
        copied(int): message id whose text went to the clipboard.
    """

    edit_submitted = Signal(int, str)
    delete_requested = Signal(int)
    regenerate_requested = Signal()
    alternative_requested = Signal(int, int)
    copied = Signal(int)

    def __init__(self, message: Message, assistant_name: str = "Assistant", parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self.setObjectName("userMessage" if message.role == "user" else "assistantMessage")
        self._assistant_name = assistant_name  # for a reply whose stats do not name its model (yet)
        self._author = QLabel("You")
        self._author.setObjectName("author")
        self._author.setTextFormat(Qt.TextFormat.PlainText)  # a model's name comes from files, never markup
        self._author.setMinimumWidth(1)  # a long model name is clipped rather than widening the chat
        self.thinking = ThinkingBlock()
        self.thinking.hide()
        self._thinking_now = False
        self._shown: tuple[Message, bool] | None = None  # what set_message last showed (None: changed since)
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
        self.previous_button, self.alternatives_label, self.next_button = self._alternatives_control(header)
        for button in (self.copy_button, self.edit_button, self.regenerate_button, self.delete_button):
            header.addWidget(button)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(14, 8, 14, 10)
        self._layout.setSpacing(4)
        self._layout.addLayout(header)
        self._layout.addWidget(self.thinking)
        self._layout.addWidget(self.body)
        self._layout.addWidget(self._error)
        self._layout.addWidget(self._stats)
        self.edit_button.setVisible(message.role == "user")
        self.regenerate_button.setVisible(False)
        self.set_message(message)

    def _alternatives_control(self, header: QHBoxLayout) -> tuple[QToolButton, QLabel, QToolButton]:
        """‹ 2/3 ›: flip between the answers a turn got from Regenerate."""
        previous = QToolButton(text="‹", autoRaise=True, toolTip="Previous answer", accessibleName="Previous answer")
        label = QLabel()
        label.setObjectName("alternatives")
        following = QToolButton(text="›", autoRaise=True, toolTip="Next answer", accessibleName="Next answer")
        previous.clicked.connect(lambda: emit(self.alternative_requested, self.message.id, -1))
        following.clicked.connect(lambda: emit(self.alternative_requested, self.message.id, 1))
        for widget in (previous, label, following):
            widget.hide()
            header.addWidget(widget)
        return previous, label, following

    def _show_alternatives(self, message: Message, streaming: bool) -> None:
        many = message.alternatives > 1
        self.alternatives_label.setText(f"{message.alternative + 1}/{message.alternatives}")
        self.alternatives_label.setToolTip(f"Answer {message.alternative + 1} of {message.alternatives}")
        for widget in (self.previous_button, self.alternatives_label, self.next_button):
            widget.setVisible(many)
        self.previous_button.setEnabled(not streaming and message.alternative > 0)
        self.next_button.setEnabled(not streaming and message.alternative < message.alternatives - 1)

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
        if (message, streaming) == self._shown:  # nothing changed (a long conversation is shown again)
            return
        self._shown = (message, streaming)
        self.message = message
        self._thinking_now = streaming and self._thinking_now  # (set_thinking says, while the reply streams)
        self._show_thinking(message.thinking, self._thinking_now, has_answer=bool(message.content))
        text = message.content
        if streaming and not text and not message.thinking:
            text = "*Thinking…*"
        self.body.set_markdown(text)
        self.body.setVisible(bool(text))
        error = message.stats.get("error") if message.state == "error" else None
        self._error.setText(f"Could not answer: {error}" if error else "")
        self._error.setVisible(bool(error))
        stats = "" if streaming else stats_text(message)
        self._stats.setText(stats)
        self._stats.setToolTip("" if streaming else stats_details(message))
        self._stats.setVisible(bool(stats))
        self.set_author(self._assistant_name)
        for button in (self.copy_button, self.edit_button, self.delete_button):
            button.setEnabled(not streaming)
        self._show_alternatives(message, streaming)

    def set_author(self, assistant_name: str) -> None:
        """Name the model that wrote this reply: the one its stats record, else ``assistant_name`` (the
        conversation's model, for a reply still streaming)."""
        self._assistant_name = assistant_name
        if self.message.role == "assistant":
            self._author.setText(reply_author(self.message.stats, assistant_name))

    def set_regenerate_visible(self, visible: bool) -> None:
        self.regenerate_button.setVisible(visible)

    def set_text(self, text: str) -> None:
        """New streamed answer text for this (assistant) message."""
        self.message = dataclasses.replace(self.message, content=text)
        self._shown = None
        placeholder = "" if self.message.thinking else "*Thinking…*"
        self.body.set_markdown(text or placeholder)
        self.body.setVisible(bool(text or placeholder))
        if text and self.message.thinking:
            self._show_thinking(self.message.thinking, False, has_answer=True)

    def set_thinking(self, thinking: str, thinking_now: bool) -> None:
        """New streamed thinking for this (assistant) message; ``thinking_now``: the model is still thinking."""
        self.message = dataclasses.replace(self.message, thinking=thinking)
        self._shown = None
        self._thinking_now = thinking_now
        self._show_thinking(thinking, thinking_now, has_answer=bool(self.message.content))
        if self.message.thinking and not self.message.content:
            self.body.setVisible(False)

    def _show_thinking(self, thinking: str, thinking_now: bool, has_answer: bool) -> None:
        """Open while the model thinks or when there is no answer to show; folded once the answer starts."""
        shown = bool(thinking) or thinking_now
        self.thinking.setVisible(shown)
        if shown:
            self.thinking.show_thinking(thinking, thinking_title(self.message, thinking_now),
                                        open_by_default=thinking_now or not has_answer)

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


