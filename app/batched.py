"""Several replies at once: the engine's scheduler, run on the engine thread while more than one reply streams.

The worker streams a lone reply through ``Model.chat`` (speculative decoding, the thermal pacer). When a request
for the same model arrives meanwhile, the running reply is handed over (``Model.continuation``: same cache, same
sampler) and both go on here, decoded in one batched forward pass per step under the thermal policy's limits
(batch size, prefill chunk, rest between steps), the conversation on screen first. Requests that arrive later
join at the next step. Speculative decoding is not used while replies share the model. No Qt here: the worker
passes callables for what it emits.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from engine.generate import GenerationEvent
from engine.scheduler import Request, RequestHandle, Scheduler
from engine.thermal import ThermalMonitor
from engine.thermal.pacing import PAUSE_SLICE_S

COALESCE_S = 0.03  # emit a reply's text at most this often, so the GUI repaints at ~30 Hz at most
SHOWN_PRIORITY = 1  # the conversation on screen decodes first; the others get 0


@dataclasses.dataclass
class BatchedReply:
    """One reply under the scheduler, from the app's side."""

    request_id: int  # the app's id (tokens/finished/error carry it)
    conversation_id: int | None
    request: Request
    dropped: int = 0  # messages left out to fit the context
    before: GenerationEvent | None = None  # the last event of the lone stream this reply was handed over from
    handle: RequestHandle | None = None
    sequence: list[int] = dataclasses.field(init=False)  # prompt and generated tokens
    pending: str = ""
    emitted_at: float = 0.0
    last: GenerationEvent | None = None
    cancel_sent: bool = False

    def __post_init__(self):
        self.sequence = list(self.request.prompt_ids)

    @property
    def generated_tokens(self) -> int:
        return (self.before.generated_tokens if self.before else 0) + (self.last.generated_tokens if self.last else 0)


@dataclasses.dataclass
class Hooks:
    """What the runner tells the worker, and asks it, on the engine thread."""

    tokens: Callable[[int, str], None]  # (request id, text)
    finished: Callable[[int, dict], None]  # (request id, stats)
    failed: Callable[[int, str], None]  # (request id, message)
    stopped: Callable[[int], bool]  # has the user stopped this request?
    shown: Callable[[], int | None]  # the conversation on screen
    admit: Callable[["BatchRunner"], None]  # add the requests that arrived since the last step
    sample: Callable[[int, float, int], None]  # (request id on screen or 0, aggregate decode tok/s, batch size)


class BatchRunner:
    """Steps a Scheduler on one model until every reply it was given has ended.

    Args:
        model: the loaded engine.model.Model.
        monitor: the thermal monitor whose limits the scheduler applies each step.
        hooks: the worker's side.
        sample_interval_s: how often ``hooks.sample`` gets the aggregate decode rate.
    """

    def __init__(self, model, monitor: ThermalMonitor, hooks: Hooks, sample_interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.model, self.hooks, self.clock, self.sleep = model, hooks, clock, sleep
        self.scheduler = Scheduler(model.backend, model.n_ctx, monitor=monitor)
        self.sample_interval_s = sample_interval_s
        self._replies: dict[int, BatchedReply] = {}  # by the scheduler's request id
        self._priorities: dict[int, int] = {}

    def add(self, reply: BatchedReply) -> None:
        """Submit ``reply``'s request (ValueError: it cannot run, e.g. its prompt leaves no room)."""
        reply.handle = self.scheduler.submit(reply.request)
        self._replies[reply.handle.id] = reply
        self._priorities[reply.handle.id] = reply.request.priority

    def run(self) -> None:
        """Step until every reply has ended; on an exception, every unfinished reply gets an error first."""
        decoded, since, batch = 0, self.clock(), -1
        try:
            while self._replies:
                self.hooks.admit(self)
                self._follow_the_user()
                report = self.scheduler.step()
                self._deliver()
                decoded += report.decode_batch
                now = self.clock()
                # every interval, and at once when the number of replies decoding together changes
                if report.decode_batch != batch or now - since >= self.sample_interval_s:
                    rate = decoded / (now - since) if now > since else 0.0
                    self.hooks.sample(self._shown_request(), rate, report.decode_batch)
                    decoded, since, batch = 0, now, report.decode_batch
                self._rest(report.pause_s)
        except Exception as exc:
            for reply in self._replies.values():
                self.hooks.failed(reply.request_id, str(exc) or type(exc).__name__)
            self._replies.clear()
            raise

    # -- internals ---------------------------------------------------------------------------------
    def _follow_the_user(self) -> None:
        """Priorities follow the conversation on screen; stopped replies are cancelled."""
        shown = self.hooks.shown()
        for sid, reply in self._replies.items():
            priority = SHOWN_PRIORITY if reply.conversation_id is not None and reply.conversation_id == shown else 0
            if self._priorities[sid] != priority:
                self.scheduler.set_priority(sid, priority)
                self._priorities[sid] = priority
            if not reply.cancel_sent and self.hooks.stopped(reply.request_id):
                self.scheduler.cancel(sid)
                reply.cancel_sent = True

    def _deliver(self) -> None:
        now = self.clock()
        for sid, reply in list(self._replies.items()):
            while not reply.handle.events.empty():
                event = reply.handle.events.get_nowait()
                if isinstance(event, GenerationEvent):
                    reply.sequence.append(event.id)
                    reply.last = event
                    reply.pending += event.text
                    if event.finish_reason is not None:
                        self._end(sid, reply, event.finish_reason)
                elif event.kind == "cancelled":
                    reply.pending += event.text
                    self._end(sid, reply, "cancelled")
                elif event.kind == "failed":
                    del self._replies[sid]
                    self.hooks.failed(reply.request_id, event.detail)
            if sid in self._replies and reply.pending and now - reply.emitted_at >= COALESCE_S:
                self.hooks.tokens(reply.request_id, reply.pending)
                reply.pending, reply.emitted_at = "", now

    def _end(self, sid: int, reply: BatchedReply, reason: str) -> None:
        del self._replies[sid]
        if reply.pending:
            self.hooks.tokens(reply.request_id, reply.pending)
            reply.pending = ""
        self.hooks.finished(reply.request_id, self.stats(reply, reason))

    def stats(self, reply: BatchedReply, reason: str) -> dict:
        """The reply's stats, as the worker gives a lone reply's; ``batched`` marks them. The prompt and its
        prefill are the lone stream's when the reply was handed over; decode speed is over the batched part."""
        model, first, last = self.model, reply.before, reply.last
        stats = {"dropped": reply.dropped, "n_ctx": model.n_ctx, "model": model.name, "finish_reason": reason,
                 "generated_tokens": reply.generated_tokens, "batched": True,
                 **model.thinking_stats(reply.generated_tokens, reply.sequence)}
        timed = first or last
        if timed is None:  # cancelled before its first token
            return stats
        prompt_tokens = timed.prompt_tokens
        stats.update(prompt_tokens=prompt_tokens, cached_tokens=timed.cached_tokens,
                     prefill_s=round(timed.prefill_s, 4), prefill_tps=round(timed.prefill_tps, 2),
                     decode_s=round((first.decode_s if first else 0.0) + (last.decode_s if last else 0.0), 4),
                     decode_tps=round(last.decode_tps if last else first.decode_tps, 2),
                     context_used=prompt_tokens + reply.generated_tokens)
        return stats

    def _shown_request(self) -> int:
        shown = self.hooks.shown()
        return next((r.request_id for r in self._replies.values() if r.conversation_id == shown), 0)

    def _rest(self, pause_s: float) -> None:
        """The policy's rest between steps, in slices; a Stop cuts it short."""
        rested = 0.0
        while rested < pause_s and self._replies:
            if any(self.hooks.stopped(r.request_id) for r in self._replies.values()):
                return
            nap = min(PAUSE_SLICE_S, pause_s - rested)
            self.sleep(nap)
            rested += nap
