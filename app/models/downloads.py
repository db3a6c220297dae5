"""Model downloads from the Hugging Face Hub in background threads, with pause, resume and verification.

A download streams into ``data_dir/downloads/<id>.part`` next to a ``<id>.json`` state file, so it resumes
with an HTTP ``Range`` request after a pause, a dropped connection or a restart of Hearth. When the server
ignores the range (answers 200) or the file's ETag changed, it starts again from zero. Only a file whose
size, sha256 (for LFS files) and GGUF header check out is moved, atomically, to
``data_dir/models/<org>/<repo>/<file>``, where the library finds it: a partial or corrupt file never
appears there. No Qt: progress is reported through callbacks, called on the download's thread.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import httpx2
from huggingface_hub import get_session

from engine.gguf_file import ModelFormatError, read_gguf

from .hub import HubClient, HubError
from .json_files import read_json, write_json

try:
    import fcntl
except ImportError:  # Windows: no cross-process lock, the in-process one still applies
    fcntl = None

log = logging.getLogger(__name__)

State = Literal["running", "paused", "verifying", "completed", "failed", "cancelled"]
ACTIVE: tuple[State, ...] = ("running", "verifying")
DISK_RESERVE_BYTES = 64 << 20  # keep this much free beyond the file itself
REPO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


class DownloadError(Exception):
    """A download cannot start or has failed; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class DownloadProgress:
    """A snapshot of one download, as given to progress callbacks and returned by ``status``."""

    key: str  # "<org>/<repo>/<file>", also the model's name in the library once completed
    repo: str
    filename: str
    state: State
    downloaded: int
    total: int
    bytes_per_second: float = 0.0
    eta_seconds: float | None = None
    error: str | None = None
    path: Path | None = None  # the verified file, once completed

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "path": str(self.path) if self.path else None}


ProgressCallback = Callable[[DownloadProgress], None]


class _Stop(Exception):
    """The user paused or cancelled; unwinds the transfer."""


class _Retry(Exception):
    """A transient failure (connection lost, server error, body too short); the transfer may be retried."""


class _Restart(Exception):
    """The partial file is unusable (ETag changed, bad Content-Range); retry from zero at once."""


@dataclasses.dataclass
class _Job:
    repo: str
    filename: str
    revision: str
    url: str
    size: int
    sha256: str | None
    etag: str | None = None
    state: State = "paused"
    error: str | None = None
    downloaded: int = 0
    speed: float = 0.0
    path: Path | None = None
    callbacks: list[ProgressCallback] = dataclasses.field(default_factory=list)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    cancel: bool = False
    thread: threading.Thread | None = None
    lock_file: object = None

    @property
    def key(self) -> str:
        return f"{self.repo}/{self.filename}"

    def progress(self) -> DownloadProgress:
        remaining = self.size - self.downloaded
        eta = remaining / self.speed if self.speed > 0 and self.state == "running" else None
        return DownloadProgress(self.key, self.repo, self.filename, self.state, self.downloaded, self.size,
                                self.speed, eta, self.error, self.path)

    def record(self) -> dict:
        return {"repo": self.repo, "filename": self.filename, "revision": self.revision, "size": self.size, "sha256": self.sha256, "etag": self.etag,
                "state": "failed" if self.state == "failed" else "paused", "error": self.error}


class DownloadManager:
    """Runs downloads into ``data_dir``; each in its own thread, controlled by key ``<org>/<repo>/<file>``."""

    def __init__(self, data_dir: Path, hub: HubClient | None = None, *, max_retries: int = 3,
                 retry_wait: float = 1.0, read_timeout: float = 60.0, progress_interval: float = 0.1):
        self.data_dir = Path(data_dir)
        self.models_dir = self.data_dir / "models"
        self.downloads_dir = self.data_dir / "downloads"
        self.hub = hub or HubClient()
        self.max_retries, self.retry_wait, self.read_timeout = max_retries, retry_wait, read_timeout
        self.progress_interval = progress_interval  # seconds between progress callbacks while bytes flow
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self.notices: list[str] = []  # for the user: damaged state files found at start-up and where they went
        self._load_saved()

    # -- public API ------------------------------------------------------------------------------------
    def start(self, repo: str, filename: str, revision: str = "main",
              on_progress: ProgressCallback | None = None) -> str:
        """Start (or resume, or join) the download of ``filename`` from ``repo``; returns its key.

        Raises DownloadError for unsafe names, a file already downloaded, too little disk space, a file
        another Hearth process is downloading, or anything the Hub answered instead of the file's metadata.
        """
        destination = self.destination(repo, filename)
        key = f"{repo}/{filename}"
        with self._lock:
            job = self._jobs.get(key)
        if job is not None:
            _settle(job)
        with self._lock:
            if job is not None and job.state in ACTIVE:
                _add_callback(job, on_progress)
                return key  # joined the download already under way
        if destination.exists():  # checked before asking the Hub; _launch checks again
            raise DownloadError(f"{key} is already downloaded ({destination})")
        if job is None or job.state not in ("paused", "failed"):
            try:
                info = self.hub.file_info(repo, filename, revision)
            except HubError as e:
                raise DownloadError(str(e)) from None
            job = _Job(repo, filename, revision, self.hub.file_url(repo, filename, revision), info.size, info.sha256)
        self._launch(job, on_progress)
        return key

    def resume(self, key: str, on_progress: ProgressCallback | None = None) -> None:
        """Continue a paused or failed download from where its partial file ends."""
        job = self._job(key)
        _settle(job)
        if job.state in ACTIVE:
            _add_callback(job, on_progress)
            return
        if job.state not in ("paused", "failed"):
            raise DownloadError(f"{key} is {job.state}; start it again instead")
        self._launch(job, on_progress)

    def pause(self, key: str) -> None:
        """Stop transferring and keep the partial file; ``resume`` continues it, also after a restart."""
        job = self._job(key)
        if job.state == "running":
            job.stop.set()

    def cancel(self, key: str) -> None:
        """Stop the download and delete its partial file."""
        job = self._job(key)
        if job.state in ACTIVE:
            job.cancel = True
            job.stop.set()
            return
        if job.state in ("paused", "failed"):
            self._discard(job)
            self._set_state(job, "cancelled")

    def status(self, key: str) -> DownloadProgress:
        return self._job(key).progress()

    def list(self) -> list[DownloadProgress]:
        """Every download this manager knows: running, paused or failed (also from earlier runs) and finished."""
        with self._lock:
            return [job.progress() for job in self._jobs.values()]

    def wait(self, key: str, timeout: float | None = None) -> DownloadProgress:
        """Block until the download stops running (completed, paused, failed or cancelled)."""
        thread = self._job(key).thread
        if thread is not None:
            thread.join(timeout)
        return self.status(key)

    def destination(self, repo: str, filename: str) -> Path:
        """Where the verified file goes; raises DownloadError for names that could escape the models folder."""
        if not REPO_NAME.fullmatch(repo) or ".." in repo:
            raise DownloadError(f"refusing the repository name {repo!r}: expected 'organisation/name'")
        parts = filename.split("/")
        if (filename.startswith("/") or "\\" in filename or ":" in filename or "\0" in filename
                or any(p in ("", ".", "..") for p in parts)):
            raise DownloadError(f"refusing the file name {filename!r}: it could write outside the models folder")
        if not filename.lower().endswith(".gguf"):
            raise DownloadError(f"refusing {filename!r}: only .gguf model files are downloaded")
        path = self.models_dir.joinpath(*repo.split("/"), *parts)
        if self.models_dir.resolve() not in path.resolve().parents:
            raise DownloadError(f"refusing {repo}/{filename}: it resolves outside {self.models_dir}")
        return path

    # -- bookkeeping -----------------------------------------------------------------------------------
    def _job(self, key: str) -> _Job:
        with self._lock:
            job = self._jobs.get(key)
        if job is None:
            raise DownloadError(f"there is no download {key!r}")
        return job

    def _files(self, job: _Job) -> tuple[Path, Path, Path]:
        stem = hashlib.sha256(job.key.encode()).hexdigest()[:24]
        return tuple(self.downloads_dir / f"{stem}{ext}" for ext in (".part", ".json", ".lock"))

    def _load_saved(self) -> None:
        """Downloads left paused or failed by an earlier run (a running one was interrupted: paused)."""
        for state_file in sorted(self.downloads_dir.glob("*.json")):
            r = read_json(state_file, None)
            if r is None and state_file.is_file():  # unreadable: truncated or corrupt; its .part file stays
                moved = state_file.with_name(f"{state_file.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
                state_file.rename(moved)
                self.notices.append(f"A download's state file was damaged; it was moved to {moved}. "
                                    f"The part already downloaded was kept; start that download again.")
                continue
            try:
                self.destination(r["repo"], r["filename"])
                url = self.hub.file_url(r["repo"], r["filename"], r["revision"])  # never a URL read from disk
                job = _Job(r["repo"], r["filename"], r["revision"], url, int(r["size"]), r["sha256"], r["etag"],
                           "failed" if r["state"] == "failed" else "paused", r["error"])
            except (TypeError, KeyError, ValueError, DownloadError):
                continue  # not ours, or tampered with: leave it alone
            part = self._files(job)[0]
            if not part.exists() and self.destination(job.repo, job.filename).exists():
                state_file.unlink(missing_ok=True)  # moved into the library by a run killed before this cleanup
                continue
            job.downloaded = _size_of(part)
            self._jobs[job.key] = job

    def _launch(self, job: _Job, on_progress: ProgressCallback | None) -> None:
        part, state_file, lock_path = self._files(job)
        destination = self.destination(job.repo, job.filename)
        if destination.exists():  # e.g. finished by another process since this one read the saved state
            raise DownloadError(f"{job.key} is already downloaded ({destination})")
        self.downloads_dir.mkdir(parents=True, exist_ok=True)
        self._check_disk(job, _size_of(part))
        with self._lock:
            current = self._jobs.get(job.key)
            if current is not None and current.state in ACTIVE:  # started by another thread meanwhile: join it
                _add_callback(current, on_progress)
                return
            job.lock_file = _lock(lock_path, job.key)
            self._jobs[job.key] = job
            job.state = "running"
        _add_callback(job, on_progress)
        job.stop.clear()
        job.cancel, job.error, job.speed = False, None, 0.0
        write_json(state_file, job.record())
        self._notify(job)
        job.thread = threading.Thread(target=self._run, args=(job,), name=f"download {job.key}", daemon=True)
        job.thread.start()

    def _check_disk(self, job: _Job, have: int) -> None:
        needed = max(0, job.size - have)
        free = shutil.disk_usage(self.downloads_dir).free
        if free < needed + DISK_RESERVE_BYTES:
            raise DownloadError(f"not enough disk space for {job.key}: it needs {_gb(needed)} more, and "
                                f"{self.downloads_dir} has {_gb(free)} free (keeping {_gb(DISK_RESERVE_BYTES)} spare)")

    def _set_state(self, job: _Job, state: State, error: str | None = None) -> None:
        job.state, job.error = state, error
        self._notify(job)

    def _notify(self, job: _Job) -> None:
        progress = job.progress()
        for callback in list(job.callbacks):
            try:
                callback(progress)
            except Exception:
                log.exception("a download progress callback failed")

    def _discard(self, job: _Job) -> None:
        part, state_file, _ = self._files(job)
        part.unlink(missing_ok=True)
        state_file.unlink(missing_ok=True)
        job.downloaded = 0

    # -- the worker ------------------------------------------------------------------------------------
    def _run(self, job: _Job) -> None:
        part, state_file, _ = self._files(job)
        try:
            self._transfer_all(job, part, state_file)
            self._finish(job, part, state_file)
        except _Stop:
            if job.cancel:
                self._discard(job)
                self._set_state(job, "cancelled")
            else:
                write_json(state_file, job.record())
                self._set_state(job, "paused")
        except DownloadError as e:
            if part.exists():  # resumable: remember it across restarts
                write_json(state_file, {**job.record(), "state": "failed", "error": str(e)})
            else:
                state_file.unlink(missing_ok=True)
            self._set_state(job, "failed", str(e))
        except Exception as e:  # a bug or an OS error: report it on the download, never kill the app
            log.exception("download %s failed", job.key)
            self._set_state(job, "failed", f"{job.key}: {e}")
        finally:
            _unlock(job.lock_file)
            job.lock_file = None

    def _transfer_all(self, job: _Job, part: Path, state_file: Path) -> None:
        """Request until the partial file is complete, retrying transient failures from where it ends."""
        failures = restarts = 0
        while True:
            before = _size_of(part)
            try:
                if self._transfer(job, part, state_file):
                    return
            except _Restart:
                restarts += 1
                if restarts > self.max_retries:
                    raise DownloadError(f"{job.key}: the file keeps changing on the server; try again later") from None
            except _Retry as e:
                failures = 0 if _size_of(part) > before else failures + 1
                if failures > self.max_retries:
                    raise DownloadError(f"{job.key}: {e}; {_gb(_size_of(part))} of {_gb(job.size)} kept, "
                                        "resume to continue") from None
                if job.stop.wait(self.retry_wait * 2 ** max(0, failures - 1)):
                    raise _Stop from None

    def _transfer(self, job: _Job, part: Path, state_file: Path) -> bool:
        """One request for the rest of the file; True once the partial file holds ``size`` bytes."""
        offset = _size_of(part)
        if offset > job.size:
            _truncate(part)
            offset = 0
        if offset == job.size:
            return True
        headers = {"Accept-Encoding": "identity"}
        if self.hub.token:
            headers["Authorization"] = f"Bearer {self.hub.token}"  # httpx drops it on a redirect to a CDN
        if offset:
            headers["Range"] = f"bytes={offset}-"
        timeout = httpx2.Timeout(self.read_timeout, connect=min(self.read_timeout, 30.0))
        try:
            with get_session().stream("GET", job.url, headers=headers, timeout=timeout, follow_redirects=True) as r:
                offset = self._check_response(job, r, offset, part, state_file)
                self._receive(job, r, part, offset)
        except httpx2.TransportError as e:
            raise _Retry(f"the connection was lost ({type(e).__name__}: {e})") from None
        got = _size_of(part)
        if got < job.size:
            raise _Retry(f"the server ended the file early at {got} of {job.size} bytes")
        if got > job.size:
            self._discard(job)
            raise DownloadError(f"{job.key}: the server sent {got} bytes, more than the {job.size} expected; "
                                "the partial file was deleted")
        return True

    def _check_response(self, job: _Job, r: httpx2.Response, offset: int, part: Path, state_file: Path) -> int:
        """Decide from status, ETag and Content-Range where the body starts; returns that offset."""
        if r.status_code == 416:
            raise _Retry(f"the server has no bytes from {offset} on (416): its file is shorter than the "
                         f"{job.size} bytes the Hub lists")
        if r.status_code not in (200, 206):
            raise _status_error(job, r.status_code)
        etag = r.headers.get("ETag")
        if job.etag is not None and etag is not None and etag != job.etag:
            self._refresh(job)  # a new version of the file: its size and sha256 changed too
            _truncate(part)
            job.etag = etag
            write_json(state_file, job.record())
            if r.status_code == 206:
                raise _Restart
            return 0
        job.etag = etag or job.etag
        write_json(state_file, job.record())
        if r.status_code == 200:
            if offset:
                _truncate(part)  # the server ignored the range: start again from zero
            return 0
        start = _content_range_start(r.headers.get("Content-Range"))
        if start != offset:
            _truncate(part)
            raise _Restart
        return offset

    def _refresh(self, job: _Job) -> None:
        try:
            info = self.hub.file_info(job.repo, job.filename, job.revision)
        except HubError as e:
            raise _Retry(f"the file changed on the Hub and its new details could not be read: {e}") from None
        job.size, job.sha256 = info.size, info.sha256

    def _receive(self, job: _Job, r: httpx2.Response, part: Path, offset: int) -> None:
        job.downloaded = offset
        last_time, last_bytes = time.monotonic(), offset
        with open(part, "r+b" if part.exists() else "wb") as f:
            f.truncate(offset)
            f.seek(offset)
            for chunk in r.iter_bytes():
                if job.stop.is_set():
                    raise _Stop
                f.write(chunk)
                job.downloaded += len(chunk)
                now = time.monotonic()
                if now - last_time >= self.progress_interval:
                    rate = (job.downloaded - last_bytes) / max(now - last_time, 1e-6)
                    job.speed = rate if job.speed == 0 else 0.7 * job.speed + 0.3 * rate
                    last_time, last_bytes = now, job.downloaded
                    self._notify(job)

    def _finish(self, job: _Job, part: Path, state_file: Path) -> None:
        """Verify size, sha256 and GGUF header, then move the file into the library atomically."""
        self._set_state(job, "verifying")
        problem = None
        if _size_of(part) != job.size:
            problem = f"its size is {_size_of(part)} bytes, expected {job.size}"
        elif job.sha256 and (digest := _sha256(part)) != job.sha256:
            problem = f"its sha256 is {digest}, expected {job.sha256}"
        else:
            try:
                read_gguf(part).close()
            except ModelFormatError as e:
                problem = f"it is not a valid GGUF file ({e})"
        if problem:
            self._discard(job)
            raise DownloadError(f"{job.key} arrived corrupt: {problem}; it was deleted, download it again")
        destination = self.destination(job.repo, job.filename)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, destination)
        state_file.unlink(missing_ok=True)
        job.path, job.downloaded, job.speed = destination, job.size, 0.0
        self._set_state(job, "completed")


def _status_error(job: _Job, code: int) -> Exception:
    if code in (401, 403):
        return DownloadError(f"{job.key} needs permission ({code}): it is gated or private — accept its terms "
                             "on the Hub and set HF_TOKEN to an access token of that account")
    if code == 404:
        return DownloadError(f"{job.key} was not found on the Hub (404)")
    if code >= 500 or code in (408, 429):
        return _Retry(f"the server answered {code}")
    return DownloadError(f"{job.key}: the server answered {code}")


def _content_range_start(header: str | None) -> int | None:
    m = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", (header or "").strip())
    return int(m.group(1)) if m else None


def _settle(job: _Job) -> None:
    """Wait for a pause or cancel that is still unwinding, so the job's state is final."""
    if job.stop.is_set() and job.thread is not None:
        job.thread.join()


def _add_callback(job: _Job, callback: ProgressCallback | None) -> None:
    if callback is not None and callback not in job.callbacks:
        job.callbacks.append(callback)


def _lock(path: Path, key: str):
    """An exclusive lock held while a download runs, so two Hearth processes never write one partial file."""
    f = open(path, "a+")
    if fcntl is not None:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise DownloadError(f"{key} is already being downloaded by another Hearth window or process") from None
    return f


def _unlock(f) -> None:
    if f is not None:
        f.close()  # closing the file releases the flock


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _truncate(path: Path) -> None:
    if path.exists():
        os.truncate(path, 0)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
