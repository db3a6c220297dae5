"""Token sampling: penalties, top-k, top-p, min-p and temperature as small pure functions, composed by make_sampler."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from .backends.vector_math import NonFiniteLogitsError  # noqa: F401  (raised here too; callers import it from here)
from .backends.vector_math import (exp_shifted, log_sum_exp, nucleus_mask, penalty_changes,
                                   sample_top_k, sample_vocabulary, top_k_sorted)

_BIT_GENERATOR = "PCG64"
_STATE_VERSION = 1


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
    changed = penalty_changes(logits, recent_ids, repeat_penalty, presence_penalty, frequency_penalty)
    if changed is None:
        return logits
    out = logits.copy()
    out[changed[0]] = changed[1]
    return out


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep exactly the ``k`` highest logits (ties at the boundary keep the lowest ids); ``k <= 0`` keeps all."""
    keep = _top_k_ids(logits, k)
    if keep is None:
        return logits
    out = np.full_like(logits, -np.inf)
    out[keep] = logits[keep]
    return out


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the most likely tokens until their probability reaches ``p``, including the one that crosses it.

    Among tokens of equal probability the lower ids come first, so ties at the boundary keep the lowest ids.
    Only candidates are sorted (``vector_math.nucleus_mask``), and logits already sorted best first (top-k's)
    are not sorted again. At least one token is always kept.
    """
    if p >= 1.0:
        return logits
    return np.where(nucleus_mask(exp_shifted(logits), p), logits, np.float32(-np.inf)).astype(logits.dtype,
                                                                                               copy=False)


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


def _log_softmax_at(logits: np.ndarray, index: int, top: float) -> float:
    """log softmax(logits)[index], given ``top`` = max(logits).

    The sum over the vocabulary is the CPU extension's vector exp in one pass (NumPy's exp and sum took four
    times as long, per token of every greedy sequence); NumPy computes it where the extension is not built.
    """
    return float(logits[index]) - top - log_sum_exp(np.ascontiguousarray(logits), top)


# -- the sampler -----------------------------------------------------------------------------------------

class Sampler:
    """Picks the next token in llama.cpp's default order: penalties -> top-k -> top-p -> min-p -> temperature -> draw.

    It owns its random generator (PCG64), so one sequence's draws never depend on another's; ``get_state`` /
    ``set_state`` let a snapshot continue the exact same draws. With top-k on, a step is one call
    (``vector_math.sample_top_k``: in the CPU extension, NumPy where it is not built): the penalties beside the
    model's logits, top-k in one pass over the vocabulary, then top-p, min-p, temperature and the draw on the
    ``k`` candidates only, so a step costs O(n_vocab) plus O(k log k). With top-k off the later steps and the draw
    run over the whole vocabulary in ``vector_math.sample_vocabulary`` (a few passes in the extension, no sort).
    In both cases the penalised logits go beside the model's, not in a copy made here. The small steps below
    (``apply_top_p`` ...) are the same arithmetic one at a time, for speculative decoding's acceptance test and
    for tests.
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
        p = self.params
        if p.greedy and not p.penalises:  # one pass: argmax finds NaN (first) and the max
            token = int(np.argmax(logits))
            _check_finite(float(logits[token]))
            return token, _log_softmax_at(logits, token, float(logits[token]))
        if not p.greedy:
            if not 0 < p.top_k < logits.size:
                return self._sample_vocabulary(logits, history)
            return sample_top_k(np.ascontiguousarray(logits), p.top_k, self._rng.random(), p.top_p, p.min_p,
                                p.temperature, recent_tokens(history, p.repeat_last_n), p.repeat_penalty,
                                p.presence_penalty, p.frequency_penalty)
        top = float(np.max(logits))
        _check_finite(top)  # NaN propagates through max; +inf or all -inf is as broken
        token = greedy_token(logits, history, p)
        return token, _log_softmax_at(logits, token, top)

    def _sample_vocabulary(self, logits: np.ndarray, history: Sequence[int]) -> tuple[int, float]:
        """Top-k off: penalties beside the logits, then top-p, min-p, temperature and the draw on every id.
        The one uniform is drawn before the logits are checked, so a NonFiniteLogitsError has used it."""
        p = self.params
        changed = penalty_changes(logits, recent_tokens(history, p.repeat_last_n), p.repeat_penalty,
                                  p.presence_penalty, p.frequency_penalty) or (None, None)
        return sample_vocabulary(np.ascontiguousarray(logits), self._rng.random(), p.top_p, p.min_p, p.temperature,
                                 *changed)

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
        The ids top-k kept, best first (None: every id), and their final scores, -inf where a filter removed one.
    """
    candidates = _top_k_ids(penalised, params.top_k)
    scores = penalised[candidates] if candidates is not None else penalised
    return candidates, final_scores(scores, params)


def final_scores(scores: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Top-p, min-p and temperature on the scores top-k left: the draw's logits, -inf where a filter removed one."""
    return apply_temperature(apply_min_p(apply_top_p(scores, params.top_p), params.min_p), params.temperature)


def make_sampler(params: SamplingParams) -> Sampler:
    """A sampler for ``params`` with its own random generator (seeded from ``params.seed``)."""
    return Sampler(params)


def recent_tokens(history: Sequence[int], n: int) -> Sequence[int]:
    """The last ``n`` tokens of ``history``; all of it for -1, none for 0."""
    if n < 0:
        return history
    return history[max(len(history) - n, 0):] if n else ()


def _top_k_ids(logits: np.ndarray, k: int) -> np.ndarray | None:
    """Ids of the ``k`` highest logits, best first (ties: lowest id first), or None when top-k keeps everything."""
    n = logits.shape[-1]
    if k <= 0 or k >= n:
        return None
    return top_k_sorted(np.ascontiguousarray(logits, dtype=np.float32), k)[0]  # O(n_vocab), no full sort


def _check_finite(value: float) -> None:
    if not math.isfinite(value):
        raise NonFiniteLogitsError()
