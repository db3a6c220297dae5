"""Request and Sequence: what a reply asks for, and everything one reply holds while the scheduler runs it.

Every reply — a lone chat answer, one of several overlapping conversations, an API request — is one ``Sequence``
in ``engine.scheduler.Scheduler``: its tokens, KV cache, sampler (with its RNG), stop matcher, speculation state
and timings live here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence as Seq
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .backends.base import KVCache
from .generate import StopMatcher

if TYPE_CHECKING:
    from .sampling import SamplingParams
    from .speculative import Speculator

Sampler = Callable[[np.ndarray, Seq[int]], tuple[int, float]]  # (logits, history) -> (token, logprob)


class TokenDecoder(Protocol):
    """Incremental detokenizer: text completed by each token, and what is left at the end."""

    def add(self, token: int) -> str: ...

    def flush(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Request:
    """What to generate. ``sample``, ``decoder`` and ``speculation`` are per-request objects with their own state.

    ``cancel`` is the caller's Stop flag, checked every token and between prefill chunks: a token's event then ends
    the stream with finish_reason "cancelled" (before the first token, a "cancelled" RequestEvent does).
    ``on_finish(history, cache)`` is called on the scheduler's thread when the request ends, with every token of
    the sequence and the cache (None when it was dropped), which then holds ``history[:cache.n_past]``.
    """

    prompt_ids: tuple[int, ...]
    sample: Sampler
    max_tokens: int = 256
    priority: int = 0  # higher runs first
    eog_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    decoder: TokenDecoder | None = None  # without one, events carry no text
    cache: KVCache | None = None  # a cache of this backend holding the first cache.n_past prompt tokens, to go on from
    prefill_chunk: int | None = None  # at most this many of its prompt tokens per step (the policy's cap applies too)
    params: SamplingParams | None = None  # what ``sample`` was made from; speculation and device greedy read it
    speculation: Speculator | None = None  # drafts verified several per pass while this sequence decodes alone
    cancel: threading.Event | None = None
    on_finish: Callable[[list[int], KVCache | None], None] | None = None

    @property
    def device_greedy(self) -> bool:
        """The sampler is a plain argmax (greedy, no penalties), which a backend may take on the device."""
        return self.params is not None and self.params.greedy and not self.params.penalises


@dataclasses.dataclass(eq=False)
class Sequence:
    """One request in flight: its tokens, cache, sampler, stop state, speculation state and timings."""

    id: int
    request: Request
    order: int  # arrival order: first come first served within a priority
    priority: int
    history: list[int]  # prompt then generated tokens; while decoding the cache holds all but the last
    matcher: StopMatcher
    submitted_at: float
    cache: KVCache | None = None
    cached_tokens: int = 0  # prompt tokens the request's cache brought (not computed again)
    active: bool = False  # holds a slot (prefilling or decoding)
    generated: int = 0
    first_at: float | None = None
    preemptions: int = 0
    speculating: bool = False  # the request's speculator has begun on this sequence
    pipeline: Iterator[tuple[int, float]] | None = None  # device steps in flight: the cache holds history[-1] too

    @classmethod
    def start(cls, request_id: int, request: Request, now: float) -> Sequence:
        cache = request.cache
        return cls(request_id, request, request_id, request.priority, list(request.prompt_ids),
                   StopMatcher(request.stop), now, cache=cache, cached_tokens=cache.n_past if cache else 0)

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def prefill_target(self) -> int:
        """Positions the cache must hold before the next decode step."""
        return self.prompt_len if self.generated == 0 else len(self.history) - 1

    @property
    def decoding(self) -> bool:
        return self.cache is not None and self.generated > 0 and (
            self.pipeline is not None or self.cache.n_past == self.prefill_target)

    @property
    def sort_key(self) -> tuple[int, int]:
        return -self.priority, self.order

    @property
    def stopped(self) -> bool:
        flag = self.request.cancel
        return flag is not None and flag.is_set()

    def drop_lookahead(self) -> None:
        """Stop any work computed ahead of the emitted tokens: close device steps in flight and roll the cache
        back to every token but the last (drafted or pipelined positions beyond it go)."""
        if self.pipeline is not None:
            self.pipeline.close()
            self.pipeline = None
        if self.cache is not None and self.generated > 0 and self.cache.n_past > len(self.history) - 1:
            self.cache.truncate(len(self.history) - 1)

    def text_for(self, token: int) -> str:
        decoder = self.request.decoder
        return decoder.add(token) if decoder is not None else ""

    def flush_text(self) -> str:
        """Text held back by the decoder and the stop matcher, at the end of the stream."""
        if self.generated == 0:
            return ""
        decoder = self.request.decoder
        return self.matcher.feed(decoder.flush() if decoder else "")[0] + self.matcher.flush()
