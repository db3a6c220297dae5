"""The per-token stream: every reply of the loaded model, one or several, stepped through the engine's scheduler.

A lone reply is a batch of one; a request that arrives while replies stream is submitted to the same scheduler
and joins them at the next step (no hand-over: every reply keeps its sequence from start to finish). API requests
from the app's server are sequences in the same scheduler: the loop steps while any sequence is left, so they
decode in the chat's passes and the chat's replies in theirs, under one thermal policy. Each step
the loop follows the conversation on screen (its reply decodes first), delivers each reply's new text at once (a
piece held back until a later step could wait as long as the next token takes; the chat view coalesces repaints
instead), and rests as the thermal policy asks, in slices that Stop cuts short. No Qt here: the worker passes
callables for what it emits.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from engine.generate import GenerationEvent
from engine.scheduler import RequestHandle
from engine.thermal import rest

from .replies import ReplyStats

SHOWN_PRIORITY = 1  # the conversation on screen decodes first; the others get 0


@dataclasses.dataclass(eq=False)
class Reply:
    """One reply in flight, from the app's side: its request in the scheduler and what the user has seen of it."""

    request_id: int  # the app's id (tokens/finished/error carry it)
    conversation_id: int | None
    handle: RequestHandle
    cancel: threading.Event  # the Stop flag the engine checks every token
    dropped: int = 0  # messages left out to fit the context
    started_at: float = dataclasses.field(default_factory=time.monotonic)
    first_at: float | None = None  # when its first token arrived
    last: GenerationEvent | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)  # the reply's token ids so far
    pending: str = ""  # text of this step not yet emitted
    batched: bool = False  # a token of it came from a decode pass over several replies
    priority: int = 0

    @property
    def time_to_first_token_s(self) -> float | None:
        return self.first_at - self.started_at if self.first_at is not None else None

    def stats(self, reason: str, n_ctx: int | None = None, model: str | None = None,
              extra: dict | None = None) -> ReplyStats:
        """The reply's figures once it ended with ``reason``."""
        last = self.last
        return ReplyStats(reason, last.generated_tokens if last else 0, self.dropped, n_ctx, model, last,
                          self.time_to_first_token_s, self.batched, extra or {})


@dataclasses.dataclass
class Hooks:
    """What the loop tells the worker, and asks it, on the engine thread."""

    tokens: Callable[[int, str], None]  # (request id, text)
    finished: Callable[[Reply, str], None]  # (reply, finish reason)
    failed: Callable[[int, Exception], None]  # (request id, why: the engine's exception)
    shown: Callable[[], int | None]  # the conversation on screen
    admit: Callable[[ReplyLoop], None]  # add the requests that arrived since the last step
    event: Callable[[Reply, GenerationEvent], None]  # a token of a reply decoding alone (telemetry)
    sample: Callable[[int, float, int], None]  # (request id on screen or 0, aggregate decode tok/s, batch size)
    halted: Callable[[], bool] = lambda: False  # stop stepping sequences that are no reply (the engine shuts down)


class ReplyLoop:
    """Steps a model's scheduler until every reply it was given, and every other sequence in it (API requests),
    has ended.

    Args:
        scheduler: the loaded model's ``engine.scheduler.Scheduler`` (its monitor sets the limits).
        hooks: the worker's side.
        sample_interval_s: how often ``hooks.sample`` gets the aggregate decode rate of replies decoding together.
    """

    def __init__(self, scheduler, hooks: Hooks, sample_interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.scheduler, self.hooks, self.clock, self.sleep = scheduler, hooks, clock, sleep
        self.sample_interval_s = sample_interval_s
        self.replies: dict[int, Reply] = {}  # by the scheduler's request id

    def add(self, reply: Reply) -> None:
        """Follow ``reply`` (already submitted to the scheduler) from the next step."""
        self.replies[reply.handle.id] = reply

    def run(self) -> None:
        """Step until every reply and every other sequence has ended; on an exception every unfinished reply is
        dropped and gets an error (the API's requests see their model go)."""
        decoded, since, batch = 0, self.clock(), -1
        try:
            while self.replies or self._others_left():
                self.hooks.admit(self)
                self._follow_the_user()
                report = self.scheduler.step()
                others = report.decode_batch > len(self.replies)  # API sequences decoded (before replies end)
                self._deliver(report.decode_batch)
                if report.decode_batch > 1 or batch > 1 or others:
                    decoded += report.decode_batch
                    now = self.clock()
                    # every interval, and at once when the number of replies decoding together changes
                    if report.decode_batch != batch or now - since >= self.sample_interval_s:
                        rate = decoded / (now - since) if now > since else 0.0
                        self.hooks.sample(self._shown_request(), rate, report.decode_batch)
                        decoded, since = 0, now
                batch = report.decode_batch
                if report.pause_s > 0 and (self.replies or self._others_left()):
                    rest(report.pause_s, self._any_stopped, self.sleep)
        except Exception as exc:
            for sid, reply in self.replies.items():
                self.scheduler.drop(sid)
                self.hooks.failed(reply.request_id, exc)
            self.replies.clear()
            raise

    # -- internals ---------------------------------------------------------------------------------
    def _others_left(self) -> bool:
        """Sequences that are no reply of this loop (API requests) are left to step."""
        return self.scheduler.has_work and not self.hooks.halted()

    def _follow_the_user(self) -> None:
        """Priorities follow the conversation on screen."""
        shown = self.hooks.shown()
        for sid, reply in self.replies.items():
            priority = SHOWN_PRIORITY if reply.conversation_id is not None and reply.conversation_id == shown else 0
            if reply.priority != priority:
                self.scheduler.set_priority(sid, priority)
                reply.priority = priority

    def _deliver(self, decode_batch: int) -> None:
        now = self.clock()
        for sid, reply in list(self.replies.items()):
            for event in reply.handle.ready():
                if isinstance(event, GenerationEvent):
                    self._token(reply, event, decode_batch, now)
                    if event.finish_reason is not None:
                        self._end(sid, reply, event.finish_reason)
                elif event.kind == "cancelled":
                    reply.pending += event.text
                    self._end(sid, reply, "cancelled")
                elif event.kind == "failed":
                    del self.replies[sid]
                    if reply.pending:  # text that came with the failure (a remote stream) is kept, then the error
                        self.hooks.tokens(reply.request_id, reply.pending)
                        reply.pending = ""
                    self.hooks.failed(reply.request_id, ValueError(event.detail))  # refused prompt, broken stream
            if sid in self.replies and reply.pending:  # now: the next step may take as long as a slow token
                self.hooks.tokens(reply.request_id, reply.pending)
                reply.pending = ""

    def _token(self, reply: Reply, event: GenerationEvent, decode_batch: int, now: float) -> None:
        if reply.first_at is None:
            reply.first_at = now
        if decode_batch > 1 and event.index > 0:
            reply.batched = True
        reply.last = event
        reply.tokens.append(event.id)
        reply.pending += event.text
        if decode_batch <= 1 and len(self.replies) == 1:
            self.hooks.event(reply, event)

    def _end(self, sid: int, reply: Reply, reason: str) -> None:
        del self.replies[sid]
        if reply.pending:
            self.hooks.tokens(reply.request_id, reply.pending)
            reply.pending = ""
        self.hooks.finished(reply, reason)

    def _shown_request(self) -> int:
        shown = self.hooks.shown()
        return next((r.request_id for r in self.replies.values() if r.conversation_id == shown), 0)

    def _any_stopped(self) -> bool:
        return any(r.cancel.is_set() for r in self.replies.values())
