"""RemoteModel: a model served by a remote endpoint, with the face the app's generation path uses for a local one.

Its ``RemoteScheduler`` has the local scheduler's ``submit``/``step``/``drop`` shape, so the app's reply loop
steps remote replies exactly like local ones: each request is one HTTP stream read on its own thread; ``step()``
waits briefly for what arrived on any of them and hands it to the requests' handles as ``GenerationEvent``s whose
timings come from the wire (time to first token, chunk arrival) and the server's ``usage``. Stop closes the
stream (the server sees the disconnect); a failure ends the request with a "failed" event saying why.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Callable

from ..backends.base import MemoryStats
from ..generate import GenerationEvent
from ..reasoning import THINK, THINK_CLOSE, THINK_OPEN, ReasoningProfile
from ..scheduler import RequestEvent, RequestHandle, StepReport
from ..thermal.policy import Limits
from .client import Capabilities, RemoteClient, StreamChunk
from .endpoint import Endpoint
from .errors import RemoteError

REF_PREFIX = "remote://"
STEP_WAIT_S = 0.05  # longest a step waits for the wire: Stop and new requests are seen at least this often
NO_LIMITS = Limits(prefill_chunk=1 << 16, max_batch=1 << 16, pause_s=0.0, max_draft=0)
PAUSED_BY_REMOTE = "runs on the remote server"


def remote_ref(endpoint_id: str, model_id: str) -> str:
    """The path-like name a conversation stores for a remote model: ``remote://ENDPOINT_ID/MODEL_ID``."""
    if not endpoint_id or "/" in endpoint_id:
        raise ValueError(f"bad endpoint id {endpoint_id!r}")
    return f"{REF_PREFIX}{endpoint_id}/{model_id}"


def is_remote_ref(path: str | None) -> bool:
    return bool(path) and path.startswith(REF_PREFIX)


def parse_remote_ref(ref: str) -> tuple[str, str]:
    """(endpoint id, model id) of a ``remote_ref``; ValueError for anything else."""
    if not is_remote_ref(ref) or "/" not in ref[len(REF_PREFIX):]:
        raise ValueError(f"not a remote model reference: {ref!r}")
    endpoint_id, model_id = ref[len(REF_PREFIX):].split("/", 1)
    if not endpoint_id or not model_id:
        raise ValueError(f"not a remote model reference: {ref!r}")
    return endpoint_id, model_id


@dataclasses.dataclass(frozen=True)
class RemoteStats:
    """The endpoint as this app sees it: requests in flight, how many ended in an error, and latencies."""

    in_flight: int = 0
    requests: int = 0
    errors: int = 0
    last_error: str = ""
    last_ttft_s: float | None = None  # time to first text of the latest reply
    mean_ttft_s: float | None = None
    last_tokens_per_second: float | None = None


@dataclasses.dataclass(eq=False)
class _Stream:
    """One request in flight on the wire."""

    handle: RequestHandle
    cancel: threading.Event
    started_at: float
    response: object = None  # the open httpx.Response, closed by Stop
    first_at: float | None = None
    chunks: int = 0
    finish_reason: str | None = None
    usage: object = None
    done: bool = False
    thinking: bool = False  # inside the thinking the server sends apart (written between <think> and </think>)


class RemoteScheduler:
    """Runs remote requests, each an HTTP stream on its own thread, behind the local scheduler's interface.

    Args:
        client: the endpoint's client.
        model_id: the remote model's id.
        clock: time source (monotonic).
    """

    def __init__(self, client: RemoteClient, model_id: str, clock: Callable[[], float] = time.monotonic):
        self.client, self.model_id, self.clock = client, model_id, clock
        self._ids = itertools.count(1)
        self._streams: dict[int, _Stream] = {}
        self._inbox: queue.Queue[tuple[int, str, object]] = queue.Queue()
        self._lock = threading.Lock()
        self._requests = self._errors = 0
        self._last_error = ""
        self._ttfts: list[float] = []
        self._last_tps: float | None = None

    def submit(self, messages: list[dict], max_tokens: int, sampling: dict,
               cancel: threading.Event | None = None) -> RequestHandle:
        """Start streaming a chat reply; its events arrive on the returned handle as ``step()`` runs."""
        sid = next(self._ids)
        stream = _Stream(RequestHandle(sid), cancel or threading.Event(), self.clock())
        with self._lock:
            self._streams[sid] = stream
            self._requests += 1
        thread = threading.Thread(target=self._read, args=(sid, stream, messages, max_tokens, sampling),
                                  name=f"hearth-remote-{sid}", daemon=True)
        thread.start()
        return stream.handle

    def step(self, wait_s: float = STEP_WAIT_S) -> StepReport:
        """Move what arrived from the wire (waiting up to ``wait_s`` for something) to the handles; end
        stopped requests by closing their streams."""
        events: list[tuple[int, object]] = []
        self._end_stopped(events)
        try:
            items = [self._inbox.get(timeout=wait_s)]
        except queue.Empty:
            items = []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        texted = set()
        for sid, kind, payload in items:
            stream = self._streams.get(sid)
            if stream is None or stream.done:
                continue  # stopped or dropped meanwhile
            event = self._event(sid, stream, kind, payload)
            if event is not None:
                stream.handle.events.put(event)
                events.append((sid, event))
                texted.add(sid)
        self._end_stopped(events)
        now = self.clock()
        in_flight = sum(not s.done for s in self._streams.values())
        self._forget_done()
        return StepReport(now, NO_LIMITS, len(texted), 0.0, 0, 0.0, tuple(events), in_flight, 0)

    def drop(self, request_id: int) -> None:
        """Forget a request without an event (its stream is closed)."""
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.done = True
            stream.cancel.set()
            _close(stream.response)

    def cancel(self, request_id: int) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.cancel.set()

    def set_priority(self, request_id: int, priority: int) -> None:
        """Priorities order local decoding; remote streams all run at once, so there is nothing to reorder."""

    def has_work(self) -> bool:
        return any(not s.done for s in self._streams.values())

    def stats(self) -> RemoteStats:
        with self._lock:
            ttfts = list(self._ttfts)
            return RemoteStats(sum(not s.done for s in self._streams.values()), self._requests, self._errors,
                               self._last_error, ttfts[-1] if ttfts else None,
                               sum(ttfts) / len(ttfts) if ttfts else None, self._last_tps)

    def close(self) -> None:
        for sid in list(self._streams):
            self.drop(sid)

    # -- the stream thread ---------------------------------------------------------------------------
    def _read(self, sid: int, stream: _Stream, messages: list[dict], max_tokens: int, sampling: dict) -> None:
        def opened(response) -> None:
            stream.response = response
            if stream.cancel.is_set():
                _close(response)
        try:
            for chunk in self.client.stream_chat(self.model_id, messages, max_tokens, sampling, stream.cancel,
                                                 on_open=opened):
                self._inbox.put((sid, "chunk", chunk))
            self._inbox.put((sid, "end", None))
        except RemoteError as e:
            self._inbox.put((sid, "failed", e))
        except Exception as e:  # noqa: BLE001 - the thread must always end its request
            self._inbox.put((sid, "failed", RemoteError(f"{type(e).__name__}: {e}")))

    # -- on the stepping thread ------------------------------------------------------------------------
    def _event(self, sid: int, stream: _Stream, kind: str, payload) -> object | None:
        now = self.clock()
        if kind == "chunk":
            chunk: StreamChunk = payload
            stream.finish_reason = chunk.finish_reason or stream.finish_reason
            stream.usage = chunk.usage or stream.usage
            text = _with_thinking(stream, chunk)
            if not text:
                return None
            if stream.first_at is None:
                stream.first_at = now
                with self._lock:
                    self._ttfts = (self._ttfts + [now - stream.started_at])[-100:]
            stream.chunks += 1
            return self._generation_event(stream, text, now, None)
        if stream.cancel.is_set():  # Stop ended the stream under the reader (as "end" or as a broken read)
            stream.done = True
            return RequestEvent(sid, "cancelled", now)
        if kind == "end":
            stream.done = True
            closing = THINK_CLOSE if stream.thinking else ""  # a reply cut off while thinking
            return self._generation_event(stream, closing, now, _finish_reason(stream.finish_reason), final=True)
        stream.done = True
        error: RemoteError = payload
        with self._lock:
            self._errors += 1
            self._last_error = str(error)
        detail = str(error) + (" The answer so far is kept." if stream.chunks else "")
        return RequestEvent(sid, "failed", now, detail=detail)

    def _generation_event(self, stream: _Stream, text: str, now: float, finish: str | None,
                          final: bool = False) -> GenerationEvent:
        """Timings from the wire: prefill_s is the time to the first text, decode_s the time after it; the token
        counts are the server's ``usage`` once it came (chunks until then)."""
        first = stream.first_at if stream.first_at is not None else now
        usage = stream.usage
        index = max(stream.chunks - 1, 0)
        prompt_tokens = 0
        if final and usage is not None:
            index = max(usage.completion_tokens - 1, 0)
            prompt_tokens = usage.prompt_tokens
        event = GenerationEvent(-1, text, 0.0, index, prompt_tokens, 0, first - stream.started_at, now - first,
                                finish)
        if final:
            self._last_tps = round(event.decode_tps, 2)
        return event

    def _end_stopped(self, events: list) -> None:
        for sid, stream in self._streams.items():
            if not stream.done and stream.cancel.is_set():
                stream.done = True
                _close(stream.response)
                event = RequestEvent(sid, "cancelled", self.clock())
                stream.handle.events.put(event)
                events.append((sid, event))

    def _forget_done(self) -> None:
        with self._lock:
            for sid in [sid for sid, s in self._streams.items() if s.done]:
                del self._streams[sid]


class _RemoteBackend:
    """What the app reads of a model's backend: its name and the memory it holds here (none)."""

    name = "remote"

    @staticmethod
    def memory() -> MemoryStats:
        return MemoryStats(0, 0)


class RemoteModel:
    """A remote endpoint's model with the parts of ``engine.model.Model`` a chat uses: ``start_chat`` and its
    scheduler, name, context length and reasoning profile. KV snapshots, thermal pacing and speculation happen
    (or not) on the server: ``unsupported`` says so, for the app to grey them out.

    Args:
        endpoint: the server.
        model_id: the model's id on it.
        n_ctx: the context length the conversation asks for (the server decides its own; reported as given).
        capabilities: what a probe found, if one ran.
    """

    unsupported = {"kv_snapshots": f"KV snapshots are kept by the server ({PAUSED_BY_REMOTE})",
                   "thermal": f"the thermal policy paces this computer's engine; this model {PAUSED_BY_REMOTE}",
                   "speculation": f"speculative decoding is the server's setting; this model {PAUSED_BY_REMOTE}"}

    def __init__(self, endpoint: Endpoint, model_id: str, n_ctx: int = 4096,
                 capabilities: Capabilities | None = None):
        self.endpoint, self.model_id, self.n_ctx = endpoint, model_id, n_ctx
        self.capabilities = capabilities or Capabilities(streaming=True)
        self.client = RemoteClient(endpoint)
        self.scheduler = RemoteScheduler(self.client, model_id)
        self.backend = _RemoteBackend()
        self.reasoning = ReasoningProfile(THINK)  # thinking sent apart is written as <think>…</think>
        self.notices: list[str] = []
        self.config = None
        self.kv_cache_usage = None

    @property
    def name(self) -> str:
        return self.model_id

    @property
    def sha256(self) -> str:
        """Not a file hash: a stable key for this endpoint's model (no snapshot is ever stored under it)."""
        return f"remote:{self.endpoint.root}/{self.model_id}"

    def start_chat(self, messages: list[dict], params, max_tokens: int, *, priority: int = 0,
                   prefill_chunk: int | None = None, speculation=None, cancel: threading.Event | None = None,
                   template_vars: dict | None = None) -> tuple[int, RequestHandle]:
        """Start a chat reply on the server (``params``: an ``engine.sampling.SamplingParams``); returns
        (0 messages dropped — the server fits its own context, handle)."""
        return 0, self.scheduler.submit(list(messages), max_tokens, sampling_fields(params), cancel)

    def thinking_stats(self, n_generated: int, sequence=None) -> dict:
        return {}

    def set_monitor(self, monitor) -> None:
        """The thermal policy paces local compute only."""

    def close(self) -> None:
        self.scheduler.close()


def sampling_fields(params) -> dict:
    """The request fields of a ``SamplingParams``: OpenAI's, and llama.cpp's top_k/min_p/repeat_penalty, which
    vLLM and Ollama accept too. A temperature of 0 is greedy on every one of them."""
    if params is None:
        return {}
    fields = {"temperature": max(0.0, params.temperature), "top_p": params.top_p, "top_k": params.top_k,
              "min_p": params.min_p, "repeat_penalty": params.repeat_penalty,
              "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
              "seed": params.seed}
    return {k: v for k, v in fields.items() if v is not None}


def _with_thinking(stream: _Stream, chunk: StreamChunk) -> str:
    """The chunk's text, with the thinking the server sends apart put between <think> and </think>, as a thinking
    model writes it when the server leaves it in the answer; the app splits both forms the same way."""
    text = ""
    if chunk.reasoning:
        text += ("" if stream.thinking else THINK_OPEN) + chunk.reasoning
        stream.thinking = True
    if chunk.text:
        text += (THINK_CLOSE if stream.thinking else "") + chunk.text
        stream.thinking = False
    return text


def _finish_reason(reason: str | None) -> str:
    return {"length": "length"}.get(reason or "", "stop")


def _close(response) -> None:
    if response is not None:
        try:
            response.close()
        except Exception:  # noqa: BLE001 - closing a stream another thread reads may raise there, not here
            pass
