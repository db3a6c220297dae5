"""The served model: its scheduler on a thread of its own, and requests bridged from asyncio to it.

Every API request is one request in the model's ``engine.scheduler.Scheduler`` (the engine's one generation
path), which batches all the sequences in flight. The scheduler thread steps while there is work; request
handlers submit and read their events without blocking the event loop. A bounded number of requests may be
queued or running; beyond it ``submit`` refuses with 429 and a ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from ..generate import GenerationEvent
from ..model import Model
from ..sampling import SamplingParams, make_sampler
from ..scheduler import Request, RequestEvent, RequestHandle
from ..tokenizer import IncrementalDecoder
from ..thermal.policy import Limits
from .errors import APIError
from .logprobs import TopLogprobs
from .prefix_cache import PrefixCache

POLL_MIN_S, POLL_MAX_S = 0.002, 0.02  # how often a waiting handler looks for its request's next events
REQUEST_LOG_SIZE = 200
PREFILL_CHUNK = 512  # prompt tokens per step for one request (the policy's cap applies too)


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """One finished API request, for the request log and the metrics."""

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


@dataclasses.dataclass
class ServerStats:
    """Counters for ``/metrics``; written on the event loop's thread only."""

    requests: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by (endpoint, status)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rejected_busy: int = 0
    ttft_sum_s: float = 0.0  # over finished requests, for the mean time to first token
    finished: int = 0
    log: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=REQUEST_LOG_SIZE))

    def record(self, record: RequestRecord) -> None:
        self.prompt_tokens += record.prompt_tokens
        self.completion_tokens += record.completion_tokens
        self.ttft_sum_s += record.ttft_s
        self.finished += 1
        self.log.append(record)


class ServedModel:
    """A loaded model served over the API.

    Args:
        model: the loaded engine model.
        name: the id clients use for it in ``model`` fields.
        parallel: the most sequences decoding together.
        max_queue: the most requests queued or running; more get 429.
        timeout_s: a request running longer is cancelled and answered 504.
        prefix_caches: how many finished requests' KV caches to keep for prompts that start the same.
    """

    def __init__(self, model: Model, name: str, parallel: int = 16, max_queue: int = 64, timeout_s: float = 600.0,
                 prefix_caches: int = 4):
        self.model, self.name, self.max_queue, self.timeout_s = model, name, max_queue, timeout_s
        self.prefix_cache = PrefixCache(prefix_caches)
        limits = model.scheduler.fixed_limits
        model.scheduler.fixed_limits = Limits(prefill_chunk=limits.prefill_chunk, max_batch=parallel,
                                              pause_s=limits.pause_s, max_draft=limits.max_draft)
        self.created = int(time.time())
        self.active = 0  # requests submitted and not yet ended
        self.stats = ServerStats()
        self.error: str | None = None  # set when the scheduler thread died
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-serve-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            self.model.scheduler.run(self._stop, idle_wait_s=0.05)
        except Exception as e:  # noqa: BLE001 - reported by /health and to every waiting request
            self.error = f"{type(e).__name__}: {e}"

    def submit(self, ids: Sequence[int], params: SamplingParams, max_tokens: int, stop: Sequence[str],
               grammar: str | None = None, top_logprobs: TopLogprobs | None = None) -> RequestHandle:
        """Queue a request in the scheduler; ``grammar`` (from ``constrained.json_schema_grammar``) constrains
        what it may generate, ``top_logprobs`` records each step's most likely tokens.

        Raises:
            APIError: 429 when the queue is full, 503 when the scheduler is down, 400 when the prompt does not fit
                or the grammar does not compile.
        """
        if not self.healthy:
            raise APIError(503, f"the model's scheduler stopped: {self.error}")
        if self.active >= self.max_queue:
            self.stats.rejected_busy += 1
            raise APIError(429, f"the server is busy: {self.active} requests are queued or running",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"})
        try:
            handle = self.model.scheduler.submit(self._request(ids, params, max_tokens, stop, grammar, top_logprobs))
        except ValueError as e:
            raise APIError(400, str(e), param="response_format" if grammar else None) from e
        self.active += 1
        return handle

    def _request(self, ids: Sequence[int], params: SamplingParams, max_tokens: int, stop: Sequence[str],
                 grammar: str | None, top_logprobs: TopLogprobs | None) -> Request:
        """The scheduler request: a cache from the prefix cache when one shares the prompt's start, which goes
        back there when the request ends. With a grammar or top_logprobs the sampler is wrapped and ``params`` is
        left off the request, so that no backend takes greedy steps on the device, past the wrapper."""
        tokenizer = self.model.tokenizer
        sample = make_sampler(params)
        if grammar is not None:
            from .constrained import ConstrainedSampler  # llguidance loads only when a request needs it
            sample = ConstrainedSampler(sample, tokenizer, grammar)
        if top_logprobs is not None:
            sample = top_logprobs.wrap(sample)
        if len(ids) + max_tokens > self.model.n_ctx:
            raise ValueError(f"{len(ids)} prompt tokens and {max_tokens} more do not fit the context of "
                             f"{self.model.n_ctx}")
        cache = self.prefix_cache.take(ids, len(ids) + max_tokens)
        if cache is None:  # room for the whole context (it grows in steps), so that a longer prompt can reuse it
            cache = self.model.backend.new_cache(self.model.n_ctx)
        return Request(tuple(ids), sample, max_tokens, eog_ids=frozenset(tokenizer.eog_ids), stop=tuple(stop),
                       decoder=IncrementalDecoder(tokenizer, True), cache=cache, prefill_chunk=PREFILL_CHUNK,
                       params=params if grammar is None and top_logprobs is None else None,
                       on_finish=self._keep_cache)

    def _keep_cache(self, history: list[int], cache) -> None:
        if cache is not None:
            self.prefix_cache.put(history[:cache.n_past], cache)

    async def events(self, handle: RequestHandle,
                     disconnected: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[GenerationEvent]:
        """Yield the request's token events until its last one. Leaving early (the client went away, or the
        caller stopped reading) cancels the request in the scheduler at once.

        Raises:
            APIError: 400 when the backend refused the prompt, 504 after ``timeout_s``, 503 if the scheduler died.
        """
        deadline, wait, done = time.monotonic() + self.timeout_s, POLL_MIN_S, False
        try:
            while not done:
                try:
                    event = handle.events.get_nowait()
                except queue.Empty:
                    if time.monotonic() > deadline:
                        raise APIError(504, f"the request ran longer than {self.timeout_s:g} s") from None
                    if not self.healthy:
                        raise APIError(503, f"the model's scheduler stopped: {self.error}") from None
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
            if not done:
                self.model.scheduler.cancel(handle.id)
