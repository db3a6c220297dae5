"""Getting models: recommended ones and Hub search, a repository's GGUF files with the engine's verdict, downloads.

Each file's verdict ("Runs here · needs 3.1 GB", "Won't load: <reason>") is read from its header before
anything is downloaded; a file that won't load is downloaded only after the user confirms it.
"""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QComboBox, QFrame, QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem,
                               QMessageBox, QProgressBar, QPushButton, QSplitter, QTreeWidget, QTreeWidgetItem,
                               QVBoxLayout, QWidget)

from ..model_fit import verdict_summary
from ..qt_compat import emit
from .theme import NOTICE_COLORS

REPO_ROLE = Qt.ItemDataRole.UserRole
PICK_ROLE = Qt.ItemDataRole.UserRole + 1  # the recommended file of a curated repository
VERDICT_ROLE = Qt.ItemDataRole.UserRole + 2  # a file row's verdict dict, None until judged
CONTEXTS = (2048, 4096, 8192, 16384, 32768)
CHECKING = "Checking the file's header…"
WONT_LOAD_COLOR = NOTICE_COLORS["error"]
SLOW_COLOR = NOTICE_COLORS["warning"]  # "paged": runs from the OS page cache, slowly
STATE_TEXT = {"running": "Downloading", "paused": "Paused", "verifying": "Checking the file…", "completed": "Done",
              "failed": "Failed", "cancelled": "Cancelled"}


def size_text(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds + 0.5)
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min left"
    if seconds >= 60:
        return f"{seconds // 60} min {seconds % 60} s left"
    return f"{seconds} s left"


def progress_text(p: dict) -> str:
    """"120.0 MB of 491.4 MB · 4.2 MB/s · 1 min 28 s left" (or the state and error)."""
    parts = [f"{size_text(p['downloaded'])} of {size_text(p['total'])}"]
    if p["state"] == "running" and p.get("bytes_per_second"):
        parts += [f"{size_text(p['bytes_per_second'])}/s", eta_text(p.get("eta_seconds"))]
    elif p["state"] != "running":
        parts.append(STATE_TEXT.get(p["state"], p["state"]))
    if p.get("error"):
        parts.append(p["error"])
    return " · ".join(x for x in parts if x)


def verdict_color(e: dict) -> QColor | None:
    """A file row's text colour: red when it won't load or fit, amber when it runs only from the page cache."""
    if e.get("runs") is False or e.get("verdict") == "won't fit":
        return QColor(WONT_LOAD_COLOR)
    if e.get("verdict") == "paged":
        return QColor(SLOW_COLOR)
    return None


def estimate_tip(e: dict) -> str:
    """The verdict's reasons and the memory estimate by part, for a row's tooltip."""
    lines = [f"Won't load: {r}" for r in e.get("reasons", [])] if e.get("runs") is False else []
    if e.get("runs") is None and e.get("reasons"):
        lines.append(f"Not checked: {e['reasons'][0]}")
    rough = " (a rough guess)" if e.get("rough") else ""
    backend = f" on the {e['backend']} backend" if e.get("backend") else ""
    lines.append(f"Weights {size_text(e['weights'])} + KV cache {size_text(e['kv_cache'])} + runtime "
                 f"{size_text(e['overhead'])} = {size_text(e['total'])}{rough}{backend} at "
                 f"{e.get('n_ctx', 0):,} tokens; {size_text(e['available'])} of memory is available now.")
    return "\n".join(lines)


class DownloadRow(QFrame):
    """One download: name, progress bar, bytes/speed/ETA, and pause/resume/cancel.

    Signals:
        pause_requested(str), resume_requested(str), cancel_requested(str): the download's key.
    """

    pause_requested = Signal(str)
    resume_requested = Signal(str)
    cancel_requested = Signal(str)

    def __init__(self, key: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.key = key
        self.setObjectName("downloadRow")
        self.name = QLabel(key.rsplit("/", 1)[-1])
        self.name.setToolTip(key)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(8)
        self.detail = QLabel()
        self.detail.setObjectName("muted")
        self.detail.setWordWrap(True)
        self.pause_button = QPushButton("Pause")
        self.resume_button = QPushButton("Resume")
        self.cancel_button = QPushButton("Cancel")
        self.pause_button.clicked.connect(lambda: emit(self.pause_requested, self.key))
        self.resume_button.clicked.connect(lambda: emit(self.resume_requested, self.key))
        self.cancel_button.clicked.connect(lambda: emit(self.cancel_requested, self.key))
        top = QHBoxLayout()
        top.addWidget(self.name, 1)
        for button in (self.pause_button, self.resume_button, self.cancel_button):
            top.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 4)
        layout.addLayout(top)
        layout.addWidget(self.bar)
        layout.addWidget(self.detail)
        self.state = ""

    def update_progress(self, p: dict) -> None:
        self.state = p["state"]
        self.bar.setValue(int(1000 * p["downloaded"] / p["total"]) if p["total"] else 0)
        self.detail.setText(progress_text(p))
        self.pause_button.setVisible(self.state == "running")
        self.resume_button.setVisible(self.state in ("paused", "failed"))
        self.cancel_button.setVisible(self.state in ("running", "paused", "failed"))


class DownloadsPanel(QFrame):
    """Find a model, see whether it fits, download it; renders what the bridge reports, emits intents.

    Signals:
        search_requested(str): search the Hub for this text.
        repo_selected(str): list this repository's GGUF files.
        n_ctx_changed(int): the context length the estimates assume.
        download_requested(str, str, bool): repository, file name, and whether the user accepted downloading
            a file whose verdict is that it won't load here.
        pause_requested(str), resume_requested(str), cancel_requested(str): a download's key.
    """

    search_requested = Signal(str)
    repo_selected = Signal(str)
    n_ctx_changed = Signal(int)
    download_requested = Signal(str, str, bool)
    pause_requested = Signal(str)
    resume_requested = Signal(str)
    cancel_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.repo: str | None = None
        self.rows: dict[str, DownloadRow] = {}
        self._curated: list[dict] = []
        self.confirm = lambda title, text: QMessageBox.question(self, title, text) == QMessageBox.StandardButton.Yes
        self._build()

    def _build(self) -> None:
        title = QLabel("Get models")
        title.setObjectName("sectionTitle")
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search the Hugging Face Hub for GGUF models")
        self.search.returnPressed.connect(self._search)
        search_button = QPushButton("Search")
        search_button.clicked.connect(self._search)
        self.context = QComboBox()
        for n in CONTEXTS:
            self.context.addItem(f"{n:,} tokens", n)
        self.context.setCurrentIndex(CONTEXTS.index(4096))
        self.context.setToolTip("The context length the memory estimates assume")
        self.context.currentIndexChanged.connect(lambda _: emit(self.n_ctx_changed, self.n_ctx()))
        row = QHBoxLayout()
        row.addWidget(self.search, 1)
        row.addWidget(search_button)
        row.addWidget(QLabel("Context"))
        row.addWidget(self.context)
        self.repos = QListWidget()
        self.repos.setObjectName("repoList")
        self.repos.setWordWrap(True)
        self.repos.setSpacing(3)
        self.repos.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.repos.currentItemChanged.connect(self._repo_changed)
        self.files = QTreeWidget()
        self.files.setHeaderLabels(["File", "Size", "Verdict"])
        self.files.setRootIsDecorated(False)
        self.files.currentItemChanged.connect(self._update_download_button)
        self.files.itemDoubleClicked.connect(lambda *_: self._download())
        split = QSplitter()
        split.setChildrenCollapsible(False)
        split.addWidget(self.repos)
        split.addWidget(self.files)
        split.setSizes([260, 520])
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self._download)
        actions = QHBoxLayout()
        actions.addWidget(self.message, 1)
        actions.addWidget(self.download_button)
        self.downloads = QVBoxLayout()
        self.downloads.setSpacing(2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(title)
        layout.addLayout(row)
        layout.addWidget(split, 1)
        layout.addLayout(actions)
        layout.addLayout(self.downloads)
        self._update_download_button()

    def n_ctx(self) -> int:
        return int(self.context.currentData())

    # -- rendering -------------------------------------------------------------------------------------
    def set_curated(self, models: list[dict]) -> None:
        self._curated = models
        self._show_repos([(f"{m['title']} · {m['parameters']}\n{m['description']}", m["repo"], m["filename"])
                          for m in models], "Recommended models")

    def set_search_results(self, query: str, found: list[dict]) -> None:
        rows = [(f"{r['repo']}\n{r['downloads']:,} downloads" + (" · gated" if r.get("gated") else ""), r["repo"], None)
                for r in found]
        self._show_repos(rows, f"{len(found)} repositories for “{query}”" if found else f"Nothing found for “{query}”")

    def _show_repos(self, rows: list[tuple[str, str, str | None]], message: str) -> None:
        self.repos.blockSignals(True)
        self.repos.clear()
        for text, repo, pick in rows:
            item = QListWidgetItem(text)
            item.setData(REPO_ROLE, repo)
            item.setData(PICK_ROLE, pick)
            item.setToolTip(repo)
            self.repos.addItem(item)
        self.repos.blockSignals(False)
        self.files.clear()
        self.repo = None
        self.show_message(message)
        self._update_download_button()

    def set_files(self, repo: str, files: list[dict]) -> None:
        if repo != self.repo:
            return  # an answer for a repository no longer selected
        self.files.clear()
        pick = self.repos.currentItem().data(PICK_ROLE) if self.repos.currentItem() else None
        for f in files:
            item = QTreeWidgetItem([f["filename"], size_text(f["size"]), CHECKING])
            item.setData(0, REPO_ROLE, f["filename"])
            self.files.addTopLevelItem(item)
            if f.get("estimate"):
                self._show_verdict(item, f["estimate"])
            if f["filename"] == pick:
                self.files.setCurrentItem(item)
        for column in range(3):
            self.files.resizeColumnToContents(column)
        self.show_message(f"{len(files)} GGUF files in {repo}" if files else f"{repo} has no GGUF files")
        self._update_download_button()

    def set_file_verdict(self, repo: str, filename: str, e: dict) -> None:
        """Show one file's verdict (read from its header) on its row."""
        if repo != self.repo or e.get("n_ctx", self.n_ctx()) != self.n_ctx():
            return  # for a repository or context no longer shown
        for item in self.file_items():
            if item.data(0, REPO_ROLE) == filename:
                self._show_verdict(item, e)
        self.files.resizeColumnToContents(2)
        self._update_download_button()

    def file_items(self) -> list[QTreeWidgetItem]:
        return [self.files.topLevelItem(i) for i in range(self.files.topLevelItemCount())]

    @staticmethod
    def _show_verdict(item: QTreeWidgetItem, e: dict) -> None:
        item.setData(0, VERDICT_ROLE, e)
        item.setText(2, verdict_summary(e))
        color = verdict_color(e)
        for column in range(3):
            item.setToolTip(column, estimate_tip(e))
            item.setData(column, Qt.ItemDataRole.ForegroundRole, QBrush(color) if color is not None else None)

    def update_download(self, p: dict) -> None:
        row = self.rows.get(p["key"])
        if row is None:
            row = DownloadRow(p["key"])
            for name in ("pause_requested", "resume_requested", "cancel_requested"):
                getattr(row, name).connect(getattr(self, name))
            self.rows[p["key"]] = row
            self.downloads.addWidget(row)
            row.show()  # at once: a layout shows a new child only on the next event-loop turn
        row.update_progress(p)

    def show_message(self, text: str, error: bool = False) -> None:
        self.message.setText(f"<span style='color:#c5322a'>{escape(text)}</span>" if error else escape(text))

    # -- intents ---------------------------------------------------------------------------------------
    def _search(self) -> None:
        text = self.search.text().strip()
        if text:
            self.show_message(f"Searching for “{text}”…")
            emit(self.search_requested, text)
        elif self._curated:
            self.set_curated(self._curated)

    def _repo_changed(self, item: QListWidgetItem | None, _previous=None) -> None:
        self.files.clear()
        self.repo = item.data(REPO_ROLE) if item is not None else None
        self._update_download_button()
        if self.repo:
            self.show_message(f"Listing the files of {self.repo} and estimating their memory…")
            emit(self.repo_selected, self.repo)

    def _download(self) -> None:
        """Ask for the selected file; one that won't load here only after the user confirms it."""
        item = self.files.currentItem()
        if not (self.repo and item is not None):
            return
        filename, e = item.data(0, REPO_ROLE), item.data(0, VERDICT_ROLE)
        accepted = False
        if e is not None and e.get("runs") is False:
            reason = e["reasons"][0] if e.get("reasons") else "the engine cannot run it"
            if not self.confirm("Download a model Hearth cannot run?",
                                f"{filename} won't load here: {reason}.\n\nDownload it anyway?"):
                self.show_message(f"Not downloaded: {filename} won't load here.")
                return
            accepted = True
        emit(self.download_requested, self.repo, filename, accepted)

    def _update_download_button(self, *_) -> None:
        item = self.files.currentItem()
        self.download_button.setEnabled(bool(self.repo and item))
        e = item.data(0, VERDICT_ROLE) if item is not None else None
        self.download_button.setText("Download anyway…" if e and e.get("runs") is False else "Download")
