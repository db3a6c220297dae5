"""Getting models: recommended ones and Hub search, a repository's GGUF files with a fit verdict, and downloads."""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QFrame, QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem,
                               QProgressBar, QPushButton, QSplitter, QTreeWidget, QTreeWidgetItem, QVBoxLayout,
                               QWidget)

from ..qt_compat import emit

REPO_ROLE = Qt.ItemDataRole.UserRole
PICK_ROLE = Qt.ItemDataRole.UserRole + 1  # the recommended file of a curated repository
CONTEXTS = (2048, 4096, 8192, 16384, 32768)
VERDICT_TEXT = {"fits": "Fits", "tight": "Tight — may slow the computer", "won't fit": "Won't fit"}
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


def estimate_tip(e: dict) -> str:
    rough = " (a rough guess: the file's header could not be read)" if e.get("rough") else ""
    return (f"Weights {size_text(e['weights'])} (the file size) + KV cache {size_text(e['kv_cache'])}{rough} + "
            f"runtime {size_text(e['overhead'])} = {size_text(e['total'])}; {size_text(e['available'])} of memory "
            f"is available now.")


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
        download_requested(str, str): repository and file name.
        pause_requested(str), resume_requested(str), cancel_requested(str): a download's key.
    """

    search_requested = Signal(str)
    repo_selected = Signal(str)
    n_ctx_changed = Signal(int)
    download_requested = Signal(str, str)
    pause_requested = Signal(str)
    resume_requested = Signal(str)
    cancel_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.repo: str | None = None
        self.rows: dict[str, DownloadRow] = {}
        self._curated: list[dict] = []
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
        self.files.setHeaderLabels(["File", "Size", "Memory needed", "Fit"])
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
            e = f["estimate"]
            need = ("≈ " if e.get("rough") else "") + size_text(e["total"])
            item = QTreeWidgetItem([f["filename"], size_text(f["size"]), need, VERDICT_TEXT.get(e["verdict"], e["verdict"])])
            item.setData(0, REPO_ROLE, f["filename"])
            item.setData(3, REPO_ROLE, e["verdict"])
            for column in range(4):
                item.setToolTip(column, estimate_tip(e))
            self.files.addTopLevelItem(item)
            if f["filename"] == pick:
                self.files.setCurrentItem(item)
        for column in range(4):
            self.files.resizeColumnToContents(column)
        self.show_message(f"{len(files)} GGUF files in {repo}" if files else f"{repo} has no GGUF files")
        self._update_download_button()

    def update_download(self, p: dict) -> None:
        row = self.rows.get(p["key"])
        if row is None:
            row = DownloadRow(p["key"])
            for name in ("pause_requested", "resume_requested", "cancel_requested"):
                getattr(row, name).connect(getattr(self, name))
            self.rows[p["key"]] = row
            self.downloads.addWidget(row)
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
        item = self.files.currentItem()
        if self.repo and item is not None:
            emit(self.download_requested, self.repo, item.data(0, REPO_ROLE))

    def _update_download_button(self, *_) -> None:
        self.download_button.setEnabled(bool(self.repo and self.files.currentItem()))
