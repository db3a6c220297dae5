"""An n-gram index over a growing token sequence: where did the sequence's last n tokens occur before?

Prompt-lookup decoding proposes the tokens that followed the most recent earlier occurrence of the sequence's
tail (the longest tail of ``ngram_max`` down to ``ngram_min`` tokens that has one). The index is updated as the
sequence grows, so a lookup is a dictionary access rather than a scan of the prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class NgramMatch:
    """The tail's ``n`` tokens also start at ``start``; what followed them begins at ``start + n``."""

    n: int
    start: int


class NgramIndex:
    """For every n-gram (``ngram_min <= n <= ngram_max``) of a sequence, the latest start that has a continuation.

    An n-gram is indexed once at least one token follows it, so the sequence's own tail never matches itself.
    """

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min} and {ngram_max}")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> latest start with a following token
        self._indexed = 0  # n-grams ending before this position are in _latest
        self._tokens: list[int] = []  # the sequence so far (a copy: callers may hand a list they keep growing)

    def reset(self, tokens: Sequence[int] = ()) -> None:
        """Forget everything and index ``tokens``."""
        self._latest.clear()
        self._indexed, self._tokens = 0, []
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the indexed sequence."""
        self._tokens.extend(int(t) for t in tokens)
        for end in range(self._indexed, len(self._tokens) - 1):  # the n-grams ending at ``end`` now have a follower
            for n in range(self.ngram_min, min(self.ngram_max, end + 1) + 1):
                self._latest[tuple(self._tokens[end - n + 1:end + 1])] = end - n + 1
        self._indexed = max(self._indexed, len(self._tokens) - 1)

    def find(self) -> NgramMatch | None:
        """The most recent earlier occurrence of the longest matching tail, or None."""
        size = len(self._tokens)
        for n in range(min(self.ngram_max, size), self.ngram_min - 1, -1):
            start = self._latest.get(tuple(self._tokens[size - n:]))
            if start is not None:
                return NgramMatch(n, start)
        return None

    def continuation(self, match: NgramMatch, limit: int) -> list[int]:
        """``limit`` tokens that followed ``match``; past the end of the sequence the proposal repeats itself
        (the sequence is taken to continue with the period the match implies: a list, a table, a loop)."""
        begin, size = match.start + match.n, len(self._tokens)
        out: list[int] = []
        for i in range(limit):
            out.append(self._tokens[begin + i] if begin + i < size else out[begin + i - size])
        return out

    def __len__(self) -> int:
        return len(self._tokens)
