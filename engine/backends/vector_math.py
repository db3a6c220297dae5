"""Host-side vector arithmetic that code above the backends needs (the sampler's log-sum-exp and top-k over a
vocabulary).

It runs in the CPU backend's C extension when that is built and in NumPy otherwise, with the same results;
callers such as ``engine/sampling.py`` come through here instead of importing one backend's kernel module
themselves.
"""

from __future__ import annotations

import numpy as np

_NO_IDS = np.empty(0, np.int64)  # (0,)
_NO_VALUES = np.empty(0, np.float32)  # (0,)


def _extension():
    """The CPU backend's C extension, or None where it is not built (loaded on first use)."""
    from .cpu import kernels

    return kernels._ext


def log_sum_exp(x: np.ndarray, shift: float) -> float:
    """``log(sum(exp(x - shift)))`` of a contiguous 1-D float32 array: a log-softmax's denominator.

    Args:
        x: the logits, float32, contiguous, 1-D.
        shift: subtracted before the exp; the maximum keeps every term at most 1.

    Returns:
        The log of the sum, as a Python float.
    """
    from .cpu import kernels  # loaded on first use: the extension, or NumPy where it is not built

    return kernels.log_sum_exp(x, shift)


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
    ids = _NO_IDS if ids is None else np.ascontiguousarray(ids, dtype=np.int64)
    values = _NO_VALUES if values is None else np.ascontiguousarray(values, dtype=np.float32)
    ext = _extension()
    if ext is not None:
        return ext.top_k_sorted(logits, int(k), ids, values)
    return _top_k_sorted_numpy(logits, int(k), ids, values)


def _top_k_sorted_numpy(logits: np.ndarray, k: int, ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``top_k_sorted`` in NumPy: a partition finds the k-th highest logit, the ties at it keep their lowest ids."""
    if logits.dtype != np.float32 or logits.ndim != 1:
        raise ValueError("logits must be a contiguous 1-D float32 array")
    n = logits.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    if ids.shape != values.shape:
        raise ValueError("ids and values differ in length")
    x = logits
    if ids.size:
        if ids.min() < 0 or ids.max() >= n or np.unique(ids).size != ids.size:
            raise ValueError(f"replaced ids must be distinct and in [0, {n})")
        x = logits.copy()
        x[ids] = values
    kth = x[np.argpartition(x, n - k)[n - k]]
    above = np.flatnonzero(x > kth)
    keep = np.concatenate([above, np.flatnonzero(x == kth)[:k - above.size]])
    keep = keep[np.lexsort((keep, -x[keep]))]
    return keep.astype(np.int64), x[keep]
