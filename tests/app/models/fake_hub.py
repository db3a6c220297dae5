"""A local fake of the Hugging Face Hub endpoints Hearth uses, with switchable faults.

Serves on 127.0.0.1 (port chosen by the OS):

* ``GET /api/models?search=&filter=&limit=`` — model search (``HfApi.list_models``);
* ``GET /api/models/<repo>[/revision/<rev>]?blobs=true`` — model info with file sizes and LFS sha256
  (``HfApi.model_info(files_metadata=True)``);
* ``GET /api/models/<repo>/tree/<rev>`` — the repo tree with LFS oids (``HfApi.list_repo_tree``);
* ``HEAD|GET /<repo>/resolve/<rev>/<file>`` — file download with ``ETag``/``X-Linked-Etag``/``X-Repo-Commit``,
  optionally redirected to ``/cdn/...`` on the same or another origin, honouring ``Range`` as the Hub does:
  ``206 Partial Content`` with ``Content-Range`` for ``bytes=a-b`` and ``bytes=a-``, 416 past the end.
  Every request is logged (``requests``; ``ranges(file)`` and ``bytes_asked(file)`` for the file GETs), so a
  test can tell a header read from a download.

Faults (attributes of ``hub.faults``, each off by default): ``status`` (answer every resolve with it),
``cuts`` (each file GET takes the first number and closes the connection after that many body bytes,
though the headers promised more), ``wrong_body`` (same length,
different bytes), ``short_body`` (N bytes fewer, Content-Length matching), ``ignore_range`` (answer 200 with
the whole file), ``etag_salt`` (change the ETag), ``chunk_delay`` (seconds between 64 KiB chunks).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK = 1 << 16
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclasses.dataclass
class Faults:
    status: int | None = None
    cuts: list[int] = dataclasses.field(default_factory=list)
    wrong_body: bool = False
    short_body: int = 0
    ignore_range: bool = False
    etag_salt: str = ""
    chunk_delay: float = 0.0


@dataclasses.dataclass
class HubFile:
    source: bytes | Path
    sha256: str
    size: int
    lfs: bool = True

    def read(self, start: int, end: int) -> bytes:
        if isinstance(self.source, bytes):
            return self.source[start:end]
        with open(self.source, "rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclasses.dataclass
class Repo:
    files: dict[str, HubFile] = dataclasses.field(default_factory=dict)
    gated: bool = False
    downloads: int = 0


@dataclasses.dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    query: dict[str, list[str]]


class FakeHub:
    """The fake Hub; use as a context manager, then point ``HF_ENDPOINT`` at ``hub.url``."""

    def __init__(self, token: str = "hf_test_token", redirect: str = "none"):
        self.repos: dict[str, Repo] = {}
        self.faults = Faults()
        self.token = token
        self.redirect = redirect  # "none", "same-origin" or "cross-origin" (to http://localhost:<port>)
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add_file(self, repo: str, filename: str, data: bytes | Path, *, lfs: bool = True, gated: bool = False,
                 downloads: int = 0) -> HubFile:
        raw = data if isinstance(data, bytes) else None
        digest = hashlib.sha256(raw if raw is not None else Path(data).read_bytes()).hexdigest()
        size = len(raw) if raw is not None else Path(data).stat().st_size
        entry = self.repos.setdefault(repo, Repo())
        entry.gated, entry.downloads = entry.gated or gated, max(entry.downloads, downloads)
        entry.files[filename] = HubFile(data, digest, size, lfs)
        return entry.files[filename]

    def etag(self, f: HubFile) -> str:
        return f'"{f.sha256 if f.lfs else f.sha256[:40]}{self.faults.etag_salt}"'

    def log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def file_requests(self) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and ("/resolve/" in r.path or r.path.startswith("/cdn/"))]

    def ranges(self, filename: str) -> list[str | None]:
        """The ``Range`` header of every GET of ``filename`` (None: the whole file was asked for)."""
        return [r.headers.get("range") for r in self.file_requests() if r.path.endswith("/" + filename)]

    def bytes_asked(self, filename: str) -> int | None:
        """How many bytes of ``filename`` the GETs asked for in all, or None when one asked for the whole file
        or for everything from an offset on (``bytes=N-``)."""
        total = 0
        for header in self.ranges(filename):
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", header or "")
            if m is None:
                return None
            total += int(m.group(2)) - int(m.group(1)) + 1
        return total

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # clients hanging up mid-body is what the fault tests do


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.hub = hub
    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # -- routing ---------------------------------------------------------------------------------------
    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        self.hub.log(Request(self.command, path, {k.lower(): v for k, v in self.headers.items()}, query))
        if path == "/api/models":
            return self._search(query)
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/.*)?", path):
            return self._with_repo(m.group(1), lambda repo: self._json([_tree_entry(n, f) for n, f in repo.files.items()]))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            return self._with_repo(m.group(1), lambda repo: self._json(_model_info(m.group(1), repo, "blobs" in query)))
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(m.group(1), m.group(3), head)
        if m := re.fullmatch(r"/cdn/([^/]+/[^/]+)/(.+)", path):
            return self._serve_file(m.group(1), m.group(2), head)
        self._error(404, "RepoNotFound", "no such endpoint")

    def _with_repo(self, repo_id: str, respond) -> None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(401 if self.headers.get("Authorization") is None else 404, "RepoNotFound",
                               "Repository not found")
        if repo.gated and self.headers.get("Authorization") != f"Bearer {self.hub.token}":
            return self._error(401, "GatedRepo", "Access to model is restricted. You must have access to it.")
        respond(repo)

    def _search(self, query: dict) -> None:
        text = query.get("search", [""])[0].lower()
        limit = int(query.get("limit", ["1000"])[0])
        found = [{"id": rid, "modelId": rid, "downloads": repo.downloads, "likes": 1, "gated": repo.gated,
                  "private": False, "tags": ["gguf"], "lastModified": "2025-01-01T00:00:00.000Z"}
                 for rid, repo in sorted(self.hub.repos.items(), key=lambda kv: -kv[1].downloads)
                 if text in rid.lower()]
        self._json(found[:limit])

    def _resolve(self, repo_id: str, filename: str, head: bool) -> None:
        if self.hub.faults.status is not None:
            code = self.hub.faults.status
            return self._error(code, "GatedRepo" if code == 401 else "EntryNotFound" if code == 404 else None,
                               f"fake fault {code}")
        def respond(repo: Repo) -> None:
            if filename not in repo.files:
                return self._error(404, "EntryNotFound", "Entry not found")
            if self.hub.redirect == "none":
                return self._serve_file(repo_id, filename, head)
            host = "localhost" if self.hub.redirect == "cross-origin" else "127.0.0.1"
            f = repo.files[filename]
            self.send_response(302)
            self.send_header("Location", f"http://{host}:{self.server.server_address[1]}/cdn/{repo_id}/{quote(filename)}")
            self._file_headers(f)
            self.send_header("Content-Length", "0")
            self.end_headers()
        self._with_repo(repo_id, respond)

    # -- file bodies -----------------------------------------------------------------------------------
    def _serve_file(self, repo_id: str, filename: str, head: bool) -> None:
        repo = self.hub.repos.get(repo_id)
        f = repo.files.get(filename) if repo else None
        if f is None:
            return self._error(404, "EntryNotFound", "Entry not found")
        faults = self.hub.faults
        size = f.size - faults.short_body
        start, end, partial = self._byte_range(size)
        if start >= size and partial:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if partial else 200)
        self._file_headers(f)
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if not head:
            self._write_body(f, start, end)

    def _byte_range(self, size: int) -> tuple[int, int, bool]:
        header = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", header or "")
        if not m or self.hub.faults.ignore_range:
            return 0, size, False
        start = int(m.group(1))
        end = min(size, int(m.group(2)) + 1) if m.group(2) else size
        return start, end, True

    def _write_body(self, f: HubFile, start: int, end: int) -> None:
        faults = self.hub.faults
        limit = min(end, start + faults.cuts.pop(0)) if faults.cuts else end
        pos = start
        while pos < limit:
            stop = min(limit, pos + CHUNK)
            data = f.read(pos, stop)
            if faults.wrong_body:
                data = bytes(b ^ 0x5A for b in data)
            try:
                self.wfile.write(data)
                self.wfile.flush()
            except OSError:
                return
            pos = stop
            if faults.chunk_delay:
                time.sleep(faults.chunk_delay)
        if pos < end:  # cut: close without sending the rest the Content-Length promised
            self.close_connection = True

    # -- helpers ---------------------------------------------------------------------------------------
    def _file_headers(self, f: HubFile) -> None:
        etag = self.hub.etag(f)
        self.send_header("ETag", etag)
        self.send_header("X-Repo-Commit", COMMIT)
        if f.lfs:
            self.send_header("X-Linked-Etag", etag)
            self.send_header("X-Linked-Size", str(f.size))

    def _json(self, value) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, code: int, error_code: str | None, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(code)
        if error_code:
            self.send_header("X-Error-Code", error_code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _model_info(repo_id: str, repo: Repo, blobs: bool) -> dict:
    siblings = []
    for name, f in repo.files.items():
        sibling = {"rfilename": name}
        if blobs:
            sibling.update(size=f.size, blobId=f.sha256[:40])
            if f.lfs:
                sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
        siblings.append(sibling)
    return {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "gated": repo.gated, "private": False,
            "downloads": repo.downloads, "likes": 1, "tags": ["gguf"], "siblings": siblings}


def _tree_entry(name: str, f: HubFile) -> dict:
    entry = {"type": "file", "path": name, "size": f.size, "oid": f.sha256[:40]}
    if f.lfs:
        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
    return entry
