"""Scheduler: every reply is a Sequence moving through one loop, alone (a batch of one) or beside others.

Each ``step()`` runs one decode pass over every decoding sequence and then at most ``prefill_chunk`` prompt
tokens of prefill, so a long new prompt delays the running streams by at most one chunk per token. Several
decoding sequences share one ``backend.forward_batch`` pass; a sequence decoding alone calls ``backend.forward``
directly, and there the backend's declared capabilities apply: its speculator's draft-and-verify rounds
(``Backend.verifies_drafts``) or the device's pipelined greedy steps (``Backend.pipelined_greedy``). Sequences
are admitted by priority (the conversation on screen first), then arrival; when the policy lowers the number of
sequences in flight, or a higher-priority request arrives, the lowest ones are preempted: they keep their KV
cache, or drop it and are prefilled again on resume.

The thread that owns the scheduler calls ``step()`` in a loop or runs ``run(stop)``; ``submit``, ``cancel`` and
``set_priority`` may be called from any thread, and so may a request's own ``cancel`` flag be set. Nothing here
prints; events go to the step report and to each request's handle.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from .backends.base import Backend
from .generate import Cancelled, GenerationEvent
from .sequence import Request, Sampler, Sequence, TokenDecoder
from .thermal.monitor import ThermalMonitor
from .thermal.pacing import rest
from .thermal.policy import DEFAULT_LEVELS, Limits

__all__ = ["Event", "PREEMPT_MODES", "Request", "RequestEvent", "RequestHandle", "Sampler", "Scheduler",
           "StepReport", "TokenDecoder", "decode_load", "is_final"]

PREEMPT_MODES = ("keep", "recompute")  # keep the KV cache of a preempted sequence, or drop it and prefill again
CONTEXT_BUCKET = 256  # decode loads are told apart by total context in doubling buckets from this size


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


class StepReport(NamedTuple):
    """What one ``step()`` did (a named tuple: made every token, it costs less than a frozen dataclass)."""

    time: float
    limits: Limits
    decode_batch: int  # sequences in the decode pass
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
    """The caller's side of one request: its id and its events, readable from any thread. Without a queue
    (``queued=False``) the caller reads its events from the step reports on the scheduler's thread."""

    def __init__(self, request_id: int, queued: bool = True, prompt_ids: tuple[int, ...] = ()):
        self.id = request_id
        self.prompt_ids = prompt_ids  # the request's prompt, for figures read from it afterwards
        self.events: queue.SimpleQueue[Event] | None = queue.SimpleQueue() if queued else None

    def stream(self, timeout: float | None = None) -> Iterator[Event]:
        """Yield events until the final one; ``queue.Empty`` when none comes within ``timeout`` seconds."""
        while True:
            event = self.events.get(timeout=timeout)
            yield event
            if is_final(event):
                return

    def ready(self) -> Iterator[Event]:
        """The events that arrived so far, without waiting."""
        while not self.events.empty():
            yield self.events.get_nowait()


class Scheduler:
    """Continuous batching with chunked prefill, priorities, preemption, cancellation and per-sequence decoding.

    Args:
        backend: the model's backend; decode uses ``forward_batch`` (or ``forward`` for a batch of one),
            prefill ``forward``.
        n_ctx: the most positions any one sequence may hold.
        monitor: the thermal monitor that sets the limits each step; None for the fixed ``limits``. It may be
            replaced between steps (the app's worker gives a loaded model its monitor).
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
        self._sequences: list[Sequence] = []  # every unfinished sequence, in no particular order
        self._handles: dict[int, RequestHandle] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards the inbox below, written from other threads
        self._inbox: list[tuple[str, int, object]] = []  # ("submit", id, (Request, handle)) | ("cancel", id, None) | ("priority", id, int)
        self._wakeup = threading.Event()

    # -- any thread ---------------------------------------------------------------------------------
    def submit(self, request: Request, queued: bool = True) -> RequestHandle:
        """Queue ``request``; it starts on a later step. ``queued=False``: its events are only in the step
        reports (a caller stepping the scheduler itself reads them there). Raises ValueError for a request
        that cannot run."""
        if not request.prompt_ids:
            raise ValueError("a request needs at least one prompt token")
        if request.max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {request.max_tokens}")
        if len(request.prompt_ids) >= self.n_ctx:
            raise ValueError(f"the prompt of {len(request.prompt_ids)} tokens leaves no room in n_ctx {self.n_ctx}")
        if request.cache is not None and request.cache.n_past >= len(request.prompt_ids):
            raise ValueError(f"the cache holds {request.cache.n_past} positions: at least the last of the "
                             f"{len(request.prompt_ids)} prompt tokens must be left to feed")
        handle = RequestHandle(next(self._ids), queued, request.prompt_ids)
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

    # -- the scheduler's thread ----------------------------------------------------------------------
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
                rest(report.pause_s, stop.is_set)

    def drop(self, request_id: int) -> None:
        """End a request now, with no final event: its reader went away. Call it on the scheduler's thread."""
        with self._lock:  # not started yet: take it out of the inbox
            self._inbox = [post for post in self._inbox if not (post[0] == "submit" and post[1] == request_id)]
        for seq in self._sequences:
            if seq.id == request_id:
                self._finish(seq, [], None)
                self._handles.pop(request_id, None)
                return

    def step(self) -> StepReport:
        """One scheduling round: admit and preempt, one decode pass, then up to one chunk of prefill."""
        now = self.clock()
        events: list[tuple[int, Event]] = []
        if self._inbox:  # (read without the lock: a post missed now is seen at the next step)
            self._drain_inbox(now, events)
        limits = self._limits()
        lone = self._lone_decoding()
        if lone is not None:  # the common case, a lone reply decoding: nothing to admit, stop or prefill
            decode_batch, decode_s = self._decode_pass([lone], limits, events)
            prefill_tokens, prefill_s = 0, 0.0
        else:
            self._end_stopped(now, events)
            ranked = sorted(self._sequences, key=_sort_key)
            self._admit(ranked, limits, now, events)
            decode_batch, decode_s = self._decode_pass([s for s in ranked if s.active and s.decoding], limits, events)
            prefill_tokens, prefill_s = self._prefill_step(ranked, limits, events)
        for request_id, event in events:
            queue = self._handles[request_id].events
            if queue is not None:
                queue.put(event)
            if is_final(event):
                del self._handles[request_id]
        in_flight = len(self._sequences) if lone is not None else sum(s.active for s in self._sequences)
        return StepReport(now, limits, decode_batch, decode_s, prefill_tokens, prefill_s, tuple(events),
                          in_flight, len(self._sequences) - in_flight)

    def _lone_decoding(self) -> Sequence | None:
        """The only sequence, when it holds its slot, decodes and is not stopped."""
        if len(self._sequences) != 1:
            return None
        seq = self._sequences[0]
        return seq if seq.active and seq.decoding and not seq.stopped else None

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
                seq = Sequence.start(request_id, request, now)
                self._sequences.append(seq)
                self._handles[request_id] = handle
                by_id[request_id] = seq
                events.append((request_id, RequestEvent(request_id, "queued", now)))
            elif kind == "cancel" and request_id in by_id:
                seq = by_id.pop(request_id)
                self._finish(seq, events, RequestEvent(request_id, "cancelled", now, text=seq.flush_text()))
            elif kind == "priority" and request_id in by_id:
                by_id[request_id].priority = payload

    def _end_stopped(self, now: float, events: list) -> None:
        """Sequences whose Stop flag is set and that will not decode a token this step end now; a decoding one
        ends with its next token (its event says "cancelled")."""
        for seq in [s for s in self._sequences if s.stopped and not (s.active and s.decoding)]:
            self._finish(seq, events, RequestEvent(seq.id, "cancelled", now, text=seq.flush_text()))

    def _finish(self, seq: Sequence, events: list, final: Event | None) -> None:
        seq.drop_lookahead()
        self._sequences.remove(seq)
        cache, seq.cache, seq.active = seq.cache, None, False
        if seq.request.on_finish is not None:
            seq.request.on_finish(seq.history, cache)
        if final is not None:
            events.append((seq.id, final))

    # -- slots ---------------------------------------------------------------------------------------
    def _admit(self, ranked: list[Sequence], limits: Limits, now: float, events: list) -> None:
        """Give the ``max_batch`` best sequences a slot; preempt the active ones that fell out."""
        room = max(1, limits.max_batch)
        for rank, seq in enumerate(ranked):
            if seq.active and rank >= room:
                self._preempt(seq, now, events)
        for seq in ranked[:room]:
            if not seq.active:
                self._start(seq, now, events)

    def _preempt(self, seq: Sequence, now: float, events: list) -> None:
        seq.drop_lookahead()
        seq.active = False
        seq.preemptions += 1
        if self.preempt == "recompute":
            seq.cache = None
        events.append((seq.id, RequestEvent(seq.id, "preempted", now, detail=f"KV cache: {self.preempt}")))

    def _start(self, seq: Sequence, now: float, events: list) -> None:
        seq.active = True
        if seq.cache is None:
            seq.cache = self.backend.new_cache(min(self.n_ctx, seq.prompt_len + seq.request.max_tokens))
            seq.cache.reserve_whole_room()
        kind = "resumed" if seq.preemptions else "started"
        events.append((seq.id, RequestEvent(seq.id, kind, now)))

    # -- compute -------------------------------------------------------------------------------------
    def _decode_pass(self, batch: list[Sequence], limits: Limits, events: list) -> tuple[int, float]:
        """One decode pass over the decoding sequences in ``batch``, then its tokens for each."""
        if not batch:
            return 0, 0.0
        start = self.clock()
        if len(batch) == 1:
            seq = batch[0]
            try:
                pairs, plain = self._decode_alone(seq, limits)
            except Cancelled:  # a draft model catching up was stopped
                self._finish(seq, events, RequestEvent(seq.id, "cancelled", self.clock(), text=seq.flush_text()))
                return 1, self.clock() - start
            elapsed = self.clock() - start
            if plain and self.monitor is not None:
                self.monitor.observe_decode(elapsed, decode_load(1, seq.cache.n_past))
            for token, logprob in pairs:
                if self._next_token(seq, token, logprob, events):
                    break
            return 1, elapsed
        for seq in batch:
            seq.drop_lookahead()  # device steps queued ahead, if any, end: the batch feeds every last token itself
        logits = self.backend.forward_batch([s.history[-1] for s in batch], [s.cache for s in batch])
        elapsed = self.clock() - start
        if self.monitor is not None:
            self.monitor.observe_decode(elapsed, decode_load(len(batch), sum(s.cache.n_past for s in batch)))
        for seq, row in zip(batch, logits):
            self._next_token(seq, *seq.request.sample(row, seq.history), events)
        return len(batch), elapsed

    def _decode_alone(self, seq: Sequence, limits: Limits) -> tuple[list[tuple[int, float]], bool]:
        """A batch of one: the tokens of one step, and whether it was one plain forward pass (timed for the
        drift detector). Speculation and pipelined device steps are the backend's declared capabilities."""
        request, backend = seq.request, self.backend
        spec = request.speculation
        if spec is not None and backend.verifies_drafts:
            if not seq.speculating:
                spec.begin(seq.history, seq.cache.n_ctx, self._chunk(seq, limits),
                           request.params.seed if request.params else None, request.cancel, seq.generated)
                seq.speculating = True
            return spec.decode(backend, seq.cache, request.sample, seq.history, request.params, limits.max_draft), False
        if seq.pipeline is None and backend.pipelined_greedy and request.device_greedy:
            seq.pipeline = backend.decode_greedy_pipelined(seq.history[-1], seq.cache)
        if seq.pipeline is not None:
            step = next(seq.pipeline, None)
            if step is not None:
                return [step], True
            seq.drop_lookahead()  # the device steps ended with the cache full: one plain step decides the last token
        return [request.sample(backend.forward([seq.history[-1]], seq.cache), seq.history)], True

    @staticmethod
    def _chunk(seq: Sequence, limits: Limits) -> int:
        return min(limits.prefill_chunk, seq.request.prefill_chunk or limits.prefill_chunk)

    def _prefill_step(self, ranked: list[Sequence], limits: Limits, events: list) -> tuple[int, float]:
        """Up to the policy's prefill chunk of prompt tokens, to the active sequences in priority order."""
        budget, used, start = limits.prefill_chunk, 0, None
        for seq in ranked:
            if used >= budget:
                break
            if not seq.active or seq.cache is None or seq.pipeline is not None or seq.cache.n_past >= seq.prefill_target:
                continue
            start = start if start is not None else self.clock()
            n = min(budget - used, self._chunk(seq, limits), seq.prefill_target - seq.cache.n_past)
            used += n
            self._prefill_chunk(seq, n, events)
        return used, (self.clock() - start) if used else 0.0

    def _prefill_chunk(self, seq: Sequence, n: int, events: list) -> None:
        begin = seq.cache.n_past
        try:
            logits = self.backend.forward(seq.history[begin:begin + n], seq.cache)
        except ValueError as e:  # a bad prompt (a token id out of range, say) fails its own request only
            self._finish(seq, events, RequestEvent(seq.id, "failed", self.clock(), detail=str(e)))
            return
        if seq.generated == 0 and seq.cache.n_past == seq.prefill_target:
            self._next_token(seq, *seq.request.sample(logits, seq.history), events)

    def _next_token(self, seq: Sequence, token: int, logprob: float, events: list) -> bool:
        """Record a chosen token, detokenize it, check the stop conditions and emit its event; True at the end."""
        seq.history.append(token)
        index, seq.generated = seq.generated, seq.generated + 1
        now = self.clock()
        if seq.first_at is None:
            seq.first_at = now
        text, finish = self._token_text(seq, token)
        event = GenerationEvent(token, text, float(logprob), index, seq.prompt_len, seq.cached_tokens,
                                seq.first_at - seq.submitted_at, now - seq.first_at, finish)
        if finish:
            self._finish(seq, events, event)
            return True
        events.append((seq.id, event))
        return False

    @staticmethod
    def _token_text(seq: Sequence, token: int) -> tuple[str, str | None]:
        request = seq.request
        if token in request.eog_ids:
            return seq.flush_text(), "eos"
        text, stopped = seq.matcher.feed(seq.text_for(token))
        if stopped:
            return text, "stop"
        if seq.generated >= request.max_tokens:
            finish = "length"
        elif len(seq.history) > seq.cache.n_ctx:
            finish = "context"  # no room to feed the token back
        elif seq.stopped:
            finish = "cancelled"
        else:
            return text, None
        return text + seq.flush_text(), finish


def _sort_key(seq: Sequence) -> tuple[int, int]:
    return seq.sort_key


def decode_load(batch: int, total_context: int) -> tuple[int, int]:
    """The drift detector's load key: batch size and a doubling bucket of the context the batch attends to."""
    return batch, int(math.log2(1 + total_context / CONTEXT_BUCKET))
