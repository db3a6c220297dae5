"""The app's API server: ``engine.serve`` on the app's own engine host, its settings, and its request log.

Requests run as sequences in the scheduler of the model the app has loaded, stepped on the engine thread beside
the chat's replies (``EngineWorker.pump``), so the chat and the API are batched together under the app's thermal
policy and the dashboard counts both. There is no second scheduler and no second copy of the model.

A request may name any library model. The loaded one answers at once; another is loaded in its place only when
nothing streams (no chat reply and no other API request), else the request is answered 409 with the reason; a
model that does not run here or does not fit in memory is answered 503 with the reason (``engine.serve.library``).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from engine.serve.cli import check_bind
from engine.serve.errors import APIError
from engine.serve.host import RequestRecord, ServedModel
from engine.serve.library import load_refusal, model_id
from engine.scheduler import Request, RequestHandle

from .qt_compat import emit

SETTINGS_KEY = "api_server"
LOAD_TIMEOUT_S = 300.0  # a model loaded for a request must be ready within this
Library = Callable[[], dict[str, str]]  # model id -> GGUF path, the library as it is now


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """What the Server page sets; kept in the app settings (the key never goes to a log)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str = ""
    allowed_origins: tuple[str, ...] = ()

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def check(self) -> None:
        """Raise ValueError for settings the server must not start with (another address without a key...)."""
        if not 0 < self.port < 65536:
            raise ValueError(f"the port must be between 1 and 65535, got {self.port}")
        check_bind(self.host, self.api_key or None)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "allowed_origins": list(self.allowed_origins)}

    @classmethod
    def from_dict(cls, data: object) -> ServerSettings:
        """Settings from what the store kept; unknown or malformed values fall back to the defaults."""
        data = data if isinstance(data, dict) else {}
        default = cls()
        origins = data.get("allowed_origins", ())
        return cls(enabled=bool(data.get("enabled", default.enabled)),
                   host=str(data.get("host") or default.host),
                   port=data["port"] if isinstance(data.get("port"), int) else default.port,
                   api_key=str(data.get("api_key") or ""),
                   allowed_origins=tuple(str(o) for o in origins) if isinstance(origins, list | tuple) else ())

    def __repr__(self) -> str:  # never show the key
        return (f"ServerSettings(enabled={self.enabled}, host={self.host!r}, port={self.port}, "
                f"api_key={'set' if self.api_key else 'none'}, allowed_origins={self.allowed_origins!r})")


def new_api_key() -> str:
    """A random key for the Server page's "New key" button."""
    return "hearth-" + secrets.token_urlsafe(24)


class AppSequences:
    """The ``engine.serve.host.SequenceHost`` of the app: the engine host's loaded model and scheduler.

    Args:
        host: the app's ``EngineHost``.
        library: the library's models by id (``model_id`` of their path).
        n_ctx: the context a model loaded for a request gets.
        active: how many API requests are running now (the server's count).
        refusal: ``engine.serve.library.load_refusal`` unless a test fakes it.
    """

    def __init__(self, host, library: Library, n_ctx: Callable[[], int], active: Callable[[], int] = lambda: 0,
                 refusal: Callable[..., str | None] = load_refusal):
        self.host, self.library, self.n_ctx, self.active, self.refusal = host, library, n_ctx, active, refusal
        self._load_lock = threading.Lock()

    def model_ids(self) -> list[str]:
        model = self.host.model
        loaded = [model_id(model.path)] if model is not None else []
        return loaded + sorted(set(self.library()) - set(loaded))

    def acquire(self, name: str):
        model = self.host.model
        if model is not None and model_id(model.path) == name:
            return model
        library = self.library()
        if name not in library:
            raise APIError(404, f"The model '{name}' is not in the app's library; GET /v1/models lists them",
                           param="model", code="model_not_found")
        with self._load_lock:
            return self._switch_to(name, library[name])

    def _switch_to(self, name: str, path: str):
        """Load ``path`` in the app's engine in place of its model, when nothing streams."""
        model = self.host.model
        if model is not None and model_id(model.path) == name:  # loaded by a request that waited before this one
            return model
        loaded = model_id(model.path) if model is not None else None
        if model is not None and (self.host.streaming or self.active() > 0):
            raise APIError(409, f"the app is answering with {loaded} now; {name} can be loaded when nothing "
                                f"streams (or name {loaded})", param="model", code="model_busy")
        reason = self.refusal(path, "auto", self.n_ctx(), freed_bytes=_file_size(model.path) if model else 0)
        if reason is not None:
            raise APIError(503, reason, param="model", code="model_not_loaded")
        self.host.load(path, self.n_ctx())
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            model = self.host.model
            if model is not None and str(model.path) == str(path):
                return model
            time.sleep(0.05)
        raise APIError(503, f"{name} did not load within {LOAD_TIMEOUT_S:g} s", code="model_not_loaded")

    def submit(self, model, request: Request) -> RequestHandle:
        handle = model.scheduler.submit(request)
        self.host.pump()
        return handle

    def is_current(self, model) -> bool:
        return self.host.model is model

    @property
    def error(self) -> str | None:
        return None

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


class ApiServer(QObject):
    """Starts and stops the app's API server (uvicorn on a thread of its own) and reports its requests.

    Args:
        host: the app's ``EngineHost``.
        store: where the settings are kept (``setting``/``set_setting``), or None.
        library: the library's models by id.
        n_ctx: the context a model loaded for a request gets.

    Signals:
        state_changed(dict): running (bool), base_url, active (requests running), error (why it is not running).
        request_logged(RequestRecord): a request was answered (on the GUI thread).
    """

    state_changed = Signal(object)
    request_logged = Signal(object)

    def __init__(self, host, store=None, library: Library = dict, n_ctx: Callable[[], int] = lambda: 4096,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.settings = ServerSettings.from_dict(store.setting(SETTINGS_KEY) if store is not None else None)
        self.served = ServedModel(AppSequences(host, library, n_ctx, active=lambda: self.served.active),
                                  max_queue=64)
        self.served.stats.on_record = lambda record: emit(self.request_logged, record)
        self._server = None  # uvicorn.Server while running
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self._ticker = QTimer(self)
        self._ticker.setInterval(500)
        self._ticker.timeout.connect(self.report)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def state(self) -> dict:
        return {"running": self.running, "base_url": self.settings.base_url, "active": self.served.active,
                "error": self.error, "settings": self.settings}

    def apply(self, settings: ServerSettings) -> None:
        """Keep ``settings`` and start, restart or stop the server as they say; a failure is in ``state``."""
        self.stop()
        self.settings = settings
        if self.store is not None:
            self.store.set_setting(SETTINGS_KEY, settings.to_dict())
        if settings.enabled:
            self.start()
        self.report()

    def start(self) -> None:
        """Bind and serve with the current settings; ``error`` says why when it could not."""
        import uvicorn

        from engine.serve.app import create_app

        self.error = None
        try:
            self.settings.check()
            sock = _bind(self.settings.host, self.settings.port)
        except (ValueError, OSError) as e:
            self.error = str(e)
            self.report()
            return
        app = create_app(self.served, api_key=self.settings.api_key or None,
                         allowed_origins=self.settings.allowed_origins, manage_lifetime=False)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="hearth-api-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            self.error = "the server did not start"
        self._ticker.start()
        self.report()

    def stop(self) -> None:
        """Stop serving: requests running are cancelled (their sequences end at the next step)."""
        if self._server is None:
            return
        self.served.stopping = True  # streams end now, so the connections close before the server's grace ends
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None
        self.served.stopping = False
        self._ticker.stop()
        self.report()

    def report(self) -> None:
        """Emit state_changed now (it is emitted twice a second while the server runs)."""
        emit(self.state_changed, self.state())


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket, so that a port in use is an error here rather than in the server's thread."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _file_size(path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


__all__ = ["ApiServer", "AppSequences", "RequestRecord", "ServerSettings", "new_api_key"]
