"""The engine worker: a QObject on its own QThread that loads models and streams replies; and its host.

The GUI thread talks to the worker through queued signals, and a few thread-safe direct calls: ``request_stop``
(and ``stop_all``), which mark a request stopped for the generation loop to see at its next token and call
``Model.cancel`` (documented thread-safe by the engine) so a long prefill stops at its next chunk too; ``offer``,
which hands a new request to the replies streaming now so it can join them (app/batched.py) instead of waiting
in the queue; and ``note_shown``, the conversation on screen, whose reply decodes first.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable

import psutil
from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.backends import BackendUnavailableError
from engine.chat_template import TemplateError
from engine.context import ContextOverflowError
from engine.gguf_file import ModelFormatError
from engine.model import CHAT_PREFILL_CHUNK
from engine.sampling import NonFiniteLogitsError
from engine.scheduler import decode_load
from engine.thermal import Mode, StreamPacer, ThermalMonitor, default_provider

from .batched import COALESCE_S, SHOWN_PRIORITY, BatchedReply, BatchRunner, Hooks
from .paths import file_name
from .qt_compat import emit
from .snapshot_cache import ConversationStates, SnapshotCache
from .speculation import SpeculationChoice, Speculators, speculation_stats
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


def make_sampling_params(options: dict):
    from engine.sampling import SamplingParams
    return SamplingParams(**options)


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
    """Owns one loaded model and runs it; lives on the engine thread and never touches a widget.

    Signals:
        loaded(dict): a model is ready: path, name, n_ctx, arch, backend, notices, sha256, and memory: rss_before
            and rss_after the load (bytes; with the CPU backend every weight page is touched first) and the estimate.
        unloaded(): the model was closed.
        load_failed(str, str): path and a readable reason.
        tokens(int, str): request id and new reply text, coalesced to one emit per ~30 ms.
        finished(int, dict): request id and stats (tokens, timings, finish_reason, dropped, n_ctx; with speculative
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
        self._pacer = StreamPacer(thermal or ThermalMonitor(default_provider()))
        self._engine_factory = engine_factory
        self._params_factory = params_factory
        self._states = ConversationStates(snapshots)
        self._speculators = Speculators(engine_factory, lambda text: emit(self.progress, text))
        self._shown: int | None = None  # the conversation the window shows; its state is restored after a load
        self._model = None
        self._model_key: tuple[str, int] | None = None
        self._stopped: set[int] = set()  # request ids the user stopped
        self._stopped_through = -1  # every request id up to this one is stopped (shutdown)
        self._running = 0  # the lone reply streaming through Model.chat, whose prefill Model.cancel interrupts
        self._lock = threading.Lock()  # guards _busy and _offers, shared with the GUI thread
        self._busy = False  # in generate: requests offered now join the running reply
        self._offers: list[tuple] = []  # generate arguments offered while busy, oldest first
        self._shown_now: int | None = None  # the conversation on screen, told directly (the queue waits)

    # -- called from the GUI thread --------------------------------------------------------------------
    def request_stop(self, request_id: int) -> None:
        """Stop request ``request_id``; thread-safe."""
        self._stopped.add(request_id)
        model = self._model
        if model is not None and request_id == self._running:
            model.cancel()

    def stop_all(self) -> None:
        """Stop every request, running or queued; thread-safe."""
        self._stopped_through = 1 << 62
        model = self._model
        if model is not None:
            model.cancel()

    def offer(self, request_id: int, path: str, n_ctx: int, messages: list, options: dict) -> bool:
        """Give a new request to the replies streaming now, to run beside them when it is for the same model
        (or right after them); False when nothing streams and the request must be sent as a queued call."""
        with self._lock:
            if not self._busy:
                return False
            self._offers.append((request_id, path, n_ctx, messages, options))
            return True

    def note_shown(self, conversation_id: int | None) -> None:
        """The conversation on screen, for the priorities of replies running together; thread-safe."""
        self._shown_now = conversation_id

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

    @Slot(int, str, int, object, object)
    def generate(self, request_id: int, path: str, n_ctx: int, messages: list, options: dict) -> None:
        """Stream a reply to ``messages``; options: max_tokens, the sampling parameters and, optionally,
        conversation_id (whose KV state is swapped in first) and speculation (``SpeculationChoice.from_options``).

        Requests ``offer``ed meanwhile for the same model join it (app/batched.py); the others run after it."""
        with self._lock:
            self._busy = True
        try:
            self._generate(request_id, path, n_ctx, messages, options)
        finally:
            while True:
                with self._lock:
                    if not self._offers:
                        self._busy = False
                        break
                    offer = self._offers.pop(0)
                self._generate(*offer)

    def _is_stopped(self, request_id: int) -> bool:
        return request_id in self._stopped or request_id <= self._stopped_through

    def _generate(self, request_id: int, path: str, n_ctx: int, messages: list, options: dict) -> None:
        options = dict(options)
        conversation_id = options.pop("conversation_id", None)
        if self._is_stopped(request_id):
            emit(self.finished, request_id, {"finish_reason": "cancelled", "generated_tokens": 0})
            return
        try:
            self._ensure_model(path, n_ctx)
        except Exception as exc:  # noqa: BLE001
            self._close_model()
            emit(self.load_failed, path, describe(exc))
            emit(self.error, request_id, f"Could not load the model: {describe(exc)}")
            return
        if self._is_stopped(request_id):  # stopped while the model loaded: Model.cancel could not reach it
            emit(self.finished, request_id, {"finish_reason": "cancelled", "generated_tokens": 0})
            return
        try:
            self._switch(conversation_id)
            self._running = request_id
            self._stream(request_id, messages, options, conversation_id)
        except Exception as exc:  # noqa: BLE001
            self._probe.model_changed(self._model)  # back to idle (or "none" once closed below)
            emit(self.error, request_id, describe(exc))
            if not classify(exc):
                self._close_model()
                emit(self.crashed, _summary(exc))
        finally:
            self._running = 0

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
        memory = measure_load(model, rss_before)
        self._states.attach(model)
        emit(self.loaded, {"path": path, "name": model.name, "n_ctx": model.n_ctx,
                          "arch": getattr(model.config, "arch", ""), "notices": list(model.notices),
                          "backend": getattr(model.backend, "name", ""), "sha256": model.sha256,
                          "reasoning": model.reasoning.to_dict(), **memory})
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

    def _stream(self, request_id: int, messages: list, options: dict, conversation_id: int | None) -> None:
        max_tokens = int(options.pop("max_tokens", 512))
        template_vars = options.pop("template_vars", None)
        speculator, notice = self._speculators.for_reply(self._model,
                                                         SpeculationChoice.from_options(options.pop("speculation", None)))
        chunk = self._pacer.begin(thermal_mode(options.pop("thermal_mode", None)), speculator, CHAT_PREFILL_CHUNK)
        emit(self.progress, "Reading the conversation…")
        self._probe.started(self._model, request_id, speculator, self._speculators.method, chunk)
        dropped, events = self._model.chat(messages, params=self._params_factory(options), max_tokens=max_tokens,
                                           overflow="drop_oldest", prefill_chunk=chunk, speculation=speculator,
                                           template_vars=template_vars)
        try:
            last, hand_over = self._emit_coalesced(request_id, events, timed=speculator is None)
        finally:
            events.close()  # runs the engine's clean-up now, also when we stopped early
            note = self._states.take_note()
            self._states.changed(conversation_id)
        if hand_over:  # another request for this model arrived: go on together
            self._running = 0
            self._probe.finished(self._model, last)
            self._run_batched(BatchedReply(request_id, conversation_id, self._model.continuation(
                max_tokens - last.generated_tokens, self._priority(conversation_id)), dropped, before=last))
            self._states.changed(conversation_id)
            return
        timing = self._probe.finished(self._model, last)
        stats = {**self._stats(last, dropped, request_id), **(note or {}), **timing}
        if last is not None:
            stats.update(self._model.thinking_stats(last.generated_tokens))
        if speculator is not None and last is not None:  # (cancelled during prefill: the stats are the last reply's)
            stats.update(speculation_stats(speculator, self._speculators.method, last.decode_tps))
        if notice:
            stats["speculation_notice"] = notice
        emit(self.finished, request_id, stats)

    def _emit_coalesced(self, request_id: int, events, timed: bool = True):
        """Emit the events' text in batches at most COALESCE_S apart; stop when asked. Returns the last event, and
        True when it stopped to hand the reply over because a request for this model was offered meanwhile.

        Between tokens the thermal pacer rests if the policy says so; with ``timed`` each token's time also feeds
        its drift detector (not with speculation, whose tokens arrive several per verify pass)."""
        pending, last_emit, last, rested, hand_over = "", time.monotonic(), None, 0.0, False
        stopped = lambda: self._is_stopped(request_id)  # noqa: E731
        for event in events:
            if last is not None:  # the time between two tokens holds the rest taken after the first: not compute
                seconds = event.decode_s - last.decode_s - rested if timed else None
                rested = self._pacer.step(seconds, decode_load(1, event.prompt_tokens + event.index), stopped)
            last = event
            self._probe.event(self._model, event)
            pending += event.text
            if stopped():
                break
            if self._offers:  # (read without the lock: an offer missed now is seen at the next token)
                self._answer_stopped_offers()
            if event.finish_reason is None and self._offers and self._compatible_offer():
                hand_over = True
                break
            if pending and time.monotonic() - last_emit >= COALESCE_S:
                emit(self.tokens, request_id, pending)
                pending, last_emit = "", time.monotonic()
        if pending:
            emit(self.tokens, request_id, pending)
        return last, hand_over

    # -- several replies at once ----------------------------------------------------------------------
    def _compatible_offer(self) -> bool:
        """An offered request for the loaded model (path and context length) is waiting."""
        with self._lock:
            return any((path, n_ctx) == self._model_key for _, path, n_ctx, _, _ in self._offers)

    def _answer_stopped_offers(self) -> None:
        """Offered requests stopped before they started end now, not after the reply streaming meanwhile."""
        with self._lock:
            stopped = [o for o in self._offers if self._is_stopped(o[0])]
            self._offers = [o for o in self._offers if not self._is_stopped(o[0])]
        for request_id, *_ in stopped:
            emit(self.finished, request_id, {"finish_reason": "cancelled", "generated_tokens": 0})

    def _priority(self, conversation_id: int | None) -> int:
        return SHOWN_PRIORITY if conversation_id is not None and conversation_id == self._shown_now else 0

    def _run_batched(self, first: BatchedReply) -> None:
        """Run ``first`` (handed over from the lone stream) and the offered requests for this model together."""
        model = self._model
        hooks = Hooks(tokens=lambda rid, text: emit(self.tokens, rid, text),
                      finished=lambda rid, stats: emit(self.finished, rid, stats),
                      failed=lambda rid, message: emit(self.error, rid, message),
                      stopped=self._is_stopped, shown=lambda: self._shown_now, admit=self._admit_offers,
                      sample=lambda rid, rate, batch: self._probe.batched(model, rid, rate, batch))
        runner = BatchRunner(model, self._pacer.monitor, hooks)
        runner.add(first)
        emit(self.progress, "Answering several conversations at once…")
        try:
            runner.run()
        finally:
            model.settle(first.sequence)  # the model's cache holds the handed-over reply
            self._probe.model_changed(model)

    def _admit_offers(self, runner: BatchRunner) -> None:
        """Move the offered requests for this model into ``runner``; the others wait for the next generate."""
        self._answer_stopped_offers()
        with self._lock:
            mine = [o for o in self._offers if (o[1], o[2]) == self._model_key]
            self._offers = [o for o in self._offers if (o[1], o[2]) != self._model_key]
        for request_id, _path, _n_ctx, messages, options in mine:
            options = dict(options)
            conversation_id = options.pop("conversation_id", None)
            max_tokens = int(options.pop("max_tokens", 512))
            template_vars = options.pop("template_vars", None)
            for key in ("speculation", "thermal_mode"):  # one model pass per step for all: no drafts
                options.pop(key, None)
            try:
                dropped, request = self._model.chat_request(messages, self._params_factory(options), max_tokens,
                                                            self._priority(conversation_id),
                                                            template_vars=template_vars)
                runner.add(BatchedReply(request_id, conversation_id, request, dropped))
            except Exception as exc:  # noqa: BLE001 - a bad prompt or template fails its own request only
                emit(self.error, request_id, describe(exc))

    def _stats(self, last, dropped: int, request_id: int) -> dict:
        stats = {"dropped": dropped, "n_ctx": self._model.n_ctx, "model": self._model.name}
        if last is None:  # cancelled during prefill
            return {**stats, "finish_reason": "cancelled", "generated_tokens": 0}
        reason = last.finish_reason or ("cancelled" if self._is_stopped(request_id) else "length")
        return {**stats, "finish_reason": reason, "generated_tokens": last.generated_tokens,
                "prompt_tokens": last.prompt_tokens, "cached_tokens": last.cached_tokens,
                "prefill_s": round(last.prefill_s, 4), "decode_s": round(last.decode_s, 4),
                "prefill_tps": round(last.prefill_tps, 2), "decode_tps": round(last.decode_tps, 2),
                "context_used": last.prompt_tokens + last.generated_tokens}


class EngineHost(QObject):
    """Runs an EngineWorker on a QThread, forwards requests to it as queued signals, and replaces it if it crashes.

    Signals:
        load_requested(str, int): path and n_ctx, to the worker.
        prompt_requested(int, str, int, list, dict): request id, path, n_ctx, messages, options, to the worker.
        unload_requested(): to the worker.
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
    prompt_requested = Signal(int, str, int, object, object)
    unload_requested = Signal()
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
        links = [(self.load_requested, w.load), (self.prompt_requested, w.generate),
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
        """Queue a reply; returns its request id (tokens/finished/error carry it)."""
        self._next_id += 1
        self._unanswered.add(self._next_id)
        self._last_load = (path, n_ctx)
        args = (self._next_id, path, n_ctx, [dict(m) for m in messages], dict(options))
        if self._worker is None or not self._worker.offer(*args):  # offered: it joins the replies streaming now
            emit(self.prompt_requested, *args)
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


def measure_load(model, rss_before: int) -> dict:
    """RSS before and after a load next to the engine's estimate; with the CPU backend, which memory-maps the
    weights, every weight page is touched first so the measurement holds the weights (the first answer would
    page them in anyway)."""
    if getattr(model.backend, "name", "") == "cpu":
        for name in model.gguf.tensors:
            int(model.gguf.raw(name).reshape(-1)[::4096].sum())
    try:
        from engine.memory_estimate import estimate_memory
        e = estimate_memory(model.gguf, model.n_ctx, backend=model.backend.name)
        estimate = {"weights": e.weights_bytes, "kv_cache": e.kv_cache_bytes, "overhead": e.overhead_bytes,
                    "total": e.total_bytes}
    except Exception:  # noqa: BLE001 - an estimate is information; it never fails a load (MLX is not modelled)
        estimate = None
    return {"rss_before": rss_before, "rss_after": _rss(), "estimate": estimate}


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _size(path: str) -> int:
    return os.path.getsize(path)


def _summary(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" at {file_name(frame[0].filename)}:{frame[0].lineno}" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"
