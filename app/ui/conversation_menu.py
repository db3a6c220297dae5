"""The conversation header's menu: rename or delete the conversation, export and import conversations, save and
restore the model's state."""

from __future__ import annotations

import re
from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFileDialog, QMenu, QToolButton, QWidget

from ..qt_compat import emit

JSON_FILTER = "Hearth conversation (*.json)"
MARKDOWN_FILTER = "Markdown (*.md)"
ARCHIVE_FILTER = "Hearth archive (*.zip)"
STATE_FILTER = "Hearth state snapshot (*.hearth)"

# (title, suggested file name or None to open a file, filter) -> chosen path or ""
AskPath = Callable[[str, str | None, str], str]


def ask_path_with_dialog(parent: QWidget, title: str, suggested: str | None, file_filter: str) -> str:
    if suggested is None:
        return QFileDialog.getOpenFileName(parent, title, "", file_filter)[0]
    return QFileDialog.getSaveFileName(parent, title, suggested, file_filter)[0]


class ConversationMenu(QToolButton):
    """A "⋯" button whose menu asks for a file and emits what to do with it.

    Signals:
        rename_requested(): rename the shown conversation.
        delete_requested(): delete the shown conversation (the window offers undo).
        export_requested(str, str): kind ("json", "markdown" or "all") and the target path.
        import_requested(str, str): kind ("json" or "all") and the file to import.
        save_state_requested(str): where to write the shown conversation's state snapshot.
        restore_state_requested(str): the snapshot to restore as a new conversation.
    """

    rename_requested = Signal()
    delete_requested = Signal()
    export_requested = Signal(str, str)
    import_requested = Signal(str, str)
    save_state_requested = Signal(str)
    restore_state_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setText("⋯")
        self.setToolTip("Rename, delete, export, import, save or restore state")
        self.setAutoRaise(True)
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.setStyleSheet("QToolButton::menu-indicator { image: none; width: 0px; }")
        font = self.font()
        font.setPointSizeF(font.pointSizeF() * 1.4)
        self.setFont(font)
        self.title = "conversation"
        self.ask_path: AskPath = lambda title, suggested, kind: ask_path_with_dialog(self, title, suggested, kind)
        menu = QMenu(self)
        self.actions_by_name = {}
        entries = [
            ("rename", "Rename…", lambda: emit(self.rename_requested)),
            ("delete", "Delete", lambda: emit(self.delete_requested)),
            None,
            ("export_json", "Export as JSON…", self._export_json),
            ("export_markdown", "Export as Markdown…", self._export_markdown),
            ("import_json", "Import a conversation…", self._import_json),
            None,
            ("export_all", "Export all conversations…", self._export_all),
            ("import_all", "Import an archive…", self._import_all),
            None,
            ("save_state", "Save state…", self._save_state),
            ("restore_state", "Restore state…", self._restore_state),
        ]
        for entry in entries:
            if entry is None:
                menu.addSeparator()
                continue
            name, text, slot = entry
            self.actions_by_name[name] = menu.addAction(text, slot)
        self.actions_by_name["save_state"].setToolTip("The conversation with the model's memory of it (KV cache)")
        self.setMenu(menu)

    def set_state_unavailable(self, reason: str | None) -> None:
        """Grey out saving and restoring state, with ``reason`` as the tooltip (a remote model); None enables them."""
        for name in ("save_state", "restore_state"):
            self.actions_by_name[name].setEnabled(reason is None)
        self.actions_by_name["save_state"].setToolTip(
            reason or "The conversation with the model's memory of it (KV cache)")
        self.actions_by_name["restore_state"].setToolTip(reason or "")

    def set_title(self, title: str) -> None:
        """The shown conversation's title, for suggested file names."""
        self.title = title

    def _stem(self) -> str:
        return re.sub(r"[^\w\- ]+", "", self.title).strip()[:60] or "conversation"

    def _ask(self, title: str, suggested: str | None, file_filter: str) -> str:
        return self.ask_path(title, suggested, file_filter) or ""

    def _export_json(self) -> None:
        if path := self._ask("Export conversation", f"{self._stem()}.json", JSON_FILTER):
            emit(self.export_requested, "json", path)

    def _export_markdown(self) -> None:
        if path := self._ask("Export as Markdown", f"{self._stem()}.md", MARKDOWN_FILTER):
            emit(self.export_requested, "markdown", path)

    def _export_all(self) -> None:
        if path := self._ask("Export all conversations", "hearth-conversations.zip", ARCHIVE_FILTER):
            emit(self.export_requested, "all", path)

    def _import_json(self) -> None:
        if path := self._ask("Import a conversation", None, JSON_FILTER):
            emit(self.import_requested, "json", path)

    def _import_all(self) -> None:
        if path := self._ask("Import an archive", None, ARCHIVE_FILTER):
            emit(self.import_requested, "all", path)

    def _save_state(self) -> None:
        if path := self._ask("Save state", f"{self._stem()}.hearth", STATE_FILTER):
            emit(self.save_state_requested, path)

    def _restore_state(self) -> None:
        if path := self._ask("Restore state", None, STATE_FILTER):
            emit(self.restore_state_requested, path)
