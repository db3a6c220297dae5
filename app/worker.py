"""The engine worker: a QObject on the engine thread that loads models and runs every reply through the model's
scheduler (app/reply_stream.py); the wiring between the engine and the window, and nothing more.

The GUI thread talks to it through queued signals (app/engine_host.py) and a few thread-safe direct calls:
``request_stop`` (and ``stop_all``), which set a reply's Stop flag, checked by the engine every token and between
prefill chunks; ``offer``, which gives a new request to the replies streaming now so it joins them at the next step
instead of waiting in the queue; ``note_shown``, the conversation on screen, whose reply decodes first; and
``model``, the loaded model, whose scheduler the app's API server submits its sequences to (``pump`` then steps
them, beside any reply, on this thread).
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable

import psutil
from PySide6.QtCore import QObject, Signal, Slot

from engine.backends import BackendUnavailableError
from engine.chat_template import TemplateError
from engine.context import ContextOverflowError
from engine.gguf_file import ModelFormatError, touch_tensors
from engine.model import CHAT_PREFILL_CHUNK
from engine.remote import RemoteModel
from engine.sampling import NonFiniteLogitsError
from engine.thermal import Mode, ThermalMonitor, default_provider

from .paths import file_name
from .qt_compat import emit
from .replies import ReplyRequest, ReplyStats
from .reply_stream import SHOWN_PRIORITY, Hooks, Reply, ReplyLoop
from .snapshot_cache import ConversationStates, SnapshotCache
from .speculation import Speculators, speculation_stats
from .telemetry import EngineProbe

# about the file, the prompt or the machine; anything else may have left the engine inconsistent. A model that
# computes NaN is a property of its file: a restart would load it and fail the same way.
EXPECTED_ERRORS = (ModelFormatError, BackendUnavailableError, ContextOverflowError, TemplateError, OSError,
                   NonFiniteLogitsError)

EngineFactory = Callable[[str, int], object]  # (gguf path, n_ctx) -> engine.model.Model


def load_engine_model(path: str, n_ctx: int):
    """The real engine factory: ``engine.model.load`` with automatic backend choice."""
    import engine.model
    return engine.model.load(path, backend="auto", n_ctx=n_ctx)


def make_sampling_params(sampling: dict):
    """The real params factory: ``engine.sampling.SamplingParams`` from a reply's sampling options."""
    from engine.sampling import SamplingParams
    return SamplingParams(**sampling)


def thermal_mode(value: str | None) -> Mode | None:
    """The thermal mode a request asks for ("performance", "balanced", "cool"); None (or unknown) keeps the current."""
    try:
        return Mode(value) if value is not None else None
    except ValueError:
        return None


def classify(exc: BaseException) -> bool:
    """True when ``exc`` says something about the user's input and the worker itself is still sound."""
    return isinstance(exc, EXPECTED_ERRORS)


def describe(exc: BaseException) -> str:
    """A readable one-paragraph message for an engine exception."""
    if isinstance(exc, MemoryError):
        return "Not enough memory for this model or context length. Try a smaller context length or model."
    text = str(exc).strip() or type(exc).__name__
    return text[0].upper() + text[1:] if text else text


class EngineWorker(QObject):
    """Owns one loaded model and runs every reply through its scheduler; lives on the engine thread and never
    touches a widget.

    Signals:
        loaded(dict): a model is ready: path, name, n_ctx, arch, backend, notices, sha256, and memory: rss_before
            and rss_after the load (bytes; with the CPU backend every weight page is touched first) and the estimate.
        unloaded(): the model was closed.
        load_failed(str, str): path and a readable reason.
        tokens(int, str): request id and the reply text of one scheduler step, emitted as soon as it is decoded.
        finished(int, dict): request id and stats (``app.replies.ReplyStats.as_dict``: tokens, timings,
            finish_reason, dropped, n_ctx, ``batched`` when it decoded beside another reply; with speculative
            decoding its figures, ``app.speculation.speculation_stats``, and ``speculation_notice`` when the
            chosen draft model could not be used).
        error(int, str): request id and a readable reason the request failed.
        progress(str): what the engine is doing now, for the status line.
        crashed(str): an unexpected exception left the worker in doubt; the host replaces it.
        state_saved(int, str, dict): conversation id, snapshot path, and tokens/bytes saved.
        state_restored(int, str, dict): conversation id, snapshot path, and tokens restored.
        state_failed(int, str, str): conversation id, snapshot path and the engine's reason it was not saved/used.
        telemetry(EngineSample): phase, throughput, KV cache and memory, on every change and twice a second
            while a reply streams (app/telemetry.py).
    """

    loaded = Signal(object)
    unloaded = Signal()
    load_failed = Signal(str, str)
    tokens = Signal(int, str)
    finished = Signal(int, object)
    error = Signal(int, str)
    progress = Signal(str)
    crashed = Signal(str)
    state_saved = Signal(int, str, object)
    state_restored = Signal(int, str, object)
    state_failed = Signal(int, str, str)
    telemetry = Signal(object)

    def __init__(self, engine_factory: EngineFactory = load_engine_model,
                 params_factory: Callable[[dict], object] = make_sampling_params,
                 snapshots: SnapshotCache | None = None, thermal: ThermalMonitor | None = None):
        super().__init__()
        self._probe = EngineProbe(lambda sample: emit(self.telemetry, sample))
        self._monitor = thermal or ThermalMonitor(default_provider())
        self._engine_factory = engine_factory
        self._params_factory = params_factory
        self._states = ConversationStates(snapshots)
        self._speculators = Speculators(engine_factory, lambda text: emit(self.progress, text))
        self._shown: int | None = None  # the conversation the window shows; its state is restored after a load
        self._model = None
        self._model_key: tuple[str, int] | None = None
        self._stopped: set[int] = set()  # request ids the user stopped
        self._stopped_through = -1  # every request id up to this one is stopped (shutdown)
        self._halted = threading.Event()  # shutting down: stop stepping the API's sequences too
        self._running: dict[int, Reply] = {}  # replies in the scheduler, by request id (Stop sets their flag)
        self._lock = threading.Lock()  # guards _busy and _offers, shared with the GUI thread
        self._busy = False  # in generate: requests offered now join the running replies
        self._offers: list[ReplyRequest] = []  # offered while busy, oldest first
        self._shown_now: int | None = None  # the conversation on screen, told directly (the queue waits)
        self._speculated: tuple[Reply, object, str, str | None] | None = None  # the reply drafting, its speculator

    # -- called from the GUI thread --------------------------------------------------------------------
    def request_stop(self, request_id: int) -> None:
        """Stop request ``request_id``; thread-safe."""
        self._stopped.add(request_id)
        reply = self._running.get(request_id)
        if reply is not None:
            reply.cancel.set()

    def stop_all(self) -> None:
        """Stop every request, running or queued; thread-safe."""
        self._stopped_through = 1 << 62
        self._halted.set()
        for reply in list(self._running.values()):
            reply.cancel.set()

    def offer(self, request: ReplyRequest) -> bool:
        """Give a new request to the replies streaming now, to run beside them when it is for the same model
        (or right after them); False when nothing streams and the request must be sent as a queued call."""
        with self._lock:
            if not self._busy:
                return False
            self._offers.append(request)
            return True

    def note_shown(self, conversation_id: int | None) -> None:
        """The conversation on screen, for the priorities of replies running together; thread-safe."""
        self._shown_now = conversation_id

    @property
    def model(self):
        """The loaded ``engine.model.Model`` or None; thread-safe to read (it changes only on this thread)."""
        return self._model

    # -- slots, run on the engine thread ------------------------------------------------------------
    @Slot(str, int)
    def load(self, path: str, n_ctx: int) -> None:
        try:
            self._ensure_model(path, n_ctx)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message; nothing is left loaded
            self._close_model()
            emit(self.load_failed, path, describe(exc))

    @Slot()
    def unload(self) -> None:
        if self._model is not None:
            self._close_model()
            emit(self.unloaded)

    @Slot(object)
    def activate(self, conversation_id: int | None) -> None:
        """The window shows this conversation: swap its KV state in now (saving the outgoing one)."""
        self._shown = conversation_id
        self._switch(conversation_id)

    @Slot(int, str, int, str, object, object)
    def save_state(self, conversation_id: int, model_path: str, n_ctx: int, path: str, messages: list,
                   conversation) -> None:
        """Write a snapshot of the conversation (``messages`` prefilled first, reusing the cached prefix)."""
        try:
            self._ensure_model(model_path, n_ctx)
            self._switch(conversation_id)
            emit(self.progress, "Saving the conversation's state…")
            self._model.next_token_logits(self._model.chat_ids(messages))
            self._states.changed(conversation_id)
            session = self._model.save_session(path, conversation=conversation)
        except Exception as exc:  # noqa: BLE001 - the engine's reason is shown; a save never breaks chat
            emit(self.state_failed, conversation_id, path, describe(exc))
            return
        emit(self.state_saved, conversation_id, path, {"tokens": len(session.tokens), "bytes": _size(path)})

    @Slot(int, str, int, str)
    def restore_state(self, conversation_id: int, model_path: str, n_ctx: int, path: str) -> None:
        """Load a snapshot as the state of ``conversation_id``; state_failed carries the engine's reason."""
        try:
            self._ensure_model(model_path, n_ctx)
            self._switch(conversation_id)
            emit(self.progress, "Restoring the conversation's state…")
            session = self._model.load_session(path)
        except Exception as exc:  # noqa: BLE001 - SessionError and any load failure: the text is imported anyway
            emit(self.state_failed, conversation_id, path, describe(exc))
            return
        info = {"restored_from": "file", "restored_tokens": len(session.tokens)}
        self._states.changed(conversation_id, info)
        emit(self.state_restored, conversation_id, path, {"tokens": len(session.tokens)})

    @Slot(object)
    def generate(self, request: ReplyRequest) -> None:
        """Stream a reply (and every reply ``offer``ed for the same model meanwhile, beside it); requests for
        another model run after them."""
        with self._lock:
            self._busy = True
        try:
            self._serve(request)
        finally:
            self._serve_offers()

    @Slot()
    def pump(self) -> None:
        """Step the loaded model's scheduler while it holds sequences that are no reply (the API server's),
        with every reply offered meanwhile beside them; nothing to do while ``generate`` steps it anyway."""
        with self._lock:
            if self._busy:
                return
            self._busy = True
        try:
            if self._model is not None and self._model.scheduler.has_work:
                self._step(None, ReplyLoop(self._model.scheduler, self._hooks()))
                self._probe.model_changed(self._model)  # the dashboard goes back to idle
        finally:
            self._serve_offers()

    def _serve_offers(self) -> None:
        """Serve the requests offered while busy, oldest first, then stop being busy."""
        while True:
            with self._lock:
                if not self._offers:
                    self._busy = False
                    return
                offer = self._offers.pop(0)
            self._serve(offer)

    def _is_stopped(self, request_id: int) -> bool:
        return request_id in self._stopped or request_id <= self._stopped_through

    def _serve(self, request: ReplyRequest) -> None:
        """Load the model if needed, start ``request`` in its scheduler and step it until every reply has ended."""
        if self._is_stopped(request.request_id):
            emit(self.finished, request.request_id, ReplyStats("cancelled", 0).as_dict())
            return
        try:
            self._ensure_model(request.path, request.n_ctx)
        except Exception as exc:  # noqa: BLE001
            self._close_model()
            emit(self.load_failed, request.path, describe(exc))
            emit(self.error, request.request_id, f"Could not load the model: {describe(exc)}")
            return
        if self._is_stopped(request.request_id):  # stopped while the model loaded
            emit(self.finished, request.request_id, ReplyStats("cancelled", 0).as_dict())
            return
        self._step(request, ReplyLoop(self._model.scheduler, self._hooks()))

    def _step(self, request: ReplyRequest | None, loop: ReplyLoop) -> None:
        """Start ``request`` (None: only step what the scheduler holds) and run ``loop`` to its end; an
        unexpected exception closes the model and reports a crash."""
        try:
            if request is not None:
                self._switch(request.conversation_id)
                emit(self.progress, "Reading the conversation…")
                self._start(request, loop)
            loop.run()
        except Exception as exc:  # noqa: BLE001
            self._probe.model_changed(self._model)  # back to idle (or "none" once closed below)
            if request is not None and request.request_id not in self._running:  # (the loop told its replies)
                emit(self.error, request.request_id, describe(exc))
            if not classify(exc):
                self._close_model()
                emit(self.crashed, _summary(exc))
        finally:
            self._running.clear()
            self._speculated = None

    def _start(self, request: ReplyRequest, loop: ReplyLoop) -> None:
        """Submit ``request`` to the model's scheduler and follow it in ``loop``. The first reply goes on in the
        model's resident cache (its conversation's state) and may speculate; replies that join it get caches of
        their own and decode plainly (one model pass per step serves them all)."""
        model, alone = self._model, not loop.replies
        local = not isinstance(model, RemoteModel)  # a remote server speculates (or not) on its own
        speculator, notice = (self._speculators.for_reply(model, request.speculation) if alone and local
                              else (None, None))
        mode = thermal_mode(request.thermal_mode)
        if mode is not None and mode != self._monitor.policy.mode:
            self._monitor.set_mode(mode)
        chunk = min(self._monitor.limits().prefill_chunk, CHAT_PREFILL_CHUNK)
        cancel = threading.Event()
        dropped, handle = model.start_chat(list(request.messages), self._params_factory(request.sampling),
                                           request.max_tokens, priority=self._priority(request.conversation_id),
                                           prefill_chunk=chunk, speculation=speculator, cancel=cancel,
                                           template_vars=request.template_vars)
        reply = Reply(request.request_id, request.conversation_id, handle, cancel, dropped)
        self._running[request.request_id] = reply
        if self._is_stopped(request.request_id):
            cancel.set()
        loop.add(reply)
        if alone:
            self._speculated = (reply, speculator, self._speculators.method, notice)
            self._probe.started(model, request.request_id, speculator, self._speculators.method, chunk)
        else:
            emit(self.progress, "Answering several conversations at once…")

    def _hooks(self) -> Hooks:
        model = self._model
        return Hooks(tokens=lambda rid, text: emit(self.tokens, rid, text), finished=self._finished,
                     failed=self._failed, shown=lambda: self._shown_now,
                     admit=self._admit_offers, event=lambda reply, event: self._probe.event(model, event),
                     sample=lambda rid, rate, batch: self._probe.batched(model, rid, rate, batch),
                     halted=self._halted.is_set)

    def _finished(self, reply: Reply, reason: str) -> None:
        """A reply ended: its stats, with the speculation figures and the snapshot note of the resident reply."""
        self._running.pop(reply.request_id, None)
        extra = self._model.thinking_stats(len(reply.tokens), reply.handle.prompt_ids + tuple(reply.tokens))
        if self._speculated is not None and self._speculated[0] is reply:
            _, speculator, method, notice = self._speculated
            extra.update(self._states.take_note() or {})
            self._states.changed(reply.conversation_id)
            self._probe.finished(self._model, reply.last)
            if speculator is not None and reply.last is not None:
                extra.update(speculation_stats(speculator, method, reply.last.decode_tps))
            if notice:
                extra["speculation_notice"] = notice
        emit(self.finished, reply.request_id, reply.stats(reason, self._model.n_ctx, self._model.name, extra).as_dict())

    def _failed(self, request_id: int, exc: Exception) -> None:
        emit(self.error, request_id, describe(exc))
        if isinstance(self._model, RemoteModel):  # the dashboard's remote card counts the error now
            self._probe.model_changed(self._model)

    def _admit_offers(self, loop: ReplyLoop) -> None:
        """Start the offered requests for this model in ``loop``; the others wait for the next generate."""
        with self._lock:
            if not self._offers:
                return
            mine = [o for o in self._offers if o.model_key == self._model_key]
            self._offers = [o for o in self._offers if o.model_key != self._model_key]
        for request in mine:
            if self._is_stopped(request.request_id):
                emit(self.finished, request.request_id, ReplyStats("cancelled", 0).as_dict())
                continue
            try:
                self._start(request, loop)
            except Exception as exc:  # noqa: BLE001 - a bad prompt or template fails its own request only
                emit(self.error, request.request_id, describe(exc))

    def _priority(self, conversation_id: int | None) -> int:
        return SHOWN_PRIORITY if conversation_id is not None and conversation_id == self._shown_now else 0

    def shutdown(self) -> None:
        """Keep the live conversation's state on disk for the next run, then close the model; called by the host
        once the engine thread has ended."""
        if self._model is not None:
            self._states.detach(tier="disk")
        self._close_model()

    # -- internals ---------------------------------------------------------------------------------------
    def _ensure_model(self, path: str, n_ctx: int) -> None:
        if self._model is not None and self._model_key == (path, n_ctx):
            return
        if self._model is not None:
            self._states.detach()
        self._close_model()
        emit(self.progress, f"Loading {file_name(path)}…")
        rss_before = _rss()
        model = self._engine_factory(path, n_ctx)
        self._model, self._model_key = model, (path, n_ctx)
        model.set_monitor(self._monitor)
        memory = measure_load(model, rss_before)
        if not isinstance(model, RemoteModel):  # a remote model's KV state is on its server: nothing to snapshot
            self._states.attach(model)
        emit(self.loaded, {"path": path, "name": model.name, "n_ctx": model.n_ctx,
                          "compute": getattr(model.backend, "compute_note", None),
                          "arch": getattr(model.config, "arch", ""), "notices": list(model.notices),
                          "backend": getattr(model.backend, "name", ""), "sha256": model.sha256,
                          "reasoning": model.reasoning.to_dict(), **memory, **remote_info(model),
                          **chat_template_info(model)})
        self._probe.model_changed(model)
        self._switch(self._shown)

    def _switch(self, conversation_id: int | None) -> None:
        if self._model is not None and conversation_id is not None and conversation_id != self._states.owner:
            restored = self._states.switch(conversation_id)
            if restored:
                emit(self.progress, f"Restored the conversation's state ({restored['restored_tokens']:,} tokens "
                                    f"from {restored['restored_from']})")
            self._probe.model_changed(self._model)  # the KV cache now holds that conversation

    def _close_model(self) -> None:
        self._speculators.close()
        model, self._model, self._model_key = self._model, None, None
        if model is not None:
            try:
                model.close()
            except Exception:  # noqa: BLE001 - closing a broken model must not hide the original error
                pass
            self._probe.model_changed(None)


def measure_load(model, rss_before: int) -> dict:
    """RSS before and after a load next to the engine's estimate; with the CPU backend, which memory-maps the
    weights, every weight page is touched first so the measurement holds the weights (the first answer would
    page them in anyway)."""
    if getattr(model.backend, "name", "") == "cpu":
        touch_tensors(model.gguf)  # with the GIL released: the GUI thread keeps running
    try:
        from engine.memory_estimate import estimate_memory
        e = estimate_memory(model.gguf, model.n_ctx, backend=model.backend.name)
        estimate = {"weights": e.weights_bytes, "kv_cache": e.kv_cache_bytes, "overhead": e.overhead_bytes,
                    "total": e.total_bytes}
    except Exception:  # noqa: BLE001 - an estimate is information; it never fails a load (MLX is not modelled)
        estimate = None
    return {"rss_before": rss_before, "rss_after": _rss(), "estimate": estimate}


def chat_template_info(model) -> dict:
    """For a model read from a GGUF file, whether the file has a chat template (the window labels a base model
    from it without reading the file again on the GUI thread); nothing for other models."""
    import engine.model
    if not isinstance(model, engine.model.Model):
        return {}
    return {"chat_template": any(k == "tokenizer.chat_template" or k.startswith("tokenizer.chat_template.")
                                 for k in model.gguf.metadata)}


def remote_info(model) -> dict:
    """For a remote model, what the window shows and greys out: its endpoint, what it supports, what it cannot do."""
    if not isinstance(model, RemoteModel):
        return {}
    return {"remote": {"endpoint": model.endpoint.root, "model_id": model.model_id,
                       "capabilities": model.capabilities.to_dict()}, "unsupported": dict(model.unsupported)}


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _size(path: str) -> int:
    return os.path.getsize(path)


def _summary(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" at {file_name(frame[0].filename)}:{frame[0].lineno}" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"
