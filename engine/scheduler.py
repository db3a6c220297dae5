"""Scheduler: several sequences in flight on one backend, under limits set by the thermal policy.

Each ``step()`` runs one batched decode pass over every decoding sequence (``backend.forward_batch``) and then
at most ``prefill_chunk`` prompt tokens of prefill, so a long new prompt delays the running streams by at most
one chunk per token. Sequences are admitted by priority (the conversation on screen first), then arrival;
when the policy lowers the number of sequences in flight, or a higher-priority request arrives, the lowest
ones are preempted: they keep their KV cache, or drop it and are prefilled again on resume.

The app's worker thread calls ``step()`` in a loop or runs ``run(stop)``; ``submit``, ``cancel`` and
``set_priority`` may be called from any thread. Nothing here prints; events go to the step report and to
each request's handle.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np

from .backends.base import Backend, KVCache
from .generate import GenerationEvent, StopMatcher
from .thermal.monitor import ThermalMonitor
from .thermal.policy import DEFAULT_LEVELS, Limits

Sampler = Callable[[np.ndarray, Sequence[int]], tuple[int, float]]  # (logits, history) -> (token, logprob)
PREEMPT_MODES = ("keep", "recompute")  # keep the KV cache of a preempted sequence, or drop it and prefill again
CONTEXT_BUCKET = 256  # decode loads are told apart by total context in doubling buckets from this size


class TokenDecoder(Protocol):
    """Incremental detokenizer: text completed by each token, and what is left at the end."""

    def add(self, token: int) -> str: ...

    def flush(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Request:
    """What to generate. ``sample`` and ``decoder`` are per-request objects with their own state."""

    prompt_ids: tuple[int, ...]
    sample: Sampler
    max_tokens: int = 256
    priority: int = 0  # higher runs first
    eog_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    decoder: TokenDecoder | None = None  # without one, events carry no text
    cache: KVCache | None = None  # a cache of this backend holding the first cache.n_past prompt tokens, to go on from


@dataclasses.dataclass(frozen=True)
class RequestEvent:
    """A change in a request's life that is not a token.

    ``kind`` is "queued", "started", "preempted", "resumed", "cancelled" or "failed". A request's stream ends
    with a GenerationEvent that has ``finish_reason``, or with "cancelled" or "failed".
    """

    request_id: int
    kind: str
    time: float
    text: str = ""  # on "cancelled": text held back until then (a partial stop string, a split character)
    detail: str = ""


Event = GenerationEvent | RequestEvent


@dataclasses.dataclass(frozen=True)
class StepReport:
    """What one ``step()`` did."""

    time: float
    limits: Limits
    decode_batch: int  # sequences in the batched decode pass
    decode_s: float  # time of that pass
    prefill_tokens: int
    prefill_s: float
    events: tuple[tuple[int, Event], ...]  # (request id, event)
    in_flight: int  # sequences holding a slot after the step
    waiting: int  # sequences queued or preempted after the step

    @property
    def idle(self) -> bool:
        return self.decode_batch == 0 and self.prefill_tokens == 0 and not self.events

    @property
    def pause_s(self) -> float:
        return self.limits.pause_s if not self.idle else 0.0


def is_final(event: Event) -> bool:
    if isinstance(event, GenerationEvent):
        return event.finish_reason is not None
    return event.kind in ("cancelled", "failed")


class RequestHandle:
    """The caller's side of one request: its id and its events, readable from any thread."""

    def __init__(self, request_id: int):
        self.id = request_id
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def stream(self, timeout: float | None = None) -> Iterator[Event]:
        """Yield events until the final one; ``queue.Empty`` when none comes within ``timeout`` seconds."""
        while True:
            event = self.events.get(timeout=timeout)
            yield event
            if is_final(event):
                return


@dataclasses.dataclass
class _Sequence:
    """One request in flight: its tokens, cache and progress."""

    id: int
    request: Request
    order: int  # arrival order: first come first served within a priority
    priority: int
    history: list[int]  # prompt then generated tokens; in decode the cache holds all but the last
    matcher: StopMatcher
    submitted_at: float
    cache: KVCache | None = None
    active: bool = False  # holds a slot (prefilling or decoding)
    generated: int = 0
    first_at: float | None = None
    preemptions: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def prefill_target(self) -> int:
        """Positions the cache must hold before the next decode step."""
        return self.prompt_len if self.generated == 0 else len(self.history) - 1

    @property
    def decoding(self) -> bool:
        return self.cache is not None and self.generated > 0 and self.cache.n_past == self.prefill_target

    @property
    def sort_key(self) -> tuple[int, int]:
        return -self.priority, self.order


def decode_load(batch: int, total_context: int) -> tuple[int, int]:
    """The drift detector's load key: batch size and a doubling bucket of the context the batch attends to."""
    return batch, int(math.log2(1 + total_context / CONTEXT_BUCKET))


class Scheduler:
    """Continuous batching with chunked prefill, priorities, preemption and cancellation.

    Args:
        backend: the model's backend; decode uses ``forward_batch``, prefill ``forward``.
        n_ctx: the most positions any one sequence may hold.
        monitor: the thermal monitor that sets the limits each step; None for the fixed ``limits``.
        limits: the limits when there is no monitor.
        max_batch: a cap on sequences in flight on top of the policy's (memory, say).
        preempt: "keep" (a preempted sequence keeps its KV cache) or "recompute" (it drops it).
        clock: time for events and timings; ``time.perf_counter`` unless a test fakes it.
    """

    def __init__(self, backend: Backend, n_ctx: int, monitor: ThermalMonitor | None = None,
                 limits: Limits = DEFAULT_LEVELS[0], max_batch: int | None = None, preempt: str = "keep",
                 clock: Callable[[], float] = time.perf_counter):
        if preempt not in PREEMPT_MODES:
            raise ValueError(f"preempt must be one of {PREEMPT_MODES}, got {preempt!r}")
        self.backend, self.n_ctx, self.monitor = backend, n_ctx, monitor
        self.fixed_limits, self.max_batch, self.preempt, self.clock = limits, max_batch, preempt, clock
        self._sequences: list[_Sequence] = []  # every unfinished sequence, in no particular order
        self._handles: dict[int, RequestHandle] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards the inbox below, written from other threads
        self._inbox: list[tuple[str, int, object]] = []  # ("submit", id, Request) | ("cancel", id, None) | ("priority", id, int)
        self._wakeup = threading.Event()

    # -- any thread ---------------------------------------------------------------------------------
    def submit(self, request: Request) -> RequestHandle:
        """Queue ``request``; it starts on a later step. Raises ValueError for a request that cannot run."""
        if not request.prompt_ids:
            raise ValueError("a request needs at least one prompt token")
        if request.max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {request.max_tokens}")
        if len(request.prompt_ids) >= self.n_ctx:
            raise ValueError(f"the prompt of {len(request.prompt_ids)} tokens leaves no room in n_ctx {self.n_ctx}")
        if request.cache is not None and request.cache.n_past >= len(request.prompt_ids):
            raise ValueError(f"the cache holds {request.cache.n_past} positions: at least the last of the "
                             f"{len(request.prompt_ids)} prompt tokens must be left to feed")
        handle = RequestHandle(next(self._ids))
        self._post("submit", handle.id, (request, handle))
        return handle

    def cancel(self, request_id: int) -> None:
        """Stop a request at the next step; its stream ends with a "cancelled" event (unknown ids are ignored)."""
        self._post("cancel", request_id, None)

    def set_priority(self, request_id: int, priority: int) -> None:
        """Change a request's priority from the next step (the user switched conversations, say)."""
        self._post("priority", request_id, priority)

    def _post(self, kind: str, request_id: int, payload: object) -> None:
        with self._lock:
            self._inbox.append((kind, request_id, payload))
        self._wakeup.set()

    # -- the worker thread ---------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        with self._lock:
            return bool(self._sequences or self._inbox)

    def run(self, stop: threading.Event, idle_wait_s: float = 0.1) -> None:
        """Step until ``stop`` is set: sleep while idle, and rest between steps when the policy asks."""
        while not stop.is_set():
            self._wakeup.clear()
            report = self.step()
            if report.idle:
                self._wakeup.wait(idle_wait_s)
            elif report.pause_s > 0:
                stop.wait(report.pause_s)

    def step(self) -> StepReport:
        """One scheduling round: admit and preempt, one batched decode pass, then up to one chunk of prefill."""
        now = self.clock()
        events: list[tuple[int, Event]] = []
        self._drain_inbox(now, events)
        limits = self._limits()
        self._admit(limits, now, events)
        decode_batch, decode_s = self._decode_step(events)
        prefill_tokens, prefill_s = self._prefill_step(limits.prefill_chunk, events)
        for request_id, event in events:
            self._handles[request_id].events.put(event)
            if is_final(event):
                del self._handles[request_id]
        in_flight = sum(s.active for s in self._sequences)
        return StepReport(now, limits, decode_batch, decode_s, prefill_tokens, prefill_s, tuple(events),
                          in_flight, len(self._sequences) - in_flight)

    def _limits(self) -> Limits:
        limits = self.monitor.limits() if self.monitor is not None else self.fixed_limits
        if self.max_batch is not None and limits.max_batch > self.max_batch:
            limits = dataclasses.replace(limits, max_batch=self.max_batch)
        return limits

    # -- requests in and out -------------------------------------------------------------------------
    def _drain_inbox(self, now: float, events: list) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
        by_id = {s.id: s for s in self._sequences}
        for kind, request_id, payload in inbox:
            if kind == "submit":
                request, handle = payload
                seq = _Sequence(request_id, request, request_id, request.priority, list(request.prompt_ids),
                                StopMatcher(request.stop), now, cache=request.cache)
                self._sequences.append(seq)
                self._handles[request_id] = handle
                by_id[request_id] = seq
                events.append((request_id, RequestEvent(request_id, "queued", now)))
            elif kind == "cancel" and request_id in by_id:
                seq = by_id.pop(request_id)
                self._finish(seq, events, RequestEvent(request_id, "cancelled", now, text=self._flush_text(seq)))
            elif kind == "priority" and request_id in by_id:
                by_id[request_id].priority = payload

    def _flush_text(self, seq: _Sequence) -> str:
        if seq.generated == 0:
            return ""
        decoder = seq.request.decoder
        return seq.matcher.feed(decoder.flush() if decoder else "")[0] + seq.matcher.flush()

    def _finish(self, seq: _Sequence, events: list, final: Event) -> None:
        self._sequences.remove(seq)
        seq.cache, seq.active = None, False
        events.append((seq.id, final))

    # -- slots ---------------------------------------------------------------------------------------
    def _admit(self, limits: Limits, now: float, events: list) -> None:
        """Give the ``max_batch`` best sequences a slot; preempt the active ones that fell out."""
        ranked = sorted(self._sequences, key=lambda s: s.sort_key)
        chosen = {s.id for s in ranked[:max(1, limits.max_batch)]}
        for seq in ranked:
            if seq.active and seq.id not in chosen:
                self._preempt(seq, now, events)
        for seq in ranked:
            if not seq.active and seq.id in chosen:
                self._start(seq, now, events)

    def _preempt(self, seq: _Sequence, now: float, events: list) -> None:
        seq.active = False
        seq.preemptions += 1
        if self.preempt == "recompute":
            seq.cache = None
        events.append((seq.id, RequestEvent(seq.id, "preempted", now, detail=f"KV cache: {self.preempt}")))

    def _start(self, seq: _Sequence, now: float, events: list) -> None:
        seq.active = True
        if seq.cache is None:
            seq.cache = self.backend.new_cache(min(self.n_ctx, seq.prompt_len + seq.request.max_tokens))
            seq.cache.reserve_whole_room()
        kind = "resumed" if seq.preemptions else "started"
        events.append((seq.id, RequestEvent(seq.id, kind, now)))

    # -- compute -------------------------------------------------------------------------------------
    def _decode_step(self, events: list) -> tuple[int, float]:
        """One batched forward pass over every decoding sequence, then a token for each."""
        batch = [s for s in sorted(self._sequences, key=lambda s: s.sort_key) if s.active and s.decoding]
        if not batch:
            return 0, 0.0
        start = self.clock()
        logits = self.backend.forward_batch([s.history[-1] for s in batch], [s.cache for s in batch])
        elapsed = self.clock() - start
        if self.monitor is not None:
            self.monitor.observe_decode(elapsed, decode_load(len(batch), sum(s.cache.n_past for s in batch)))
        for seq, row in zip(batch, logits):
            self._next_token(seq, row, events)
        return len(batch), elapsed

    def _prefill_step(self, budget: int, events: list) -> tuple[int, float]:
        """Up to ``budget`` tokens of prefill, to the active sequences in priority order."""
        start, used = self.clock(), 0
        for seq in sorted(self._sequences, key=lambda s: s.sort_key):
            if used >= budget:
                break
            if not seq.active or seq.cache.n_past >= seq.prefill_target:
                continue
            n = min(budget - used, seq.prefill_target - seq.cache.n_past)
            used += n
            self._prefill_chunk(seq, n, events)
        return used, (self.clock() - start) if used else 0.0

    def _prefill_chunk(self, seq: _Sequence, n: int, events: list) -> None:
        begin = seq.cache.n_past
        try:
            logits = self.backend.forward(seq.history[begin:begin + n], seq.cache)
        except ValueError as e:  # a bad prompt (a token id out of range, say) fails its own request only
            self._finish(seq, events, RequestEvent(seq.id, "failed", self.clock(), detail=str(e)))
            return
        if seq.generated == 0 and seq.cache.n_past == seq.prefill_target:
            self._next_token(seq, logits, events)

    def _next_token(self, seq: _Sequence, logits: np.ndarray, events: list) -> None:
        """Sample, detokenize, check the stop conditions and emit the token's event."""
        request = seq.request
        token, logprob = request.sample(logits, seq.history)
        seq.history.append(token)
        index, seq.generated = seq.generated, seq.generated + 1
        now = self.clock()
        seq.first_at = seq.first_at if seq.first_at is not None else now
        text, finish = self._token_text(seq, token)
        event = GenerationEvent(token, text, float(logprob), index, seq.prompt_len, 0, seq.first_at - seq.submitted_at,
                                now - seq.first_at, finish)
        if finish:
            self._finish(seq, events, event)
        else:
            events.append((seq.id, event))

    def _token_text(self, seq: _Sequence, token: int) -> tuple[str, str | None]:
        request, decoder = seq.request, seq.request.decoder
        if token in request.eog_ids:
            return self._flush_text(seq), "eos"
        text, stopped = seq.matcher.feed(decoder.add(token) if decoder else "")
        if stopped:
            return text, "stop"
        if seq.generated >= request.max_tokens:
            return text + self._flush_text(seq), "length"
        if seq.cache.n_past + 1 > seq.cache.n_ctx:
            return text + self._flush_text(seq), "context"
        return text, None
