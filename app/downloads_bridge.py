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

from .model_fit import FitEstimate, remote_estimate, unknown_estimate
from .models.downloads import DownloadError, DownloadManager, DownloadProgress
from .models.hub import HubClient, HubError, load_curated
from .qt_compat import emit


HEADER_READERS = 4  # files of one repository whose headers are read at once


class DownloadsBridge(QObject):
    """Runs HubClient and DownloadManager calls on worker threads and reports back on the GUI thread.

    Signals:
        curated(list): the curated models as dicts (repo, filename, title, description, parameters, ...).
        search_results(str, list): the query and the repositories found (dicts: repo, downloads, likes, gated).
        files_listed(str, list): a repository and its GGUF files (dicts: filename, size, sha256, estimate None).
        file_judged(str, str, dict): repository, file name and its verdict (``FitEstimate.to_dict()`` plus
            ``n_ctx``), read from the file's header before anything is downloaded; one per listed file.
        download_changed(dict): the newest state of one download (DownloadProgress.to_dict()).
        download_completed(str, str): key and the verified file's path; the library lists it now.
        failed(str, str): what failed (a query, a repository or a download key) and a readable reason.
    """

    curated = Signal(object)
    search_results = Signal(str, object)
    files_listed = Signal(str, object)
    file_judged = Signal(str, str, object)
    download_changed = Signal(object)
    download_completed = Signal(str, str)
    failed = Signal(str, str)
    _posted = Signal(object)  # a callable to run on the GUI thread
    _progress_posted = Signal()

    def __init__(self, manager: DownloadManager, hub: HubClient | None = None,
                 estimator: Callable[[str, int, int, str | None], FitEstimate] = remote_estimate,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.manager = manager
        self.hub = hub or manager.hub
        self._estimate = estimator  # (url, file size, n_ctx, token) -> the verdict from the file's header
        self._verdicts: dict[tuple[str, str], dict] = {}  # (repo, filename) -> the newest verdict
        self._listing: tuple[str, int] | None = None  # the repository and context being judged now
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
        """List ``repo``'s GGUF files, then judge each from its header at ``n_ctx`` (see model_fit)."""
        self._listing = (repo, n_ctx)
        self._in_background(self._queries, lambda: self._list_and_judge(repo, n_ctx), None, repo)

    def _list_and_judge(self, repo: str, n_ctx: int) -> None:
        files = self.hub.list_gguf_files(repo)
        rows = [{**f.to_dict(), "repo": repo, "estimate": None} for f in files]
        emit(self._posted, lambda: emit(self.files_listed, repo, rows))
        with concurrent.futures.ThreadPoolExecutor(HEADER_READERS, thread_name_prefix="hub-header") as pool:
            for f, verdict in zip(files, pool.map(lambda f: self._judge(repo, f.filename, f.size, n_ctx), files)):
                if verdict is not None:
                    emit(self._posted, lambda f=f, v=verdict: emit(self.file_judged, repo, f.filename, v))

    def _judge(self, repo: str, filename: str, size: int, n_ctx: int) -> dict | None:
        """The verdict of one file, or None when another repository or context is being listed now."""
        if self._listing != (repo, n_ctx):
            return None
        try:
            estimate = self._estimate(self.hub.file_url(repo, filename), size, n_ctx, self.hub.token)
        except Exception as e:  # noqa: BLE001 - a fault judging one file must not leave the others unjudged
            estimate = unknown_estimate(size, n_ctx, f"the file could not be judged: {e}")
        verdict = {**estimate.to_dict(), "n_ctx": n_ctx}
        with self._lock:
            self._verdicts[(repo, filename)] = verdict
        return verdict

    def verdict(self, repo: str, filename: str) -> dict | None:
        """The newest verdict of a listed file, or None."""
        with self._lock:
            return self._verdicts.get((repo, filename))

    # -- downloads -------------------------------------------------------------------------------------
    def downloads(self) -> list[dict]:
        """Every download the manager knows (also paused or failed ones from earlier runs)."""
        return [p.to_dict() for p in self.manager.list()]

    def start(self, repo: str, filename: str, accept_unrunnable: bool = False) -> None:
        """Download ``filename``, unless its verdict is that it won't load here and the user did not accept that
        (``accept_unrunnable``): then ``failed`` says why and nothing is downloaded. A file not judged yet is
        judged first, from its header."""
        key = f"{repo}/{filename}"

        def start() -> None:
            if not accept_unrunnable:
                self._refuse_unrunnable(repo, filename)
            self.manager.start(repo, filename, on_progress=self._on_progress)
        self._in_background(self._control, start, None, key)

    def _refuse_unrunnable(self, repo: str, filename: str) -> None:
        verdict = self.verdict(repo, filename)
        if verdict is None:
            size = self.hub.file_info(repo, filename).size
            verdict = self._judge_now(repo, filename, size)
        if verdict["runs"] is False:
            raise DownloadError(f"not downloaded: it won't load here ({verdict['reasons'][0]}); "
                                "download it anyway to keep it")

    def _judge_now(self, repo: str, filename: str, size: int) -> dict:
        from .models.metadata_cache import VERDICT_N_CTX

        verdict = self._estimate(self.hub.file_url(repo, filename), size, VERDICT_N_CTX, self.hub.token).to_dict()
        with self._lock:
            self._verdicts[(repo, filename)] = {**verdict, "n_ctx": VERDICT_N_CTX}
        return verdict

    def pause(self, key: str) -> None:
        self._in_background(self._control, lambda: self.manager.pause(key), None, key)

    def resume(self, key: str) -> None:
        self._in_background(self._control, lambda: self.manager.resume(key, on_progress=self._on_progress), None, key)

    def cancel(self, key: str) -> None:
        self._in_background(self._control, lambda: self.manager.cancel(key), None, key)

    def shutdown(self) -> None:
        """Pause running downloads (they resume from their partial files next time) and stop the threads."""
        self._listing = None  # header reads still queued are skipped
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
