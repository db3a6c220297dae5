"""Prefix reuse across API requests: the KV caches of finished requests, kept by the tokens they hold.

A new request whose prompt starts like one of them (a long shared system prompt, a conversation going on) takes
that cache, cut back to the common prefix, so only the rest of its prompt is computed. A cache is used by one
sequence at a time: taking it removes it from here, and the request's end puts it back.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..backends.base import KVCache
from ..generate import reusable_prefix

MIN_REUSE_TOKENS = 8  # a shorter common prefix is not worth holding on to a cache for


class PrefixCache:
    """At most ``capacity`` idle KV caches, the oldest dropped first; safe to use from any thread."""

    def __init__(self, capacity: int = 4, min_tokens: int = MIN_REUSE_TOKENS):
        self.capacity, self.min_tokens = capacity, min_tokens
        self._lock = threading.Lock()
        self._entries: list[tuple[tuple[int, ...], KVCache]] = []  # (tokens in the cache, cache), oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, ids: Sequence[int], positions: int) -> KVCache | None:
        """The cache sharing the longest prefix with ``ids`` (at least ``min_tokens``) that can hold
        ``positions``, cut back to that prefix and no longer kept here; None when none fits."""
        with self._lock:
            scored = [(reusable_prefix(tokens, ids), i) for i, (tokens, cache) in enumerate(self._entries)
                      if cache.n_ctx >= positions]
            common, index = max(scored, default=(0, -1))
            if common < self.min_tokens:
                return None
            _, cache = self._entries.pop(index)
        try:
            cache.truncate(common)
        except ValueError:  # a cache that cannot go back that far (a sliding-window ring): drop it
            return None
        return cache

    def put(self, tokens: Sequence[int], cache: KVCache | None) -> None:
        """Keep ``cache``, which holds ``tokens``, for later requests."""
        if cache is None or self.capacity <= 0 or len(tokens) < self.min_tokens:
            return
        with self._lock:
            self._entries.append((tuple(tokens), cache))
            del self._entries[:-self.capacity]
