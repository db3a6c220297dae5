"""The layers of generation below the scheduler: prefill, the (token, logprob) step, stop strings and the event.

``engine.scheduler`` runs every reply as a sequence: its decode step yields (token, logprob) pairs, which become
``GenerationEvent``s with text and timings; ``Model.generate`` streams them, and the CLI or the app's worker is
the outermost layer that shows them. ``generate_step`` is the same plain decoding as one bare generator, for
benchmarks and tests to compare against. Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .backends.base import Backend, KVCache

FINISH_REASONS = ("eos", "stop", "length", "context", "cancelled")


@dataclasses.dataclass(frozen=True)
class GenerationEvent:
    """One generated token. The last event of a generation has ``finish_reason`` set.

    ``text`` is the new text this token completes; it can be '' (half of a multi-byte character, a
    control token, or text held back because it may be the start of a stop string).
    """

    id: int
    text: str
    logprob: float
    index: int  # 0 for the first generated token
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV state was reused rather than recomputed
    prefill_s: float  # time to first token
    decode_s: float  # time spent on the tokens after the first
    finish_reason: str | None = None

    @property
    def generated_tokens(self) -> int:
        return self.index + 1

    @property
    def prefill_tps(self) -> float:
        computed = self.prompt_tokens - self.cached_tokens
        return computed / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.index / self.decode_s if self.decode_s > 0 else 0.0


class Cancelled(Exception):
    """Raised inside the generators when the caller's cancel event is set during prefill."""


def reusable_prefix(cached: Sequence[int], tokens: Sequence[int]) -> int:
    """How many leading ``tokens`` a cache holding ``cached`` can keep: their common prefix, short of the last
    token (its logits are needed, so it is always recomputed)."""
    common = 0
    for a, b in zip(cached, tokens[:-1]):
        if a != b:
            break
        common += 1
    return common


def prefill(backend: Backend, cache: KVCache, tokens: Sequence[int], chunk_size: int,
            cancel: threading.Event | None = None) -> np.ndarray:
    """Feed ``tokens`` to the cache in chunks, checking ``cancel`` between chunks; return the last logits."""
    if not tokens:
        raise ValueError("prefill needs at least one token")
    logits = None
    for start in range(0, len(tokens), chunk_size):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        logits = backend.forward(tokens[start:start + chunk_size], cache)
    return logits


def generate_step(backend: Backend, cache: KVCache, new_tokens: Sequence[int],
                  sample: Callable[[np.ndarray, Sequence[int]], tuple[int, float]], history: list[int],
                  chunk_size: int = 512, cancel: threading.Event | None = None) -> Iterator[tuple[int, float]]:
    """Yield ``(token, logprob)`` forever: prefill ``new_tokens``, then decode one token per step.

    Args:
        backend: the model's compute backend.
        cache: the sequence's KV cache, already holding the reused prefix of the prompt.
        new_tokens: the prompt tokens not yet in ``cache``.
        sample: picks a token from logits given the token history (penalties read it).
        history: every token of the sequence so far; generated tokens are appended to it.
        chunk_size: prefill chunk size in tokens.
        cancel: set from another thread to stop; checked between prefill chunks (the caller checks it per token).

    Yields:
        The chosen token and its log-probability. The caller stops iterating.
    """
    logits = prefill(backend, cache, new_tokens, chunk_size, cancel)
    while True:
        token, logprob = sample(logits, history)
        history.append(token)
        yield token, logprob
        if cache.n_past >= cache.n_ctx:
            return  # no room to feed the token back; the caller reports "context"
        logits = backend.forward([token], cache)


class StopMatcher:
    """Holds back text that may be the start of a stop string; tells where a stop string completed."""

    def __init__(self, stop: Sequence[str]):
        self.stop = [s for s in stop if s]
        self.text = ""
        self.emitted = 0

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add ``piece``; return the text safe to show now and whether a stop string was completed."""
        self.text += piece
        if not self.stop:
            return self._emit(len(self.text)), False
        search_from = max(0, self.emitted - max(map(len, self.stop)))
        hits = [i for i in (self.text.find(s, search_from) for s in self.stop) if i >= 0]
        if hits:
            return self._emit(min(hits)), True
        return self._emit(len(self.text) - self._held_back()), False

    def _held_back(self) -> int:
        for n in range(min(len(self.text), max(map(len, self.stop)) - 1), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0

    def _emit(self, end: int) -> str:
        end = max(end, self.emitted)
        out, self.emitted = self.text[self.emitted:end], end
        return out

    def flush(self) -> str:
        return self._emit(len(self.text))
