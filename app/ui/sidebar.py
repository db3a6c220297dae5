"""The conversations sidebar: new chat, search by title or content, rename and delete."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QAbstractItemView, QFrame, QLineEdit, QListWidget, QListWidgetItem, QMenu, QPushButton,
                               QVBoxLayout, QWidget)

from ..qt_compat import emit
from ..store import Conversation
from .theme import icon

ID_ROLE = Qt.ItemDataRole.UserRole


class ConversationList(QListWidget):
    """The list of conversations; a right-click opens the menu without moving the highlight off the open one."""

    def mousePressEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.button() == Qt.MouseButton.RightButton:
            event.accept()  # selection follows what is open, not where the menu was asked for
            return
        super().mousePressEvent(event)


class Sidebar(QFrame):
    """Lists conversations and emits what the user does with them.

    Signals:
        new_requested(): start a new conversation.
        selected(int): open a conversation.
        rename_requested(int, str): new title for a conversation.
        delete_requested(int): delete a conversation (the window offers undo).
        search_changed(str): the search text, after typing pauses.
    """

    new_requested = Signal()
    selected = Signal(int)
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.setIcon(icon("new"))
        self.new_button.clicked.connect(self.new_requested)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self, singleShot=True, interval=200)
        self._search_timer.timeout.connect(lambda: emit(self.search_changed, self.search.text()))
        self.search.textChanged.connect(self._search_timer.start)
        self.search.addAction(icon("search", "muted"), QLineEdit.ActionPosition.LeadingPosition)
        self.list = ConversationList()
        self.list.setObjectName("conversationList")
        self.list.setFrameShape(QFrame.Shape.NoFrame)
        self.list.setUniformItemSizes(True)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemClicked.connect(lambda item: emit(self.selected, item.data(ID_ROLE)))
        self.list.itemDoubleClicked.connect(self.list.editItem)
        self.list.itemChanged.connect(self._renamed)
        delete = QAction("Delete", self.list, shortcut=QKeySequence.StandardKey.Delete,
                         shortcutContext=Qt.ShortcutContext.WidgetShortcut)
        delete.triggered.connect(self._delete_current)
        self.list.addAction(delete)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 12, 10, 10)
        layout.setSpacing(8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        self._filling = False
        self._current_id: int | None = None

    def set_conversations(self, conversations: list[Conversation], current_id: int | None,
                          answering: frozenset[int] = frozenset()) -> None:
        """List ``conversations``, select ``current_id``, and mark those whose reply is being generated."""
        self._filling = True
        self._current_id = current_id
        self.list.clear()
        for conv in conversations:
            item = QListWidgetItem(conv.title)
            item.setData(ID_ROLE, conv.id)
            item.setToolTip(f"{conv.title} (answering…)" if conv.id in answering else conv.title)
            if conv.id in answering:
                item.setIcon(icon("answering", "muted"))
            item.setSizeHint(QSize(0, 34))
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if conv.id == current_id:
                self.list.setCurrentItem(item)
        if not conversations and self.search.text().strip():
            item = QListWidgetItem("No conversation matches")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.list.addItem(item)
        self._filling = False

    def item_for(self, conversation_id: int) -> QListWidgetItem | None:
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(ID_ROLE) == conversation_id:
                return item
        return None

    def start_rename(self, conversation_id: int) -> None:
        """Edit the title of ``conversation_id`` in place (Enter saves, Esc cancels)."""
        item = self.item_for(conversation_id)
        if item is not None:
            self.list.scrollToItem(item)
            self.list.editItem(item)

    def _renamed(self, item: QListWidgetItem) -> None:
        if not self._filling and item.data(ID_ROLE) is not None:
            emit(self.rename_requested, item.data(ID_ROLE), item.text())

    def _delete_current(self) -> None:
        item = self.list.currentItem()
        if item is not None and item.data(ID_ROLE) is not None:
            emit(self.delete_requested, item.data(ID_ROLE))

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None or item.data(ID_ROLE) is None:
            return
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.editItem(item))
        menu.addAction("Delete", lambda: emit(self.delete_requested, item.data(ID_ROLE)))
        menu.exec(self.list.viewport().mapToGlobal(pos))
        self._highlight_current()

    def _highlight_current(self) -> None:
        """Put the highlight back on the open conversation (a closed menu must not leave it elsewhere)."""
        item = self.item_for(self._current_id) if self._current_id is not None else None
        if item is not None and item is not self.list.currentItem():
            self.list.setCurrentItem(item)


