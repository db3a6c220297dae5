"""Library models served on demand: whether a model file can be loaded now, and the headless host that loads the
model a request names (one resident model at a time unless the memory check allows more).

The memory check is the engine's own (``engine.compatibility.check`` with ``engine.memory_estimate``): a model
that does not run on the backend, or whose estimate exceeds the memory available now (after what the resident
models would give back), is refused with the reason, which the API answers as 503.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from ..compatibility import check
from ..gguf_file import read_gguf
from ..memory_estimate import fit_verdict, system_memory
from ..model import Model
from ..scheduler import Request, RequestHandle
from ..thermal.monitor import ThermalMonitor
from .errors import APIError
from .host import SchedulerThread


def model_id(path: str | Path) -> str:
    """The id clients send for a model file: its file name without ``.gguf`` (as ``hearth serve --model``)."""
    return Path(path).name.removesuffix(".gguf")


def load_refusal(path: str | Path, backend: str, n_ctx: int | None, freed_bytes: int = 0,
                 available_bytes: int | None = None) -> str | None:
    """Why the model at ``path`` cannot be loaded now, or None when it can.

    Args:
        path: the GGUF file.
        backend: the backend it would load on ("auto" as ``engine.model.load`` picks).
        n_ctx: the context it would get (None: the engine's default).
        freed_bytes: memory the models that would be unloaded first hold.
        available_bytes: memory available now (default: this machine's, read now).
    """
    try:
        gguf = read_gguf(Path(path))
        verdict = check(gguf, backend, n_ctx or 4096, estimates="judged")
    except Exception as e:  # noqa: BLE001 - a file that cannot be read is a reason like any other
        return f"{model_id(path)} cannot be read: {e}"
    if not verdict.runs:
        return f"{model_id(path)} does not run here: {verdict.reason}"
    need = verdict.memory_bytes
    available = (system_memory().available_bytes if available_bytes is None else available_bytes) + freed_bytes
    if need is not None and fit_verdict(need, available) == "won't fit":
        return (f"{model_id(path)} needs about {need / 2**30:.1f} GB and {available / 2**30:.1f} GB are available: "
                f"it does not fit in memory now")
    return None


class LibraryHost:
    """The headless ``SequenceHost`` for ``hearth serve --library``: every library model by id, the one a request
    names loaded on demand, each loaded model's scheduler stepped on a ``SchedulerThread`` of its own.

    A model is loaded when a request names it; the others are unloaded first unless the memory check says both
    fit, and a model with requests still running is never unloaded (the request waits for nothing: it is
    answered 503 with the reason).

    Args:
        library: model id -> GGUF path.
        backend, n_ctx: how models are loaded.
        parallel: the most sequences decoding together per model.
        max_resident: the most models loaded at once (memory permitting).
        active: how many requests a loaded model has running (the server's count), so busy models stay.
        loader: ``engine.model.load`` unless a test fakes it.
        refusal: ``load_refusal`` unless a test fakes it.
        thermal: makes the thermal monitor of each model loaded (None: fixed limits).
    """

    def __init__(self, library: Mapping[str, str | Path], backend: str = "auto", n_ctx: int | None = None,
                 parallel: int = 16, max_resident: int = 2, active: Callable[[Model], int] = lambda model: 0,
                 loader: Callable[..., Model] | None = None, refusal: Callable[..., str | None] = load_refusal,
                 thermal: Callable[[], ThermalMonitor | None] = lambda: None):
        from ..model import load
        self.library = {name: Path(path) for name, path in library.items()}
        self.backend, self.n_ctx, self.parallel, self.max_resident = backend, n_ctx, parallel, max_resident
        self.active, self._load, self._refusal, self._thermal = active, loader or load, refusal, thermal
        self._resident: dict[str, SchedulerThread] = {}
        self._lock = threading.Lock()  # one load at a time; guards _resident
        self._started = False

    def model_ids(self) -> list[str]:
        return sorted(self.library)

    def acquire(self, name: str) -> Model:
        if name not in self.library:
            raise APIError(404, f"The model '{name}' is not in the library ({len(self.library)} models; "
                                f"GET /v1/models lists them)", param="model", code="model_not_found")
        with self._lock:
            if name in self._resident:
                return self._resident[name].model
            self._make_room(name)
            model = self._load(str(self.library[name]), backend=self.backend, n_ctx=self.n_ctx)
            thread = SchedulerThread(model, name, self.parallel, self._thermal())
            self._resident[name] = thread
            if self._started:
                thread.start()
            return model

    def _make_room(self, name: str) -> None:
        """Unload idle resident models until ``name`` fits beside the rest; 503 with the reason when it cannot."""
        path = self.library[name]
        if len(self._resident) < self.max_resident and self._refusal(path, self.backend, self.n_ctx) is None:
            return
        idle = [n for n, t in self._resident.items() if self.active(t.model) == 0]
        busy = [n for n in self._resident if n not in idle]
        freed = sum(_size(self.library[n]) for n in idle)
        reason = self._refusal(path, self.backend, self.n_ctx, freed_bytes=freed) if idle else None
        if reason is None and len(busy) >= self.max_resident:
            reason = f"{name} cannot be loaded while {', '.join(busy)} answer requests"
        if reason is None and not idle:
            reason = self._refusal(path, self.backend, self.n_ctx)
        if reason is not None:
            raise APIError(503, reason, code="model_not_loaded")
        for n in idle:
            thread = self._resident.pop(n)
            thread.close()
            thread.model.close()

    def submit(self, model: Model, request: Request) -> RequestHandle:
        return model.scheduler.submit(request)

    def is_current(self, model: Model) -> bool:
        return any(t.model is model for t in self._resident.values())

    @property
    def error(self) -> str | None:
        for name, thread in self._resident.items():
            if thread.error is not None and self._started:
                return f"{name}: {thread.error}"
        return None

    def start(self) -> None:
        with self._lock:
            self._started = True
            for thread in self._resident.values():
                thread.start()

    def close(self) -> None:
        with self._lock:
            for thread in self._resident.values():
                thread.close()
                thread.model.close()
            self._resident.clear()


def _size(path: Path) -> int:
    """What a model file's weights hold in memory, roughly: its size."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
