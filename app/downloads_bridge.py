"""The Qt side of the model manager: Hub queries and downloads off the GUI thread, results as queued signals.

``DownloadManager`` calls its progress callbacks on each download's own thread. The callback here only
stores the newest progress per download and, if none is pending, posts one queued wake-up; the GUI thread
then emits the latest state of every download that changed. However fast bytes arrive, the GUI sees at most
one update per download per event-loop pass (and the manager itself reports at most every 0.1 s).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, Signal, Slot

from .model_fit import fetch_header, remote_estimate
from .models.downloads import DownloadError, DownloadManager, DownloadProgress
from .models.hub import HubClient, HubError, load_curated
from .qt_compat import emit


class DownloadsBridge(QObject):
    """Runs HubClient and DownloadManager calls on worker threads and reports back on the GUI thread.

    Signals:
        curated(list): the curated models as dicts (repo, filename, title, description, parameters, ...).
        search_results(str, list): the query and the repositories found (dicts: repo, downloads, likes, gated).
        files_listed(str, list): a repository and its GGUF files (dicts: filename, size, sha256, estimate).
        download_changed(dict): the newest state of one download (DownloadProgress.to_dict()).
        download_completed(str, str): key and the verified file's path; the library lists it now.
        failed(str, str): what failed (a query, a repository or a download key) and a readable reason.
    """

    curated = Signal(object)
    search_results = Signal(str, object)
    files_listed = Signal(str, object)
    download_changed = Signal(object)
    download_completed = Signal(str, str)
    failed = Signal(str, str)
    _posted = Signal(object)  # a callable to run on the GUI thread
    _progress_posted = Signal()

    def __init__(self, manager: DownloadManager, hub: HubClient | None = None,
                 header_reader: Callable[[str, str | None], dict | None] = fetch_header,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.manager = manager
        self.hub = hub or manager.hub
        self._read_header = header_reader
        self._queries = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="hub-query")
        self._control = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="download-control")
        self._latest: dict[str, DownloadProgress] = {}
        self._lock = threading.Lock()
        self._wake_pending = False
        self._posted.connect(self._run_posted, Qt.ConnectionType.QueuedConnection)
        self._progress_posted.connect(self._drain_progress, Qt.ConnectionType.QueuedConnection)

    # -- queries ---------------------------------------------------------------------------------------
    def load_curated(self) -> None:
        try:
            models = [m.to_dict() for m in load_curated()]
        except HubError as e:
            emit(self.failed, "curated", str(e))
            return
        emit(self.curated, models)

    def search(self, query: str) -> None:
        self._in_background(self._queries, lambda: [m.to_dict() for m in self.hub.search(query)],
                            lambda found: emit(self.search_results, query, found), f"search “{query}”")

    def list_files(self, repo: str, n_ctx: int) -> None:
        """List ``repo``'s GGUF files with a memory estimate of each at ``n_ctx`` (see model_fit)."""
        self._in_background(self._queries, lambda: self._files_with_estimates(repo, n_ctx),
                            lambda files: emit(self.files_listed, repo, files), repo)

    def _files_with_estimates(self, repo: str, n_ctx: int) -> list[dict]:
        rows = []
        for f in self.hub.list_gguf_files(repo):
            header = self._read_header(self.hub.file_url(repo, f.filename), self.hub.token)
            rows.append({**f.to_dict(), "repo": repo, "estimate": remote_estimate(f.size, header, n_ctx).to_dict()})
        return rows

    # -- downloads -------------------------------------------------------------------------------------
    def downloads(self) -> list[dict]:
        """Every download the manager knows (also paused or failed ones from earlier runs)."""
        return [p.to_dict() for p in self.manager.list()]

    def start(self, repo: str, filename: str) -> None:
        key = f"{repo}/{filename}"
        self._in_background(self._control, lambda: self.manager.start(repo, filename, on_progress=self._on_progress),
                            None, key)

    def pause(self, key: str) -> None:
        self._in_background(self._control, lambda: self.manager.pause(key), None, key)

    def resume(self, key: str) -> None:
        self._in_background(self._control, lambda: self.manager.resume(key, on_progress=self._on_progress), None, key)

    def cancel(self, key: str) -> None:
        self._in_background(self._control, lambda: self.manager.cancel(key), None, key)

    def shutdown(self) -> None:
        """Pause running downloads (they resume from their partial files next time) and stop the threads."""
        for p in self.manager.list():
            if p.state == "running":
                self.manager.pause(p.key)
        self._queries.shutdown(wait=False, cancel_futures=True)
        self._control.shutdown(wait=True)
        for p in self.manager.list():
            self.manager.wait(p.key, timeout=10)

    # -- threads ---------------------------------------------------------------------------------------
    def _on_progress(self, progress: DownloadProgress) -> None:
        """On a download's thread: keep the newest state, wake the GUI thread once."""
        with self._lock:
            self._latest[progress.key] = progress
            if self._wake_pending:
                return
            self._wake_pending = True
        emit(self._progress_posted)

    @Slot()
    def _drain_progress(self) -> None:
        with self._lock:
            latest, self._latest, self._wake_pending = self._latest, {}, False
        for progress in latest.values():
            emit(self.download_changed, progress.to_dict())
            if progress.state == "completed" and progress.path is not None:
                emit(self.download_completed, progress.key, str(progress.path))
            if progress.state == "failed" and progress.error:
                emit(self.failed, progress.key, progress.error)

    def _in_background(self, pool, work: Callable[[], object], done: Callable[[object], None] | None,
                       what: str) -> None:
        def run() -> None:
            try:
                result = work()
            except (HubError, DownloadError, OSError) as e:
                reason = str(e)
                emit(self._posted, lambda: emit(self.failed, what, reason))
                return
            if done is not None:
                emit(self._posted, lambda: done(result))
        try:
            pool.submit(run)
        except RuntimeError:  # shut down
            pass

    @Slot(object)
    def _run_posted(self, call: Callable[[], None]) -> None:
        call()
