"""The Default settings page: the system prompt, sampling and context length every new chat starts from."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget

from ..chat_settings import ChatSettings
from ..qt_compat import emit
from .settings_panel import SettingsPanel

# The page's column of labels and fields stops growing here (logical pixels): a form stretched across a wide window
# puts each label far from its field and makes a spin box as wide as a paragraph.
MAX_CONTENT_WIDTH = 640


class DefaultSettingsPage(QFrame):
    """Edits the app-wide default ChatSettings; a conversation copies them when it is created and keeps its own.

    Signals:
        defaults_changed(object): the new default ChatSettings, after an edit settles.
    """

    defaults_changed = Signal(object)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("defaultSettingsPage")
        title = QLabel("Default settings")
        title.setObjectName("pageTitle")
        note = QLabel("Every new chat starts from these settings. A chat keeps its own copy: change one chat in its "
                      "Conversation settings panel; changes here apply to chats started afterwards.")
        note.setWordWrap(True)
        self.panel = SettingsPanel(for_defaults=True)
        self.panel.settings_changed.connect(lambda settings: emit(self.defaults_changed, settings))
        column = QWidget()
        column.setObjectName("defaultSettingsColumn")
        column.setMaximumWidth(MAX_CONTENT_WIDTH)
        column.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        inner = QVBoxLayout(column)
        inner.setContentsMargins(0, 0, 0, 0)
        inner.setSpacing(10)
        inner.addWidget(title)
        inner.addWidget(note)
        inner.addWidget(self.panel, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 20, 24, 20)
        layout.addWidget(column, 1)  # the full width up to the cap, then it stays at the left margin

    def set_defaults(self, settings: ChatSettings) -> None:
        """Show ``settings`` without emitting defaults_changed."""
        self.panel.set_settings(settings)

    def flush(self) -> None:
        """Emit an edit still waiting for its pause (before leaving the page or starting a chat)."""
        self.panel.flush()
