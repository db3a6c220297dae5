"""Token sampling: penalties, top-k, top-p, min-p and temperature as small pure functions, composed by make_sampler."""

from __future__ import annotations

import collections
import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

_BIT_GENERATOR = "PCG64"
_STATE_VERSION = 1


class NonFiniteLogitsError(ValueError):
    """The model's scores for the next token hold NaN or +inf (or are all -inf): no token can be chosen.

    Only the model's own arithmetic produces such scores (damaged weights, or numbers that overflow in a
    backend), so the message says so; the same input will fail the same way again.
    """


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. Defaults are llama.cpp's.

    ``temperature <= 0`` means greedy decoding: the highest logit after the repetition penalties wins and
    top-k, top-p and min-p are ignored. ``top_k = 0``, ``top_p = 1``, ``min_p = 0``, ``repeat_penalty = 1``
    and ``repeat_last_n = 0`` each switch their step off; ``repeat_last_n = -1`` penalises the whole history.
    ``seed = None`` draws a seed from the operating system.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        _check_real("temperature", self.temperature)
        _check_int("top_k", self.top_k, minimum=0)
        _check_real("top_p", self.top_p, 0.0, 1.0)
        _check_real("min_p", self.min_p, 0.0, 1.0)
        _check_real("repeat_penalty", self.repeat_penalty, 0.0, math.inf)
        if self.repeat_penalty == 0.0:
            raise ValueError("repeat_penalty must be greater than 0 (1 switches it off), got 0")
        _check_int("repeat_last_n", self.repeat_last_n, minimum=-1)
        _check_real("presence_penalty", self.presence_penalty, -2.0, 2.0)  # OpenAI's range
        _check_real("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalises(self) -> bool:
        """True when a repeat, presence or frequency penalty can change the logits."""
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0)


def _check_real(name: str, value: Any, low: float = -math.inf, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low:g} and {high:g}, got {value!r}")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}")


# -- the steps: each takes logits of any length and returns logits with dropped tokens set to -inf ------

def apply_penalties(logits: np.ndarray, recent_ids: Sequence[int], repeat_penalty: float = 1.0,
                    presence_penalty: float = 0.0, frequency_penalty: float = 0.0) -> np.ndarray:
    """Penalise tokens that appeared in ``recent_ids`` (llama.cpp's rules).

    Args:
        logits: (n_vocab,) scores.
        recent_ids: The token ids to penalise, usually the last ``repeat_last_n`` of the history.
        repeat_penalty: A seen token's positive logit is divided by it, a negative one multiplied.
        presence_penalty: Subtracted once from every seen token's logit (OpenAI).
        frequency_penalty: Subtracted once per occurrence (OpenAI).

    Returns:
        New penalised logits, or ``logits`` itself when there is nothing to do.
    """
    if len(recent_ids) == 0 or (repeat_penalty == 1.0 and presence_penalty == 0.0 and frequency_penalty == 0.0):
        return logits
    # a few dozen ids: counted (or only told apart) in Python faster than np.unique sorts them
    counted = collections.Counter(recent_ids) if frequency_penalty != 0.0 else dict.fromkeys(recent_ids)
    low, high = min(counted), max(counted)
    if low < 0 or high >= logits.shape[-1]:
        raise ValueError(f"token id {low if low < 0 else high} in the history is outside the vocabulary "
                         f"of {logits.shape[-1]}")
    ids = np.fromiter(counted.keys(), np.int64, len(counted))
    seen = logits[ids]
    if repeat_penalty != 1.0:
        seen = np.where(seen > 0, seen / repeat_penalty, seen * repeat_penalty)
    if frequency_penalty != 0.0 or presence_penalty != 0.0:  # in float64, then stored as float32
        counts = np.fromiter(counted.values(), np.int64, len(counted)) if frequency_penalty != 0.0 else 0
        seen = seen - (counts * frequency_penalty + np.float64(presence_penalty))
    out = logits.copy()
    out[ids] = seen
    return out


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep exactly the ``k`` highest logits (ties at the boundary broken arbitrarily); ``k <= 0`` keeps all."""
    keep = _top_k_ids(logits, k)
    if keep is None:
        return logits
    out = np.full_like(logits, -np.inf)
    out[keep] = logits[keep]
    return out


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the most likely tokens until their probability reaches ``p``, including the one that crosses it.

    Only candidates are sorted: the top 256, 1024, ... tokens (by partition) until they hold ``p`` of the mass,
    which gives the same set as sorting everything. At least one token is always kept.
    """
    if p >= 1.0:
        return logits
    weights = _exp_shifted(logits)  # unnormalised probabilities; -inf logits weigh 0
    total = weights.sum(dtype=np.float64)
    n_alive = int(np.count_nonzero(weights))
    m = 256
    while True:
        candidates = np.argpartition(-weights, m)[:m] if m < n_alive else np.flatnonzero(weights)
        if m >= n_alive or weights[candidates].sum(dtype=np.float64) >= p * total:
            break
        m *= 4
    order = candidates[np.argsort(-weights[candidates], kind="stable")]
    cumulative = np.cumsum(weights[order], dtype=np.float64) / total
    keep = order[:min(int(np.searchsorted(cumulative, p, side="left")) + 1, order.size)]
    out = np.full_like(logits, -np.inf)
    out[keep] = logits[keep]
    return out


def apply_min_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep tokens whose probability is at least ``p`` times the most likely token's; ``p <= 0`` keeps all."""
    if p <= 0.0:
        return logits
    threshold = np.max(logits) + math.log(p)  # p_i >= p * p_max  <=>  logit_i >= logit_max + log p
    return np.where(logits >= threshold, logits, -np.inf).astype(logits.dtype, copy=False)


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Divide the logits by ``temperature`` (> 0; use greedy decoding for 0)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive to scale logits, got {temperature!r}")
    return logits / np.asarray(temperature, dtype=logits.dtype)


def _exp_shifted(logits: np.ndarray) -> np.ndarray:
    """exp(logits - max) in float32 (float64 exp is ten times slower over a 262k vocabulary); sums use float64."""
    return np.exp(logits - np.max(logits), dtype=np.float32)


def _log_softmax_at(logits: np.ndarray, index: int, top: float) -> float:
    """log softmax(logits)[index], given ``top`` = max(logits).

    The sum over the vocabulary is the CPU extension's vector exp in one pass (NumPy's exp and sum took four
    times as long, per token of every greedy sequence); NumPy computes it where the extension is not built.
    """
    from .backends.vector_math import log_sum_exp  # imported here: sampling needs no backend otherwise

    return float(logits[index]) - top - log_sum_exp(np.ascontiguousarray(logits), top)


# -- the sampler -----------------------------------------------------------------------------------------

class Sampler:
    """Picks the next token in llama.cpp's default order: penalties -> top-k -> top-p -> min-p -> temperature -> draw.

    It owns its random generator (PCG64), so one sequence's draws never depend on another's; ``get_state`` /
    ``set_state`` let a snapshot continue the exact same draws. After top-k the later steps run on the ``k``
    candidates only, so a step costs O(n_vocab) plus O(k log k).
    """

    def __init__(self, params: SamplingParams):
        self.params = params
        seeds = np.random.SeedSequence(params.seed)  # None: entropy from the operating system
        self.seed: int = int(seeds.entropy)  # the seed actually used, to reproduce a run started without one
        self._rng = np.random.Generator(np.random.PCG64(seeds))

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> tuple[int, float]:
        """Choose a token.

        Args:
            logits: (n_vocab,) the model's scores for the next token.
            history: Every token id so far (prompt and generated); penalties read its tail.

        Returns:
            ``(token id, log-probability)``: under the final (filtered, tempered) distribution when sampling; for
            greedy decoding, the log-softmax of the model's unpenalised logits.

        Raises:
            NonFiniteLogitsError: ``logits`` hold NaN or +inf, or nothing finite is left to choose from.
        """
        logits = np.asarray(logits, dtype=np.float32)
        if logits.ndim != 1 or logits.size == 0:
            raise ValueError(f"logits must be a non-empty 1-D array, got shape {logits.shape}")
        top = float(np.max(logits))
        _check_finite(top)  # NaN propagates through max; +inf or all -inf is as broken
        if self.params.greedy:
            token = greedy_token(logits, history, self.params)
            return token, _log_softmax_at(logits, token, top)
        candidates, scores = filtered_scores(penalised_logits(logits, history, self.params), self.params)
        index, logprob = self._draw(scores)
        return (int(candidates[index]) if candidates is not None else index), logprob

    def _draw(self, logits: np.ndarray) -> tuple[int, float]:
        _check_finite(np.max(logits))
        weights = _exp_shifted(logits)
        index, total = _inverse_cdf(weights, self._rng.random())
        return index, math.log(float(weights[index])) - math.log(total)

    def get_state(self) -> dict:
        """The random generator's state, JSON-serialisable; ``set_state`` with it resumes the same draws."""
        return {"version": _STATE_VERSION, "bit_generator": self._rng.bit_generator.state}

    def set_state(self, state: dict) -> None:
        """Restore a state from ``get_state``.

        Raises:
            ValueError: ``state`` is not a state this sampler wrote.
        """
        inner = state.get("bit_generator") if isinstance(state, dict) else None
        if not isinstance(inner, dict) or state.get("version") != _STATE_VERSION \
                or inner.get("bit_generator") != _BIT_GENERATOR:
            raise ValueError(f"sampler state is not a version-{_STATE_VERSION} {_BIT_GENERATOR} state")
        try:
            self._rng.bit_generator.state = inner
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"sampler state is not valid: {e}") from None


def penalised_logits(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """The first step of sampling: ``params``' penalties on the tail of ``history`` (float32 logits in)."""
    return apply_penalties(logits, recent_tokens(history, params.repeat_last_n), params.repeat_penalty,
                           params.presence_penalty, params.frequency_penalty)


def greedy_token(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> int:
    """Greedy decoding's choice: the highest penalised logit, the lowest id among ties (float32 logits in).

    Raises:
        NonFiniteLogitsError: the chosen logit is NaN or infinite.
    """
    penalised = penalised_logits(logits, history, params)
    token = int(np.argmax(penalised))
    _check_finite(penalised[token])
    return token


def filtered_scores(penalised: np.ndarray, params: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """The rest of sampling before the draw: top-k, top-p, min-p, temperature.

    Returns:
        The ids top-k kept (None: every id) and their final scores, -inf where a filter removed one.
    """
    candidates = _top_k_ids(penalised, params.top_k)
    scores = penalised[candidates] if candidates is not None else penalised
    return candidates, apply_temperature(apply_min_p(apply_top_p(scores, params.top_p), params.min_p),
                                         params.temperature)


def make_sampler(params: SamplingParams) -> Sampler:
    """A sampler for ``params`` with its own random generator (seeded from ``params.seed``)."""
    return Sampler(params)


def _inverse_cdf(weights: np.ndarray, u: float, block: int = 512) -> tuple[int, float]:
    """The index where ``u`` (uniform in [0, 1)) falls in the cumulative weights, and the total weight.

    A running sum is sequential and slow over a 262k vocabulary, so it runs over block sums first and then
    inside the one block that holds the point.
    """
    starts = np.arange(0, weights.size, block)
    block_cdf = np.cumsum(np.add.reduceat(weights, starts, dtype=np.float64))
    total = float(block_cdf[-1])
    point = min(u * total, np.nextafter(total, 0.0))  # u * total can round up to total itself
    b = int(np.searchsorted(block_cdf, point, side="right"))
    inside = np.cumsum(weights[starts[b]:starts[b] + block], dtype=np.float64)
    i = int(np.searchsorted(inside, point - (block_cdf[b - 1] if b else 0.0), side="right"))
    if i >= inside.size:  # rounding put the point at the block's end: take its last token that can be drawn
        i = int(np.flatnonzero(weights[starts[b]:starts[b] + block])[-1])
    return int(starts[b]) + i, total


def recent_tokens(history: Sequence[int], n: int) -> Sequence[int]:
    """The last ``n`` tokens of ``history``; all of it for -1, none for 0."""
    if n < 0:
        return history
    return history[max(len(history) - n, 0):] if n else ()


def _top_k_ids(logits: np.ndarray, k: int) -> np.ndarray | None:
    """Ids of the ``k`` highest logits, or None when top-k keeps everything."""
    n = logits.shape[-1]
    if k <= 0 or k >= n:
        return None
    return np.argpartition(logits, n - k)[n - k:]  # O(n_vocab), no full sort


def _check_finite(value: float) -> None:
    if not math.isfinite(value):
        raise NonFiniteLogitsError(
            "the model computed NaN or infinite scores for the next token, so no token can be sampled; the model "
            "file may be damaged, or its numbers overflow in this backend")
