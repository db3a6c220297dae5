"""The speculative sampling rule as small pure functions: the target's filtered distribution, accept, residual, draw.

A drafted token ``x`` drawn from the draft distribution ``q`` is kept with probability ``min(1, p(x) / q(x))``
under the target distribution ``p``; on rejection one token is drawn from ``norm(max(0, p - q))``. Every emitted
token is then distributed exactly as ``p`` (Leviathan et al. 2023, Chen et al. 2023). A proposal without a
distribution (prompt lookup) is a point mass: ``q`` is one-hot at the proposed token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..sampling import SamplingParams, filtered_scores, penalised_logits


def sampling_distribution(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """The probabilities plain sampling draws the next token from, as float64 of shape (n_vocab,).

    The steps are the Sampler's own (``penalised_logits``, ``filtered_scores``), with the same float32 weights;
    only the final normalisation is done here in float64.

    Raises:
        ValueError: ``params`` is greedy (there is no distribution to speak of), or the logits are not finite.
    """
    if params.greedy:
        raise ValueError("greedy decoding has no sampling distribution; compare argmax tokens instead")
    candidates, scores = filtered_scores(penalised_logits(np.asarray(logits, dtype=np.float32), history, params), params)
    top = np.max(scores)
    if not math.isfinite(float(top)):
        raise ValueError("no token can be sampled: the logits are all -inf or contain NaN or +inf")
    weights = np.exp(scores - top, dtype=np.float32).astype(np.float64)
    if candidates is None:
        return weights / weights.sum()
    probs = np.zeros(np.shape(logits)[-1], np.float64)
    probs[candidates] = weights / weights.sum()
    return probs


def point_mass(token: int, n_vocab: int) -> np.ndarray:
    """The distribution of a deterministic proposal: all probability on ``token``."""
    q = np.zeros(n_vocab, dtype=np.float64)
    q[token] = 1.0
    return q


def acceptance_probability(p: np.ndarray, q: np.ndarray, token: int) -> float:
    """``min(1, p(token) / q(token))``: how likely a drafted ``token`` drawn from ``q`` is kept under ``p``.

    Raises:
        ValueError: ``q(token)`` is 0, so ``token`` cannot have been drawn from ``q``.
    """
    if not q[token] > 0:
        raise ValueError(f"token {token} has probability 0 under the draft distribution it was drawn from")
    return min(1.0, float(p[token]) / float(q[token]))


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``norm(max(0, p - q))``: what to draw from after a rejection.

    When ``p <= q`` everywhere (only possible as a rounding artefact, since then no rejection can happen) the
    target distribution itself is returned.
    """
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    return residual / total if total > 0 else p


def draw(probs: np.ndarray, u: float) -> int:
    """The token where ``u`` (uniform in [0, 1)) falls in the cumulative distribution; never a zero-probability one."""
    cdf = np.cumsum(probs)
    index = int(np.searchsorted(cdf, u * cdf[-1], side="right"))  # the first i with cdf[i] > point: p[i] > 0
    if index >= probs.size:  # u * total rounded up to the total itself
        index = int(np.flatnonzero(probs)[-1])
    return index


def verify_drafted(p: np.ndarray, q: np.ndarray, token: int, rng: np.random.Generator) -> tuple[bool, int]:
    """Apply the rule to one drafted ``token``.

    Returns:
        ``(True, token)`` when it is kept, else ``(False, replacement)`` with the replacement drawn from the residual.
    """
    if rng.random() < acceptance_probability(p, q, token):
        return True, token
    return False, draw(residual_distribution(p, q), rng.random())
