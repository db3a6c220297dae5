"""Host-side vector arithmetic that code above the backends needs: the sampler's penalties, log-sum-exp, top-k and
draw over a vocabulary.

Each function runs in the CPU backend's C extension when that is built and in NumPy otherwise, with the same
results: whether the extension is there is decided once, where ``backends.cpu.kernels`` loads it, and every
function here asks ``_extension()`` and falls back to its ``_numpy`` twin. Callers such as ``engine/sampling.py``
come through here instead of importing one backend's kernel module themselves; ``native`` finds the extension.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import numpy as np

from . import native

_NO_IDS = np.empty(0, np.int64)  # (0,)
_NO_VALUES = np.empty(0, np.float32)  # (0,)
TINY_WEIGHT = np.float32(2.0 ** -125)  # a weight below this (e^-86.6 of the best token's) counts as 0
DRAW_BLOCK = 512  # the draw's ids per block: block sums first, then a running sum inside one block


class NonFiniteLogitsError(ValueError):
    """The model's scores for the next token hold NaN or +inf (or are all -inf): no token can be chosen.

    Only the model's own arithmetic produces such scores (damaged weights, or numbers that overflow in a
    backend), so the message says so; the same input will fail the same way again.
    """

    def __init__(self, message: str = ("the model computed NaN or infinite scores for the next token, so no token "
                                       "can be sampled; the model file may be damaged, or its numbers overflow in "
                                       "this backend")):
        super().__init__(message)


def _extension():
    """The CPU backend's C extension, or None where it is not built or switched off (loaded on first use)."""
    return native.extension()


def log_sum_exp(x: np.ndarray, shift: float) -> float:
    """``log(sum(exp(x - shift)))`` of a contiguous 1-D float32 array: a log-softmax's denominator.

    The extension computes it in one pass with its vector exp (about 2 ulp; float sums of 1024 terms, added in
    double; relative error under 1e-5) and no temporary the size of ``x``; NumPy's version makes two.

    Args:
        x: the logits, float32, contiguous, 1-D.
        shift: subtracted before the exp; the maximum keeps every term at most 1.

    Returns:
        The log of the sum, as a Python float.
    """
    ext = _extension()
    if ext is not None:
        return ext.log_sum_exp(x, shift)
    return _log_sum_exp_numpy(x, shift)


def _log_sum_exp_numpy(x: np.ndarray, shift: float) -> float:
    if x.dtype != np.float32 or x.ndim != 1:
        raise ValueError("x must be a contiguous 1-D float32 array")
    return math.log(float(np.exp(x - np.float32(shift)).sum(dtype=np.float64)))


def top_k_sorted(logits: np.ndarray, k: int, ids: np.ndarray | None = None,
                 values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` highest logits, best first: a higher logit first, and among equal logits the lower id.

    Ties at the boundary therefore keep the lowest ids, so the set and its order are defined, and the C
    extension (one pass over the vocabulary) and the NumPy fallback return the same arrays.

    Args:
        logits: (n_vocab,) float32, contiguous, without NaN (-inf is allowed).
        k: how many to keep, 1 <= k <= n_vocab.
        ids: distinct token ids whose logits ``values`` replace (the penalised ones), so the caller need not
            copy the whole vocabulary to change a few; None for none.
        values: float32, one per id.

    Returns:
        ``(ids, scores)``: int64 (k,) token ids and their float32 (k,) logits.

    Raises:
        ValueError: ``k`` out of range, bad arrays, or repeated or out-of-range replaced ids.
    """
    ids, values = _overrides(ids, values)
    ext = _extension()
    if ext is not None:
        return ext.top_k_sorted(logits, int(k), ids, values)
    return _top_k_sorted_numpy(logits, int(k), ids, values)


def _top_k_sorted_numpy(logits: np.ndarray, k: int, ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``top_k_sorted`` in NumPy: a partition finds the k-th highest logit, the ties at it keep their lowest ids."""
    x = _replaced(logits, ids, values)
    n = x.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    kth = x[np.argpartition(x, n - k)[n - k]]
    above = np.flatnonzero(x > kth)
    keep = np.concatenate([above, np.flatnonzero(x == kth)[:k - above.size]])
    keep = keep[np.lexsort((keep, -x[keep]))]
    return keep.astype(np.int64), x[keep]


def sample_vocabulary(logits: np.ndarray, u: float, top_p: float = 1.0, min_p: float = 0.0,
                      temperature: float = 1.0, ids: np.ndarray | None = None,
                      values: np.ndarray | None = None) -> tuple[int, float]:
    """Draw a token from the whole vocabulary: top-p, then min-p, then temperature, then the inverse CDF at ``u``.

    The same steps as ``engine.sampling``'s ``apply_top_p``, ``apply_min_p``, ``apply_temperature`` and the
    draw on every id, without a sort or a copy of the vocabulary per step: the extension finds the nucleus by a
    radix select on the weights' bits and draws in a few passes; NumPy runs the steps themselves. Both give the
    same token for the same ``u`` except where a running sum lands within rounding (about 1e-10 relative) of a
    boundary: their vector exps differ in the last bit.

    Args:
        logits: (n_vocab,) float32, contiguous.
        u: uniform in [0, 1): where the draw falls in the cumulative weights.
        top_p: keep the most likely tokens (ties: lowest ids first) until their probability reaches it,
            the one that crosses it included; 1 keeps all.
        min_p: keep tokens at least this times as likely as the most likely one left; 0 keeps all.
        temperature: the kept logits are divided by it (> 0).
        ids: distinct token ids whose logits ``values`` replace (the penalised ones); None for none.
        values: float32, one per id.

    Returns:
        ``(token id, log-probability under the final distribution)``.

    Raises:
        NonFiniteLogitsError: NaN or +inf among the logits, all of them -inf, or the temperature overflowed them.
        ValueError: bad arrays, parameters out of range, or repeated or out-of-range replaced ids.
    """
    ids, values = _overrides(ids, values)
    ext = _extension()
    if ext is not None:
        token, logprob = ext.sample_vocabulary(logits, ids, values, float(top_p), float(min_p), float(temperature),
                                               float(u))
    else:
        token, logprob = _sample_vocabulary_numpy(logits, ids, values, float(top_p), float(min_p),
                                                  float(temperature), float(u))
    if token < 0:
        raise NonFiniteLogitsError()
    return token, logprob


def _sample_vocabulary_numpy(logits: np.ndarray, ids: np.ndarray, values: np.ndarray, top_p: float, min_p: float,
                             temperature: float, u: float) -> tuple[int, float]:
    """``sample_vocabulary`` in NumPy, the steps one after another; id -1 where the extension returns it."""
    if not (0.0 <= top_p <= 1.0 and 0.0 <= min_p <= 1.0 and 0.0 < temperature < math.inf and 0.0 <= u < 1.0):
        raise ValueError("need 0 <= top_p, min_p <= 1, a finite temperature > 0, 0 <= u < 1")
    z = _replaced(logits, ids, values)
    top = np.max(z)
    if not math.isfinite(top):
        return -1, math.nan
    if top_p < 1.0:
        z = np.where(nucleus_mask(exp_shifted(z), top_p), z, np.float32(-np.inf))
        top = np.max(z)
    if min_p > 0.0:
        z = np.where(z >= top + math.log(min_p), z, np.float32(-np.inf))
    with np.errstate(over="ignore"):  # a temperature near 0 overflows: refused just below, as in the extension
        z = z / np.asarray(temperature, dtype=np.float32)
    if not math.isfinite(np.max(z)):
        return -1, math.nan
    weights = exp_shifted(z)
    index, total = inverse_cdf(weights, u)
    return index, math.log(float(weights[index])) - math.log(total)


def sample_top_k(logits: np.ndarray, k: int, u: float, top_p: float = 1.0, min_p: float = 0.0,
                 temperature: float = 1.0, recent_ids: Sequence[int] = (), repeat_penalty: float = 1.0,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0) -> tuple[int, float]:
    """A whole sampler step with top-k on: the penalties on ``recent_ids`` (``penalty_changes``), the ``k`` best
    logits (``top_k_sorted``), then ``sample_vocabulary``'s top-p, min-p, temperature and draw on those ``k``,
    best first.

    The extension does it in one call: after a decode step streamed the weights through the caches, each of the
    dozen NumPy steps it replaces started cold (about 0.4 ms a token over a 152k vocabulary, 3-4 % of a 0.5B
    model's step). NumPy runs the same steps; both give the same token for the same ``u`` except where a running
    sum lands within rounding of a boundary (their vector exps differ in the last bit).

    Args:
        logits: (n_vocab,) float32, contiguous.
        k: how many candidates top-k keeps, 1 <= k <= n_vocab.
        u: uniform in [0, 1): where the draw falls in the candidates' cumulative weights.
        top_p, min_p, temperature: as ``sample_vocabulary``'s.
        recent_ids: the history's tail the penalties read (repeats count for the frequency penalty).
        repeat_penalty, presence_penalty, frequency_penalty: as ``penalty_changes``'.

    Returns:
        ``(token id, log-probability under the final distribution)``.

    Raises:
        NonFiniteLogitsError: NaN or +inf among the logits, or nothing finite left to draw from.
        ValueError: ``k`` or a parameter out of range, or a penalised id outside the vocabulary.
    """
    ext = _extension()
    if ext is not None:
        token, logprob = ext.sample_top_k(logits, int(k), recent_ids, float(repeat_penalty), float(presence_penalty),
                                          float(frequency_penalty), float(top_p), float(min_p), float(temperature),
                                          float(u))
    else:
        token, logprob = _sample_top_k_numpy(logits, int(k), u, top_p, min_p, temperature, recent_ids, repeat_penalty,
                                             presence_penalty, frequency_penalty)
    if token < 0:
        raise NonFiniteLogitsError()
    return token, logprob


def _sample_top_k_numpy(logits: np.ndarray, k: int, u: float, top_p: float, min_p: float, temperature: float,
                        recent_ids: Sequence[int], repeat_penalty: float, presence_penalty: float,
                        frequency_penalty: float) -> tuple[int, float]:
    """``sample_top_k`` in NumPy, the steps one after another; id -1 where the extension returns it."""
    if not (repeat_penalty > 0.0 and math.isfinite(repeat_penalty) and math.isfinite(presence_penalty)
            and math.isfinite(frequency_penalty)):
        raise ValueError("need a finite repeat penalty > 0 and finite presence and frequency penalties")
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be in [1, {logits.shape[-1]}], got {k}")
    if not math.isfinite(np.max(logits)):
        return -1, math.nan
    changed = penalty_changes(logits, recent_ids, repeat_penalty, presence_penalty, frequency_penalty)
    candidates, scores = _top_k_sorted_numpy(logits, k, *_overrides(*(changed or (None, None))))
    index, logprob = _sample_vocabulary_numpy(scores, _NO_IDS, _NO_VALUES, float(top_p), float(min_p),
                                              float(temperature), float(u))
    return (int(candidates[index]) if index >= 0 else -1), logprob


def penalty_changes(logits: np.ndarray, recent_ids: Sequence[int], repeat_penalty: float = 1.0,
                    presence_penalty: float = 0.0, frequency_penalty: float = 0.0
                    ) -> tuple[np.ndarray, np.ndarray] | None:
    """What llama.cpp's penalties change, without copying the vocabulary: the distinct penalised ids (int64) and
    their new logits (as ``logits``' dtype), or None when there is nothing to do.

    A seen token's positive logit is divided by ``repeat_penalty`` and a negative one multiplied (in the logits'
    dtype); then ``presence_penalty`` is subtracted once and ``frequency_penalty`` once per occurrence in
    ``recent_ids`` (in float64, stored back in the logits' dtype).

    Raises:
        ValueError: an id in ``recent_ids`` outside the vocabulary.
    """
    if len(recent_ids) == 0 or (repeat_penalty == 1.0 and presence_penalty == 0.0 and frequency_penalty == 0.0):
        return None
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
    return ids, seen.astype(logits.dtype, copy=False)


def exp_shifted(logits: np.ndarray) -> np.ndarray:
    """exp(logits - max) in float32, weights below ``TINY_WEIGHT`` set to 0 (as the extension's vector exp,
    which floors at 2^-126, has them); float64 exp is ten times slower over a 262k vocabulary, sums use float64."""
    weights = np.exp(logits - np.max(logits), dtype=np.float32)
    weights[weights < TINY_WEIGHT] = 0.0
    return weights


def nucleus_mask(weights: np.ndarray, p: float) -> np.ndarray:
    """Which tokens top-p keeps: the heaviest ``weights`` (ties: lowest ids first) until their share of the total
    reaches ``p``, the one that crosses it included; at least one, never a weight of 0.

    Only candidates are sorted: the top 256, 1024, ... weights (by partition) until they hold ``p`` of the mass,
    which gives the same set as sorting everything; weights already sorted best first (top-k's) are not sorted
    again.
    """
    total = weights.sum(dtype=np.float64)
    n_alive = int(np.count_nonzero(weights))
    if weights.size <= 4096 and bool(np.all(weights[:-1] >= weights[1:])):  # best first already
        order = np.flatnonzero(weights)  # ties in id order, as the sort below puts them
    else:
        m = 256
        while True:
            candidates = np.argpartition(-weights, m)[:m] if m < n_alive else np.flatnonzero(weights)
            if m >= n_alive or weights[candidates].sum(dtype=np.float64) >= p * total:
                break
            m *= 4
        order = candidates[np.lexsort((candidates, -weights[candidates]))]
    cumulative = np.cumsum(weights[order], dtype=np.float64) / total
    n_keep = min(int(np.searchsorted(cumulative, p, side="left")) + 1, order.size)
    # the partition may have left out ties of the last kept weight with lower ids: take the lowest among all
    last = weights[order[n_keep - 1]]
    keep = weights > last
    keep[np.flatnonzero(weights == last)[:n_keep - int(np.count_nonzero(keep))]] = True
    return keep


def inverse_cdf(weights: np.ndarray, u: float, block: int = DRAW_BLOCK) -> tuple[int, float]:
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


def _overrides(ids: np.ndarray | None, values: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    ids = _NO_IDS if ids is None else np.ascontiguousarray(ids, dtype=np.int64)
    values = _NO_VALUES if values is None else np.ascontiguousarray(values, dtype=np.float32)
    return ids, values


def _replaced(logits: np.ndarray, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``logits`` with ``ids`` set to ``values`` (a copy when there are any), checked as the extension checks."""
    if logits.dtype != np.float32 or logits.ndim != 1:
        raise ValueError("logits must be a contiguous 1-D float32 array")
    n = logits.shape[0]
    if ids.shape != values.shape:
        raise ValueError("ids and values differ in length")
    if not ids.size:
        return logits
    if ids.min() < 0 or ids.max() >= n or np.unique(ids).size != ids.size:
        raise ValueError(f"replaced ids must be distinct and in [0, {n})")
    x = logits.copy()
    x[ids] = values
    return x
