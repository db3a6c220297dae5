"""The scrolling column of messages, with an empty state, that follows a streaming answer."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from ..store import Message
from .message_widget import MessageWidget

MAX_COLUMN_WIDTH = 860
REPAINT_S = 0.03  # streamed text arrives once per token; the view renders it at most this often (~30 Hz)


class ChatView(QScrollArea):
    """Shows a conversation's messages and re-emits each message's intents.

    Signals:
        edit_submitted(int, str), delete_requested(int), regenerate_requested(), alternative_requested(int, int):
            from the message widgets.
    """

    edit_submitted = Signal(int, str)
    delete_requested = Signal(int)
    regenerate_requested = Signal()
    alternative_requested = Signal(int, int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        container = QWidget()
        container.setObjectName("chatContainer")
        outer = QHBoxLayout(container)
        outer.setContentsMargins(16, 16, 16, 16)
        self._column = QWidget()
        self._column.setMaximumWidth(MAX_COLUMN_WIDTH)
        self._column.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        outer.addWidget(self._column)
        self._messages = QVBoxLayout(self._column)
        self._messages.setContentsMargins(0, 0, 0, 0)
        self._messages.setSpacing(10)
        self._empty = QLabel()
        self._empty.setObjectName("emptyState")
        self._empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._empty.setWordWrap(True)
        self._messages.addWidget(self._empty)
        self._messages.addStretch(1)
        self.setWidget(container)
        self.widgets: dict[int, MessageWidget] = {}
        self._stick_to_bottom = True
        self._unrendered: dict[int, tuple[str, str | None, bool]] = {}  # message id -> (text, thinking, now)
        self._repaint = QTimer(self, singleShot=True, interval=int(REPAINT_S * 1000))
        self._repaint.timeout.connect(self.render_streamed)
        self.verticalScrollBar().rangeChanged.connect(self._follow)
        self.verticalScrollBar().valueChanged.connect(self._remember_position)

    def set_messages(self, messages: list[Message], streaming_id: int | None, assistant_name: str,
                     empty_text: str) -> None:
        """Show ``messages``, reusing the widgets of messages already shown."""
        old, self.widgets = self.widgets, {}
        for index, message in enumerate(messages):
            widget = old.pop(message.id, None)
            if widget is None or widget.message.role != message.role:
                widget = self._make(message, assistant_name)
            widget.set_message(message, streaming=message.id == streaming_id)
            widget.set_author(assistant_name)
            if self._messages.indexOf(widget) != index:  # (re-inserting every widget of a long chat takes long)
                self._messages.insertWidget(index, widget)
            self.widgets[message.id] = widget
        for widget in old.values():
            widget.deleteLater()
        last = messages[-1] if messages else None
        for message_id, widget in self.widgets.items():
            widget.set_regenerate_visible(last is not None and message_id == last.id and last.role == "assistant"
                                          and streaming_id is None)
        self._empty.setText(empty_text)
        self._empty.setVisible(not messages)
        # streamed text of the reply still streaming can be newer than ``messages``; any other is superseded
        self._unrendered = {k: v for k, v in self._unrendered.items() if k == streaming_id}
        self.render_streamed()

    def set_streaming_text(self, message_id: int, text: str) -> None:
        """The streaming answer so far; shown within REPAINT_S."""
        _, thinking, now = self._unrendered.get(message_id, ("", None, False))
        self._unrendered[message_id] = (text, thinking, now)
        self._schedule()

    def set_streaming_thinking(self, message_id: int, thinking: str, thinking_now: bool) -> None:
        """The streaming reasoning so far; shown within REPAINT_S."""
        text = self._unrendered.get(message_id, (None, None, False))[0]
        self._unrendered[message_id] = (text, thinking, thinking_now)
        self._schedule()

    def render_streamed(self) -> None:
        """Show the streamed text received since the last repaint."""
        self._repaint.stop()
        pending, self._unrendered = self._unrendered, {}
        for message_id, (text, thinking, thinking_now) in pending.items():
            widget = self.widgets.get(message_id)
            if widget is None:
                continue
            if thinking is not None:
                widget.set_thinking(thinking, thinking_now)
            if text is not None:
                widget.set_text(text)

    def _schedule(self) -> None:
        if not self._repaint.isActive():
            self._repaint.start()

    def scroll_to_bottom(self) -> None:
        self._stick_to_bottom = True
        QTimer.singleShot(0, self, lambda: self.verticalScrollBar().setValue(self.verticalScrollBar().maximum()))

    def _make(self, message: Message, assistant_name: str) -> MessageWidget:
        widget = MessageWidget(message, assistant_name)
        widget.edit_submitted.connect(self.edit_submitted)
        widget.delete_requested.connect(self.delete_requested)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.alternative_requested.connect(self.alternative_requested)
        return widget

    def _remember_position(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._stick_to_bottom = value >= bar.maximum() - 24

    def _follow(self, _minimum: int, maximum: int) -> None:
        if self._stick_to_bottom:
            self.verticalScrollBar().setValue(maximum)
