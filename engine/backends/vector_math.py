"""Host-side vector arithmetic that code above the backends needs (the sampler's log-sum-exp over a vocabulary).

It runs in the CPU backend's C extension when that is built and in NumPy otherwise; callers such as
``engine/sampling.py`` come through here instead of importing one backend's kernel module themselves.
"""

from __future__ import annotations

import numpy as np


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
