"""The served model: requests bridged from asyncio to the one scheduler that generates every sequence.

Every API request is one request in a loaded model's ``engine.scheduler.Scheduler`` (the engine's one generation
path), which batches all the sequences in flight. What the server submits to is a ``SequenceHost``: headless,
``SchedulerThread`` steps the model's scheduler on a thread of its own; in the app, the app's engine host steps
the scheduler its chat replies run in, so API sequences and replies share every decode pass. Request handlers
submit and read their events without blocking the event loop. A bounded number of requests may be queued or
running; beyond it ``submit`` refuses with 429 and a ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

from ..generate import GenerationEvent
from ..model import Model
from ..sampling import SamplingParams, make_sampler
from ..scheduler import Request, RequestEvent, RequestHandle
from ..tokenizer import IncrementalDecoder
from ..thermal.monitor import ThermalMonitor
from ..thermal.policy import Limits
from .errors import APIError
from .logprobs import TopLogprobs
from .prefix_cache import PrefixCache

POLL_MIN_S, POLL_MAX_S = 0.002, 0.02  # how often a waiting handler looks for its request's next events
REQUEST_LOG_SIZE = 200
PREFILL_CHUNK = 512  # prompt tokens per step for one request (the policy's cap applies too)


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """One answered API request, for the request log and the metrics (``status`` is the HTTP status; a refused
    request has no tokens and no timings)."""

    id: int
    endpoint: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    tokens_per_second: float
    finish_reason: str
    finished_at: float
    status: int = 200


@dataclasses.dataclass
class ServerStats:
    """Counters for ``/metrics`` and the request log; written on the event loop's thread only. ``on_record`` (the
    app's request log) hears of every record as it is made."""

    requests: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by (endpoint, status)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rejected_busy: int = 0
    ttft_sum_s: float = 0.0  # over finished requests, for the mean time to first token
    finished: int = 0
    log: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=REQUEST_LOG_SIZE))
    on_record: Callable[[RequestRecord], None] | None = None

    def record(self, record: RequestRecord) -> None:
        if record.status == 200:
            self.prompt_tokens += record.prompt_tokens
            self.completion_tokens += record.completion_tokens
            self.ttft_sum_s += record.ttft_s
            self.finished += 1
        self.log.append(record)
        if self.on_record is not None:
            self.on_record(record)


class SequenceHost(Protocol):
    """What the server submits sequences to: loaded models, each with the one scheduler some thread steps.

    Headless it is ``SchedulerThread`` (or ``engine.serve.library.LibraryHost``); in the app, the app's engine
    host, whose scheduler also runs the chat's replies.
    """

    def model_ids(self) -> list[str]:
        """The ids clients may send in ``model`` (``GET /v1/models``)."""

    def acquire(self, name: str) -> Model:
        """The loaded model called ``name``, loading it first when the host can (this may block).

        Raises:
            APIError: 404 for a name the host does not know, 503 (or 409) with the reason it cannot load it now.
        """

    def submit(self, model: Model, request: Request) -> RequestHandle:
        """Queue ``request`` in ``model``'s scheduler and make sure a thread steps it (ValueError: cannot run)."""

    def is_current(self, model: Model) -> bool:
        """False once ``model`` was closed or replaced: its sequences will not be stepped any more."""

    @property
    def error(self) -> str | None:
        """Why the host cannot run sequences (its scheduler thread died, no model is loaded...); None when it can."""

    def start(self) -> None: ...

    def close(self) -> None: ...


class SchedulerThread:
    """The headless ``SequenceHost``: one loaded model whose scheduler steps on a thread of its own.

    Args:
        model: the loaded engine model.
        name: the id clients use for it in ``model`` fields.
        parallel: the most sequences decoding together.
        thermal: the thermal monitor whose policy sets the limits each step (the app's own kind of policy, with
            its levels scaled so that nominal allows ``parallel`` sequences); None for fixed limits.
    """

    def __init__(self, model: Model, name: str, parallel: int = 16, thermal: ThermalMonitor | None = None):
        self.model, self.name = model, name
        limits = model.scheduler.fixed_limits
        model.scheduler.fixed_limits = Limits(prefill_chunk=limits.prefill_chunk, max_batch=parallel,
                                              pause_s=limits.pause_s, max_draft=limits.max_draft)
        model.scheduler.max_batch = parallel
        if thermal is not None:
            model.set_monitor(thermal)
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-serve-scheduler", daemon=True)

    def model_ids(self) -> list[str]:
        return [self.name]

    def acquire(self, name: str) -> Model:
        if name != self.name:
            raise APIError(404, f"The model '{name}' does not exist; this server serves '{self.name}'",
                           param="model", code="model_not_found")
        return self.model

    def submit(self, model: Model, request: Request) -> RequestHandle:
        return model.scheduler.submit(request)

    def is_current(self, model: Model) -> bool:
        return model is self.model

    @property
    def error(self) -> str | None:
        if self._error is not None:
            return f"the model's scheduler stopped: {self._error}"
        return None if self._thread.is_alive() else "the model's scheduler is not running"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            self.model.scheduler.run(self._stop, idle_wait_s=0.05)
        except Exception as e:  # noqa: BLE001 - reported by /health and to every waiting request
            self._error = f"{type(e).__name__}: {e}"


class ServedModel:
    """The server's side of its models: the request queue bound, prefix caches, counters and the request log.

    Args:
        host: a ``SequenceHost``, or a loaded model to serve alone on a ``SchedulerThread`` of its own.
        name: the id clients use for a model given as ``host``.
        parallel: with a model as ``host``, the most sequences decoding together.
        max_queue: the most requests queued or running; more get 429.
        timeout_s: a request running longer is cancelled and answered 504.
        prefix_caches: how many finished requests' KV caches to keep for prompts that start the same.
        thermal: with a model as ``host``, the thermal monitor that sets its scheduler's limits.
    """

    def __init__(self, host: SequenceHost | Model, name: str | None = None, parallel: int = 16, max_queue: int = 64,
                 timeout_s: float = 600.0, prefix_caches: int = 4, thermal: ThermalMonitor | None = None):
        if isinstance(host, Model):
            host = SchedulerThread(host, name or host.name, parallel, thermal)
        self.host, self.max_queue, self.timeout_s = host, max_queue, timeout_s
        self.prefix_caches = prefix_caches
        self._prefix: tuple[Model | None, PrefixCache] = (None, PrefixCache(prefix_caches))
        self.created = int(time.time())
        self.active = 0  # requests submitted and not yet ended
        self._active_by: collections.Counter = collections.Counter()  # the same, by id() of their model
        self.stats = ServerStats()
        self.stopping = False  # set while the server shuts down: running requests end at once with a 503

    def active_on(self, model: Model) -> int:
        """Requests submitted to ``model`` and not yet ended."""
        return self._active_by[id(model)]

    @property
    def name(self) -> str:
        """The first model id (the served model when there is one)."""
        ids = self.host.model_ids()
        return ids[0] if ids else ""

    @property
    def error(self) -> str | None:
        return self.host.error

    @property
    def healthy(self) -> bool:
        return self.host.error is None

    def start(self) -> None:
        self.host.start()

    def close(self) -> None:
        self.host.close()

    async def bind(self, name: str) -> BoundModel:
        """The model a request names, loaded (on a worker thread: loading may take a while).

        Raises:
            APIError: 404 for an unknown name, 503/409 when it cannot be loaded now.
        """
        from starlette.concurrency import run_in_threadpool
        model = await run_in_threadpool(self.host.acquire, name)
        return BoundModel(self, model, name)

    def prefix_cache(self, model: Model) -> PrefixCache:
        """The prefix cache of ``model``; another model's cached prompts are dropped when the model changes."""
        owner, cache = self._prefix
        if owner is not model:
            cache = PrefixCache(self.prefix_caches)
            self._prefix = (model, cache)
        return cache

    def submit(self, model: Model, ids: Sequence[int], params: SamplingParams, max_tokens: int, stop: Sequence[str],
               grammar: str | None = None, top_logprobs: TopLogprobs | None = None) -> RequestHandle:
        """Queue a request in ``model``'s scheduler; ``grammar`` (from ``constrained.json_schema_grammar`` or
        ``constrained.tool_call_grammar``) constrains what it may generate, ``top_logprobs`` records each step's
        most likely tokens.

        Raises:
            APIError: 429 when the queue is full, 503 when the host cannot run sequences, 400 when the prompt does
                not fit or the grammar does not compile.
        """
        if self.host.error is not None:
            raise APIError(503, self.host.error)
        if self.active >= self.max_queue:
            self.stats.rejected_busy += 1
            raise APIError(429, f"the server is busy: {self.active} requests are queued or running",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"})
        try:
            handle = self.host.submit(model, self._request(model, ids, params, max_tokens, stop, grammar,
                                                           top_logprobs))
        except ValueError as e:
            raise APIError(400, str(e), param="response_format" if grammar else None) from e
        self.active += 1
        self._active_by[id(model)] += 1
        return handle

    def _request(self, model: Model, ids: Sequence[int], params: SamplingParams, max_tokens: int,
                 stop: Sequence[str], grammar: str | None, top_logprobs: TopLogprobs | None) -> Request:
        """The scheduler request: a cache from the prefix cache when one shares the prompt's start, which goes
        back there when the request ends. With a grammar or top_logprobs the sampler is wrapped and ``params`` is
        left off the request, so that no backend takes greedy steps on the device, past the wrapper."""
        tokenizer = model.tokenizer
        sample = make_sampler(params)
        if grammar is not None:
            from .constrained import ConstrainedSampler  # llguidance loads only when a request needs it
            sample = ConstrainedSampler(sample, tokenizer, grammar)
        if top_logprobs is not None:
            sample = top_logprobs.wrap(sample)
        if len(ids) + max_tokens > model.n_ctx:
            raise ValueError(f"{len(ids)} prompt tokens and {max_tokens} more do not fit the context of "
                             f"{model.n_ctx}")
        prefix = self.prefix_cache(model)
        cache = prefix.take(ids, len(ids) + max_tokens)
        if cache is None:  # room for the whole context (it grows in steps), so that a longer prompt can reuse it
            cache = model.backend.new_cache(model.n_ctx)

        def keep_cache(history: list[int], cache) -> None:
            if cache is not None:
                prefix.put(history[:cache.n_past], cache)

        return Request(tuple(ids), sample, max_tokens, eog_ids=frozenset(tokenizer.eog_ids), stop=tuple(stop),
                       decoder=IncrementalDecoder(tokenizer, True), cache=cache, prefill_chunk=PREFILL_CHUNK,
                       params=params if grammar is None and top_logprobs is None else None,
                       on_finish=keep_cache)

    async def events(self, model: Model, handle: RequestHandle,
                     disconnected: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[GenerationEvent]:
        """Yield the request's token events until its last one. Leaving early (the client went away, or the
        caller stopped reading) cancels the request in the scheduler at once.

        Raises:
            APIError: 400 when the backend refused the prompt, 504 after ``timeout_s``, 503 if the host stopped
                or the model was replaced while the request ran.
        """
        deadline, wait, done = time.monotonic() + self.timeout_s, POLL_MIN_S, False
        try:
            while not done:
                try:
                    event = handle.events.get_nowait()
                except queue.Empty:
                    self._check_running(model, deadline)
                    if disconnected is not None and wait >= POLL_MAX_S and await disconnected():
                        return
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, POLL_MAX_S)
                    continue
                wait = POLL_MIN_S
                if isinstance(event, RequestEvent):
                    if event.kind == "failed":
                        done = True
                        raise APIError(400, f"the model refused the prompt: {event.detail}")
                    done = event.kind == "cancelled"
                    continue
                done = event.finish_reason is not None
                yield event
        finally:
            self.active -= 1
            self._active_by[id(model)] -= 1
            if not done:
                model.scheduler.cancel(handle.id)

    def _check_running(self, model: Model, deadline: float) -> None:
        if self.stopping:
            raise APIError(503, "the server is stopping")
        if time.monotonic() > deadline:
            raise APIError(504, f"the request ran longer than {self.timeout_s:g} s")
        if self.host.error is not None:
            raise APIError(503, self.host.error)
        if not self.host.is_current(model):
            raise APIError(503, "the model was unloaded or replaced while the request ran")


class BoundModel:
    """One request's view of the server: the model it named, loaded, and the server's queue and counters."""

    def __init__(self, served: ServedModel, model: Model, name: str):
        self.served, self.model, self.name = served, model, name
        self.stats, self.created = served.stats, served.created

    def submit(self, ids: Sequence[int], params: SamplingParams, max_tokens: int, stop: Sequence[str],
               grammar: str | None = None, top_logprobs: TopLogprobs | None = None) -> RequestHandle:
        """``ServedModel.submit`` to this model."""
        return self.served.submit(self.model, ids, params, max_tokens, stop, grammar, top_logprobs)

    def events(self, handle: RequestHandle,
               disconnected: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[GenerationEvent]:
        """``ServedModel.events`` of a request to this model."""
        return self.served.events(self.model, handle, disconnected)
