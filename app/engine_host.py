"""EngineHost: runs the engine worker on its own QThread, forwards requests to it and replaces it if it crashes.

The GUI thread talks to the worker only through this host: queued signals for work, and the worker's few
thread-safe direct calls (``offer``, ``request_stop``, ``stop_all``, ``note_shown``).
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.thermal import ThermalMonitor, default_provider

from .qt_compat import emit
from .replies import ReplyRequest
from .snapshot_cache import SnapshotCache
from .worker import EngineFactory, EngineWorker, load_engine_model, make_sampling_params


class EngineHost(QObject):
    """Runs an EngineWorker on a QThread, forwards requests to it as queued signals, and replaces it if it crashes.

    Signals:
        load_requested(str, int): path and n_ctx, to the worker.
        prompt_requested(ReplyRequest): a reply to generate, to the worker.
        unload_requested(): to the worker.
        pump_requested(): the API server submitted sequences to the loaded model's scheduler; to the worker, which
            steps them (beside the chat's replies) while any is left.
        activate_requested(object), save_state_requested(int, str, int, str, list, dict),
        restore_state_requested(int, str, int, str): to the worker.
        loaded(dict), unloaded(), load_failed(str, str), tokens(int, str), finished(int, dict),
        error(int, str), progress(str), state_saved(int, str, dict), state_restored(int, str, dict),
        state_failed(int, str, str), telemetry(EngineSample): forwarded from the worker.
        thermal_decided(PolicyDecision): the thermal policy changed the limits replies run under, and why.
        restarted(str): the worker crashed and was replaced; the text says what happened. Requests sent to the
            crashed worker and not yet answered then get an error, so none is left waiting for ever.
    """

    load_requested = Signal(str, int)
    prompt_requested = Signal(object)
    unload_requested = Signal()
    pump_requested = Signal()
    activate_requested = Signal(object)
    save_state_requested = Signal(int, str, int, str, object, object)
    restore_state_requested = Signal(int, str, int, str)
    loaded = Signal(object)
    unloaded = Signal()
    load_failed = Signal(str, str)
    tokens = Signal(int, str)
    finished = Signal(int, object)
    error = Signal(int, str)
    progress = Signal(str)
    restarted = Signal(str)
    state_saved = Signal(int, str, object)
    state_restored = Signal(int, str, object)
    state_failed = Signal(int, str, str)
    telemetry = Signal(object)
    thermal_decided = Signal(object)

    def __init__(self, engine_factory: EngineFactory = load_engine_model,
                 params_factory: Callable[[dict], object] = make_sampling_params, parent: QObject | None = None,
                 snapshots: SnapshotCache | None = None, thermal: ThermalMonitor | None = None):
        super().__init__(parent)
        self.thermal = thermal or ThermalMonitor(default_provider())  # outlives a crashed worker; used on its thread
        if self.thermal.on_decision is None:  # decided on the engine thread, delivered queued to the GUI thread
            self.thermal.on_decision = lambda decision: emit(self.thermal_decided, decision)
        self._engine_factory = engine_factory
        self._params_factory = params_factory
        self._snapshots = snapshots
        self._next_id = 0
        self._thread: QThread | None = None
        self._worker: EngineWorker | None = None
        self._last_load: tuple[str, int] | None = None
        self._shown: int | None = None
        self._unanswered: set[int] = set()  # request ids sent to the worker, until its finished or error arrives
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        self._thread = QThread()
        self._thread.setObjectName("hearth-engine")
        self._worker = EngineWorker(self._engine_factory, self._params_factory, self._snapshots, self.thermal)
        self._worker.moveToThread(self._thread)
        self._worker.note_shown(self._shown)
        w = self._worker
        links = [(self.load_requested, w.load), (self.prompt_requested, w.generate), (self.pump_requested, w.pump),
                 (self.unload_requested, w.unload), (w.crashed, self._on_crashed),
                 (self.activate_requested, w.activate), (self.save_state_requested, w.save_state),
                 (self.restore_state_requested, w.restore_state), (w.finished, self._on_answered),
                 (w.error, self._on_failed)]
        links += [(getattr(w, name), getattr(self, name)) for name in
                  ("loaded", "unloaded", "load_failed", "tokens", "finished", "error", "progress",
                   "state_saved", "state_restored", "state_failed", "telemetry")]
        self._connections = [signal.connect(slot) for signal, slot in links]
        self._thread.start()

    def _stop_thread(self) -> None:
        worker, thread = self._worker, self._thread
        if thread is None:
            return
        worker.stop_all()
        for connection in self._connections:
            # by connection handle: PySide6 6.12's signal.disconnect(slot) corrupts the refcount of False
            QObject.disconnect(connection)
        thread.quit()
        thread.wait()
        worker.shutdown()  # the thread has ended, so closing the model here races with nothing
        self._worker = self._thread = None

    # -- requests from the GUI thread -----------------------------------------------------------------
    def load(self, path: str, n_ctx: int) -> None:
        self._last_load = (path, n_ctx)
        emit(self.load_requested, path, n_ctx)

    def unload(self) -> None:
        self._last_load = None
        emit(self.unload_requested)

    def generate(self, path: str, n_ctx: int, messages: list[dict], options: dict) -> int:
        """Queue a reply; returns its request id (tokens/finished/error carry it). ``options``: max_tokens,
        the sampling parameters and, optionally, conversation_id, speculation and thermal_mode
        (``app.replies.ReplyRequest.from_options``)."""
        self._next_id += 1
        self._unanswered.add(self._next_id)
        self._last_load = (path, n_ctx)
        request = ReplyRequest.from_options(self._next_id, path, n_ctx, messages, options)
        if self._worker is None or not self._worker.offer(request):  # offered: it joins the replies streaming now
            emit(self.prompt_requested, request)
        return self._next_id

    def activate(self, conversation_id: int | None) -> None:
        """Tell the worker which conversation is shown, so it swaps that conversation's KV state in early."""
        self._shown = conversation_id
        if self._worker is not None:
            self._worker.note_shown(conversation_id)
        emit(self.activate_requested, conversation_id)

    def save_state(self, conversation_id: int, model_path: str, n_ctx: int, path: str, messages: list[dict],
                   conversation: dict) -> None:
        """Snapshot the conversation's state (``messages`` as for ``generate``) with ``conversation`` to ``path``."""
        emit(self.save_state_requested, conversation_id, model_path, n_ctx, path, [dict(m) for m in messages],
             conversation)

    def restore_state(self, conversation_id: int, model_path: str, n_ctx: int, path: str) -> None:
        emit(self.restore_state_requested, conversation_id, model_path, n_ctx, path)

    @property
    def model(self):
        """The loaded ``engine.model.Model``, or None; safe to read from any thread (the API server's)."""
        worker = self._worker
        return worker.model if worker is not None else None

    @property
    def streaming(self) -> bool:
        """Chat replies are queued or streaming (requests not yet answered)."""
        return bool(self._unanswered)

    def pump(self) -> None:
        """Have the engine thread step sequences submitted to the loaded model's scheduler; any thread."""
        emit(self.pump_requested)

    def stop(self, request_id: int) -> None:
        if self._worker is not None:
            self._worker.request_stop(request_id)

    def shutdown(self) -> None:
        """Stop any generation, close the model and end the thread (waits for the current chunk)."""
        self._stop_thread()

    @Slot(int, object)
    def _on_answered(self, request_id: int, stats: dict) -> None:
        self._unanswered.discard(request_id)

    @Slot(int, str)
    def _on_failed(self, request_id: int, message: str) -> None:
        self._unanswered.discard(request_id)

    @Slot(str)
    def _on_crashed(self, summary: str) -> None:
        self.restarts += 1
        self._stop_thread()
        self._start()
        emit(self.restarted, f"The engine hit an unexpected error and was restarted ({summary}).")
        for request_id in sorted(self._unanswered):  # queued to the worker that crashed: it will never answer
            emit(self.error, request_id, "The engine restarted before it could answer; send the message again.")
        self._unanswered.clear()
        emit(self.activate_requested, self._shown)
        if self._last_load is not None:
            emit(self.load_requested, *self._last_load)
