"""The Models page: the loaded model and its memory, every model in the library with the engine's verdict
("Runs here · needs 3.1 GB" or, greyed out, "Won't load: <reason>"), the models of remote endpoints with their
endpoint, adding (a file that cannot be added gets a red row saying why), removing, downloading."""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QFileDialog, QFrame, QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QPushButton,
                               QSplitter, QVBoxLayout, QWidget)

from ..model_choices import ModelChoice
from ..paths import file_name
from ..qt_compat import emit

PATH_ROLE = Qt.ItemDataRole.UserRole
FAILED_ROLE = Qt.ItemDataRole.UserRole + 1  # a row for a file that could not be added (not in the library)
WONT_LOAD_COLOR = "#c5322a"  # a row whose model won't load: its reason, last line, stays readable


class ModelsPage(QFrame):
    """Shows models and emits the user's choice.

    Signals:
        use_requested(str): use the model at this path for the shown conversation.
        add_requested(str): add this GGUF file to the library.
        refresh_requested(): list the models again.
        remove_requested(str): remove the model at this path (after the window confirms it).
        add_remote_requested(): the user wants to add a remote endpoint (the window asks for it).
    """

    use_requested = Signal(str)
    add_requested = Signal(str)
    refresh_requested = Signal()
    remove_requested = Signal(str)
    add_remote_requested = Signal()

    def __init__(self, parent: QWidget | None = None, downloads: QWidget | None = None):
        super().__init__(parent)
        title = QLabel("Models")
        title.setObjectName("pageTitle")
        self.current = QLabel("No model loaded yet.")
        self.current.setObjectName("currentModel")
        self.current.setWordWrap(True)
        self.current.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message = QLabel()  # what came of the last action taken on this page (adding a file)
        self.message.setObjectName("modelsMessage")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message.hide()
        self._failed: dict[str, str] = {}  # files that could not be added: path -> reason, shown as rows
        self.list = QListWidget()
        self.list.setObjectName("modelList")
        self.list.itemDoubleClicked.connect(self._use)
        self.list.currentItemChanged.connect(self._update_buttons)
        self.use_button = QPushButton("Use in this conversation")
        self.use_button.clicked.connect(lambda: self._use(self.list.currentItem()))
        add = QPushButton("Add a GGUF file…")
        add.clicked.connect(self._add)
        add_remote = QPushButton("Add a remote endpoint…")
        add_remote.setObjectName("addRemote")
        add_remote.setToolTip("A server that speaks the OpenAI API: vLLM, llama.cpp's llama-server, Ollama, another "
                              "Hearth (docs/remote-engines.md)")
        add_remote.clicked.connect(self.add_remote_requested)
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.refresh_requested)
        self.remove_button = QPushButton("Remove…")
        self.remove_button.clicked.connect(self._remove)
        buttons = QHBoxLayout()
        buttons.addWidget(add)
        buttons.addWidget(add_remote)
        buttons.addWidget(refresh)
        buttons.addWidget(self.remove_button)
        buttons.addStretch(1)
        buttons.addWidget(self.use_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 20, 24, 20)
        layout.setSpacing(10)
        layout.addWidget(title)
        layout.addWidget(self.current)
        library = QWidget()
        library_layout = QVBoxLayout(library)
        library_layout.setContentsMargins(0, 0, 0, 0)
        library_layout.addWidget(QLabel("Available models"))
        library_layout.addWidget(self.message)
        library_layout.addWidget(self.list, 1)
        library_layout.addLayout(buttons)
        if downloads is None:
            layout.addWidget(library, 1)
        else:
            split = QSplitter(Qt.Orientation.Vertical)
            split.setChildrenCollapsible(False)
            split.addWidget(library)
            split.addWidget(downloads)
            split.setSizes([260, 420])
            layout.addWidget(split, 1)
        self._update_buttons()

    def set_models(self, models: list[ModelChoice], current_path: str | None) -> None:
        self.list.clear()
        for path, reason in self._failed.items():
            self.list.addItem(self._failed_row(path, reason))
        for m in models:
            text = f"{m.name}\n{m.detail}" + (f"\n{m.problem}" if m.problem else "")
            item = QListWidgetItem(text)
            item.setData(PATH_ROLE, m.path)
            item.setToolTip(m.path)
            if not m.usable:
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)
                item.setForeground(QBrush(QColor(WONT_LOAD_COLOR)))
            self.list.addItem(item)
            if m.path == current_path:
                self.list.setCurrentItem(item)
        if not models:
            self.list.addItem("No models found. Add a GGUF file to start.")
        self._update_buttons()

    def show_message(self, kind: str, text: str) -> None:
        """A line above the list saying what came of the last action here ("info" or "error"); '' hides it."""
        self.message.setText(text)
        self.message.setProperty("kind", kind)
        self.message.setStyleSheet(f"color: {WONT_LOAD_COLOR};" if kind == "error" else "")
        self.message.setVisible(bool(text))

    def show_add_failed(self, path: str, reason: str) -> None:
        """A file could not be added: a red row for it at the top of the list, and the reason above the list."""
        reason = reason.replace(path, "the file")  # the library's message names the path the row shows already
        self._failed[path] = reason
        self.list.insertItem(0, self._failed_row(path, reason))
        self.list.scrollToTop()
        self.show_message("error", f"Could not add {file_name(path)}: {reason}")

    def show_added(self, choice: ModelChoice) -> None:
        """A file was added: select its row and say how to use it (adding never changes a conversation)."""
        self._failed.pop(choice.path, None)
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(PATH_ROLE) == choice.path and not item.data(FAILED_ROLE):
                self.list.setCurrentItem(item)
        if choice.usable:
            self.show_message("info", f"Added {choice.name} to the library. Select it and choose “Use in this "
                                      "conversation” to chat with it.")
        else:
            self.show_message("error", f"Added {choice.name} to the library, but it will not run here: "
                                       f"{choice.problem or 'see its row'}")

    @staticmethod
    def _failed_row(path: str, reason: str) -> QListWidgetItem:
        item = QListWidgetItem(f"{file_name(path)}\nCould not add: {reason}")
        item.setData(PATH_ROLE, path)
        item.setData(FAILED_ROLE, True)
        item.setToolTip(path)
        item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)
        item.setForeground(QBrush(QColor(WONT_LOAD_COLOR)))
        return item

    def set_current(self, info: dict) -> None:
        if not info:
            self.current.setText("No model loaded.")
            return
        remote = info.get("remote")
        if remote:
            self.current.setText(f"<b>{escape(info.get('name', ''))}</b> — remote, at {escape(remote['endpoint'])}"
                                 "<br>It runs on that server: memory, KV snapshots, thermal policy and speculative "
                                 "decoding are the server's.")
            return
        lines = [f"<b>{escape(info.get('name', ''))}</b> — loaded",
                 f"{escape(info.get('arch', ''))} · context {info.get('n_ctx', 0):,} tokens"
                 f" · {escape(info.get('backend', ''))} backend", escape(info.get("path", ""))]
        if info.get("estimate") and info.get("rss_after"):
            lines.append(escape(memory_text(info)))
        lines += [f"<i>{escape(n)}</i>" for n in info.get("notices", [])]
        self.current.setText("<br>".join(lines))

    def _use(self, item: QListWidgetItem | None) -> None:
        if item is not None and item.data(PATH_ROLE) and item.flags() & Qt.ItemFlag.ItemIsEnabled:
            emit(self.use_requested, item.data(PATH_ROLE))

    def _remove(self) -> None:
        item = self.list.currentItem()
        if item is not None and item.data(PATH_ROLE):
            emit(self.remove_requested, item.data(PATH_ROLE))

    def _add(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Add a GGUF model", "", "GGUF models (*.gguf)")
        if path:
            emit(self.add_requested, path)

    def _update_buttons(self, *_) -> None:
        item = self.list.currentItem()
        self.use_button.setEnabled(bool(item and item.data(PATH_ROLE) and item.flags() & Qt.ItemFlag.ItemIsEnabled))
        self.remove_button.setEnabled(bool(item and item.data(PATH_ROLE)))


def memory_text(info: dict) -> str:
    """The load's estimate next to the RSS growth measured by the worker, so the estimate can be checked."""
    e, mb = info["estimate"], 1 << 20
    measured = (info["rss_after"] - info["rss_before"]) / mb
    return (f"Memory: weights and runtime estimated {(e['weights'] + e['overhead']) / mb:,.0f} MB, measured "
            f"{measured:+,.0f} MB when loaded · KV cache up to {e['kv_cache'] / mb:,.0f} MB at "
            f"{info.get('n_ctx', 0):,} tokens (it fills as the conversation grows)")
