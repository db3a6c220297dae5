"""Who proposes the tokens the target verifies: a draft model sharing the vocabulary, or prompt lookup (n-grams)."""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Sequence

import numpy as np

from ..backends.base import Backend, KVCache
from ..generate import prefill, reusable_prefix
from ..sampling import SamplingParams, greedy_token
from .lookup import NgramIndex
from .rejection import draw, sampling_distribution

DRAFT_KIND = "draft"
DRAFT_PRIOR = 0.6  # a same-family draft model typically agrees on 60-80% of tokens
NGRAM_PRIORS = {3: 0.6, 2: 0.45, 1: 0.3}  # by match length (longer: 3): a longer match is likelier a copy in progress
UNLIMITED = 1 << 30  # a proposer that can offer any number of tokens


@dataclasses.dataclass(frozen=True)
class Candidate:
    """What the next proposal would be, before any work is spent on it."""

    kind: str  # the adaptive controller keeps acceptance per kind: "draft", "ngram3", "ngram2", "ngram1"
    available: int  # the most tokens it can propose
    prior: float  # the acceptance to expect of this kind before any is measured
    free: bool = False  # proposing costs nothing: it can be checked against plain steps while speculation is off


@dataclasses.dataclass(frozen=True)
class Proposal:
    """Drafted tokens to verify, with the distributions they were drawn from."""

    kind: str
    tokens: tuple[int, ...]
    q: tuple[np.ndarray, ...] | None  # per token (n_vocab,) float64; None: chosen deterministically (a point mass)
    caught_up: int = 0  # history tokens the proposer processed before drafting (a draft model catching up)


class Proposer(abc.ABC):
    """Proposes continuations of a sequence; one generation at a time."""

    @abc.abstractmethod
    def begin(self, history: Sequence[int], n_ctx: int, chunk_size: int,
              cancel: threading.Event | None = None) -> None:
        """Start a generation whose prompt (already in the target's cache) is ``history``."""

    @abc.abstractmethod
    def candidate(self, history: Sequence[int]) -> Candidate | None:
        """What ``propose`` would offer after ``history``, or None when there is nothing to propose."""

    @abc.abstractmethod
    def propose(self, history: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """Up to ``k`` tokens to follow ``history`` (``history[-1]`` is not yet in the target's cache)."""


class PromptLookup(Proposer):
    """Prompt-lookup decoding: propose what followed the latest earlier occurrence of the sequence's tail.

    Free to propose and very accurate when the answer copies from the prompt (code edits, quotes, summaries
    that reuse phrases); nearly useless otherwise, which the adaptive controller learns per n-gram length.
    """

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1):
        self.index = NgramIndex(ngram_max, ngram_min)

    def begin(self, history: Sequence[int], n_ctx: int, chunk_size: int,
              cancel: threading.Event | None = None) -> None:
        self.index.reset(history)

    def candidate(self, history: Sequence[int]) -> Candidate | None:
        self.index.extend(history[len(self.index):])
        match = self.index.find()
        if match is None:
            return None
        return Candidate(f"ngram{match.n}", UNLIMITED, NGRAM_PRIORS[min(match.n, 3)], free=True)

    def propose(self, history: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        self.index.extend(history[len(self.index):])
        match = self.index.find()
        tokens = tuple(self.index.continuation(match, k)) if match is not None and k > 0 else ()
        return Proposal(f"ngram{match.n}" if match is not None else "ngram0", tokens, None)


def draft_token(logits: np.ndarray, history: Sequence[int], params: SamplingParams,
                rng: np.random.Generator) -> tuple[int, np.ndarray | None]:
    """The draft model's next token and the distribution it was drawn from (None for greedy: the argmax)."""
    if params.greedy:
        return greedy_token(np.asarray(logits, dtype=np.float32), history, params), None
    q = sampling_distribution(logits, history, params)
    return draw(q, rng.random()), q


class DraftModel(Proposer):
    """A smaller model with the target's vocabulary drafts ``k`` tokens one step at a time.

    It keeps its own KV cache and the tokens in it across rounds and generations; each proposal first feeds
    the draft whatever part of the sequence it has not seen (usually the one or two tokens the target chose
    last round), after rolling back positions the target rejected.
    """

    def __init__(self, backend: Backend):
        self.backend = backend
        self.cache: KVCache | None = None
        self.tokens: list[int] = []  # the tokens whose keys and values are in self.cache

    def begin(self, history: Sequence[int], n_ctx: int, chunk_size: int,
              cancel: threading.Event | None = None) -> None:
        if self.cache is None or self.cache.n_ctx != n_ctx:
            self.cache, self.tokens = self.backend.new_cache(n_ctx), []
        self._catch_up(history, chunk_size, cancel)

    def candidate(self, history: Sequence[int]) -> Candidate | None:
        return Candidate(DRAFT_KIND, self.cache.n_ctx - len(history), DRAFT_PRIOR)

    def propose(self, history: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        caught_up, logits = self._catch_up(history, chunk_size=512)
        context, tokens, qs = list(history), [], []
        for i in range(k):
            token, q = draft_token(logits, context, params, rng)
            tokens.append(token)
            qs.append(q)
            context.append(token)
            if i + 1 < k:
                logits = self.backend.forward([token], self.cache)
                self.tokens.append(token)
        return Proposal(DRAFT_KIND, tuple(tokens), None if params.greedy else tuple(qs), caught_up)

    def _catch_up(self, history: Sequence[int], chunk_size: int,
                  cancel: threading.Event | None = None) -> tuple[int, np.ndarray]:
        """Roll the draft cache back to its common prefix with ``history`` and feed it the rest.

        Returns how many tokens were fed and the logits after the last one (one token is always recomputed).
        """
        common = reusable_prefix(self.tokens, history)
        self.cache.truncate(common)
        logits = prefill(self.backend, self.cache, list(history[common:]), chunk_size, cancel)
        self.tokens = list(history)
        return len(history) - common, logits
