"""Speculative decoding as a generator shaped like ``generate_step``: draft, verify in one pass, keep what agrees.

Each round a proposer drafts ``k`` tokens; the target runs once over the pending token and the drafts
(``k + 1`` positions, ``all_logits=True``) and keeps the longest prefix the rule accepts, plus one token of its
own (the correction at the first rejection, or a bonus token when all were kept). Positions of rejected drafts
are rolled back with ``KVCache.truncate``. Greedy verification asks the plain sampler for each position, so
the tokens are the ones plain decoding would choose; sampled verification uses the rejection rule, so their
distribution is the target's.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..backends.base import Backend, KVCache
from ..generate import prefill
from ..sampling import SamplingParams
from .adaptive import AdaptiveDraftLength
from .proposers import Candidate, DraftModel, PromptLookup, Proposal, Proposer
from .rejection import draw, point_mass, sampling_distribution, verify_drafted
from .vocabulary import check_same_vocabulary

if TYPE_CHECKING:
    from ..model import Model

Sample = Callable[[np.ndarray, Sequence[int]], tuple[int, float]]
_RNG_STREAM = 0x5BEC  # keeps the rule's random draws apart from the plain sampler's for the same seed


@dataclasses.dataclass(frozen=True)
class SpeculationStats:
    """What speculation did during one generation."""

    proposed: int = 0  # drafted tokens sent to verification
    accepted: int = 0  # drafted tokens the target kept
    verify_passes: int = 0  # speculative rounds (one target forward each)
    plain_steps: int = 0  # decode steps taken without speculation (nothing to propose, or it did not pay)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_k(self) -> float:
        """Drafted tokens per verify pass."""
        return self.proposed / self.verify_passes if self.verify_passes else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """Tokens emitted per verify pass: the accepted drafts plus the target's own token."""
        return (self.accepted + self.verify_passes) / self.verify_passes if self.verify_passes else 0.0


def verify_greedy(rows: np.ndarray, drafted: Sequence[int], sample: Sample,
                  history: Sequence[int]) -> list[tuple[int, float]]:
    """The tokens plain greedy decoding chooses at each verified position, up to the first disagreement.

    Args:
        rows: (len(drafted) + 1, n_vocab) logits; row ``j`` follows ``history`` and ``drafted[:j]``.
        drafted: the proposed tokens.
        sample: the plain sampler (greedy: deterministic, with its penalties reading the history).
        history: the sequence before the drafts.
    """
    context, out = list(history), []
    for j, row in enumerate(rows):
        token, logprob = sample(row, context)
        out.append((token, logprob))
        if j == len(drafted) or token != drafted[j]:
            return out
        context.append(token)
    raise ValueError(f"{len(rows)} logit rows for {len(drafted)} drafted tokens; need one more row than drafts")


def verify_sampled(rows: np.ndarray, proposal: Proposal, history: Sequence[int], params: SamplingParams,
                   rng: np.random.Generator) -> list[tuple[int, float]]:
    """The rejection rule over a proposal; the emitted tokens are distributed as the target samples them."""
    context, out = list(history), []
    for j, drafted in enumerate(proposal.tokens):
        p = sampling_distribution(rows[j], context, params)
        q = proposal.q[j] if proposal.q is not None else point_mass(drafted, p.size)
        kept, token = verify_drafted(p, q, drafted, rng)
        out.append((token, math.log(p[token])))
        if not kept:
            return out
        context.append(token)
    p = sampling_distribution(rows[len(proposal.tokens)], context, params)
    token = draw(p, rng.random())
    out.append((token, math.log(p[token])))
    return out


def _rule_rng(seed: int | None) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(_RNG_STREAM,))))


class Speculator:
    """Speculative decoding for one target model: a proposer, an adaptive draft length and per-generation stats.

    ``max_draft`` caps the draft length and may be lowered at any time (the thermal policy does under
    pressure); 0 means plain decoding. ``stats`` describes the running or last generation. Not thread-safe
    otherwise. With ``adaptive=True`` the draft lengths depend on measured times, so seeded sampling is
    reproducible only with ``adaptive=False``; greedy output never depends on them.
    """

    def __init__(self, proposer: Proposer, max_draft: int = 8, adaptive: bool = True):
        self.proposer = proposer
        self.controller = AdaptiveDraftLength(max_draft, adaptive)
        self.stats = SpeculationStats()
        self._rng = _rule_rng(None)
        self._prompt_length = 0

    @property
    def max_draft(self) -> int:
        return self.controller.max_draft

    @max_draft.setter
    def max_draft(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"max_draft must be at least 0, got {value}")
        self.controller.max_draft = value

    def begin(self, history: Sequence[int], n_ctx: int, chunk_size: int = 512, seed: int | None = None,
              cancel: threading.Event | None = None, generated: int = 0) -> None:
        """Start speculating on a sequence whose ``history`` (all but its last token in the target's cache) is
        what it holds now; resets ``stats``. One sequence at a time.

        Args:
            history: every token of the sequence so far.
            n_ctx: the target cache's size (a draft model's cache gets the same).
            chunk_size: prefill chunk for a draft model catching up with ``history``.
            seed: the sampler's seed; the rejection rule draws from a stream of its own derived from it.
            cancel: stops a draft model's catch-up between chunks (``engine.generate.Cancelled``).
            generated: how many of ``history``'s tokens were generated (the rest is the prompt).
        """
        self._rng = _rule_rng(seed)
        self._prompt_length = len(history) - generated
        self.proposer.begin(history, n_ctx, chunk_size, cancel)
        self.controller.begin()
        self.stats = SpeculationStats()

    def decode(self, backend: Backend, cache: KVCache, sample: Sample, history: Sequence[int],
               params: SamplingParams, draft_cap: int | None = None) -> list[tuple[int, float]]:
        """One decode step of the sequence ``begin`` started: a speculative round (one target pass over the
        pending token and the drafts) or a plain step. ``history[-1]`` is not yet in ``cache``.

        Args:
            backend, cache: the target and the sequence's cache.
            sample: the plain sampler; it chooses plain steps' tokens and, when greedy, every verified position.
            history: the sequence so far (not changed here).
            params: what ``sample`` was made from (the rejection rule needs the distribution).
            draft_cap: at most this many drafts this round (the thermal policy's cap), on top of ``max_draft``.

        Returns:
            The tokens to emit with their log-probabilities; ``cache`` then holds every one but the last. A
            caller that emits fewer rolls the cache back to its emitted tokens but the last.
        """
        return self._round(backend, cache, sample, history, params, self._rng,
                           len(history) - self._prompt_length, draft_cap)

    def generate_step(self, backend: Backend, cache: KVCache, new_tokens: Sequence[int], sample: Sample,
                      history: list[int], chunk_size: int = 512, cancel: threading.Event | None = None, *,
                      params: SamplingParams) -> Iterator[tuple[int, float]]:
        """``begin`` and ``decode`` as a generator shaped like ``engine.generate.generate_step`` (benchmarks and
        tests drive it; the scheduler calls ``decode`` per step).

        Yields:
            The chosen token and its log-probability under the target. The caller stops iterating; the cache
            then holds every yielded token but the last, as after ``generate_step``.
        """
        logits = prefill(backend, cache, new_tokens, chunk_size, cancel)
        self.begin(history, cache.n_ctx, chunk_size, params.seed, cancel)
        prompt_length = len(history)
        pending = [sample(logits, history)]
        try:
            while True:
                for token, logprob in pending:
                    history.append(token)
                    yield token, logprob
                if cache.n_past >= cache.n_ctx:
                    return  # no room to feed the token back; the caller reports "context"
                pending = self.decode(backend, cache, sample, history, params)
        finally:
            if len(history) > prompt_length and cache.n_past > len(history) - 1:
                cache.truncate(len(history) - 1)  # verified positions the caller stopped before seeing

    def _round(self, backend: Backend, cache: KVCache, sample: Sample, history: list[int], params: SamplingParams,
               rng: np.random.Generator, position: int, draft_cap: int | None = None) -> list[tuple[int, float]]:
        """One speculative round (or a plain step); returns the tokens to emit. ``history[-1]`` is not yet fed."""
        room = cache.n_ctx - cache.n_past - 2  # the verify pass must leave the cache short of full before the last token
        if draft_cap is not None:
            room = min(room, draft_cap)
        candidate = self.proposer.candidate(history) if room > 0 and self.max_draft > 0 else None
        k = (self.controller.draft_length(candidate.kind, min(candidate.available, room), position, candidate.prior,
                                          candidate.free) if candidate else 0)
        if k == 0:
            return [self._plain_step(backend, cache, sample, history, candidate, params, rng)]
        start = time.perf_counter()
        proposal = self.proposer.propose(history, k, params, rng)
        drafted = time.perf_counter()
        if not proposal.tokens:
            return [self._plain_step(backend, cache, sample, history, None, params, rng)]
        rows = backend.forward([history[-1], *proposal.tokens], cache, all_logits=True)
        if params.greedy:
            out = verify_greedy(rows, proposal.tokens, sample, history)
        else:
            out = verify_sampled(rows, proposal, history, params, rng)
        accepted = len(out) - 1
        cache.truncate(cache.n_past - (len(proposal.tokens) - accepted))
        self.controller.record_round(proposal.kind, len(proposal.tokens), accepted, drafted - start,
                                     time.perf_counter() - drafted, proposal.caught_up, candidate.prior)
        s = self.stats
        self.stats = dataclasses.replace(s, proposed=s.proposed + len(proposal.tokens),
                                         accepted=s.accepted + accepted, verify_passes=s.verify_passes + 1)
        return out

    def _plain_step(self, backend: Backend, cache: KVCache, sample: Sample, history: list[int],
                    candidate: Candidate | None, params: SamplingParams,
                    rng: np.random.Generator) -> tuple[int, float]:
        """One plain decode step; a free ``candidate`` is checked against its token (an exact acceptance test
        when greedy, and an unbiased one when sampling: a point-mass draft is kept with probability p(token))."""
        shadow = self.proposer.propose(history, 1, params, rng).tokens if candidate and candidate.free else ()
        start = time.perf_counter()
        token = sample(backend.forward([history[-1]], cache), history)
        self.controller.record_plain(time.perf_counter() - start)
        if shadow:
            self.controller.observe(candidate.kind, shadow[0] == token[0], candidate.prior)
        self.stats = dataclasses.replace(self.stats, plain_steps=self.stats.plain_steps + 1)
        return token


def draft_model_speculator(target: Model, draft: Model, max_draft: int = 8, adaptive: bool = True) -> Speculator:
    """Speculation for ``target`` with ``draft`` proposing (it may be the same file loaded twice).

    Raises:
        ValueError: the two models' vocabularies differ (see ``check_same_vocabulary``).
    """
    check_same_vocabulary(target.tokenizer, target.config, draft.tokenizer, draft.config)
    return Speculator(DraftModel(draft.backend), max_draft, adaptive)


def prompt_lookup_speculator(max_draft: int = 12, adaptive: bool = True, ngram_max: int = 3,
                             ngram_min: int = 1) -> Speculator:
    """Speculation without a draft model: n-gram matches against the prompt and the answer so far."""
    return Speculator(PromptLookup(ngram_max, ngram_min), max_draft, adaptive)
