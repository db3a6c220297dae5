"""The parity criteria every synthetic-model test holds against llama.cpp's logits (issue 19's): the top-10 logits
within max(1.0, 5 % of the logits' standard deviation) at every position, and the same argmax wherever llama.cpp's
top-2 gap is at least 0.5."""

from __future__ import annotations

import numpy as np

MIN_STD = 2.0  # flatter logits would pass any comparison
CLEAR_GAP = 0.5


def assert_matches_llama_cpp(ours: np.ndarray, ref: np.ndarray, *, first_position: int = 0, context: str = "",
                             record_property=None) -> None:
    """Assert the criteria for ``ours`` against ``ref`` (positions × vocabulary); ``first_position`` is the
    position of row 0 (for messages), ``context`` is added to them, ``record_property`` (pytest's) gets the
    numbers."""
    assert ours.shape == ref.shape, f"{ours.shape} logits against llama.cpp's {ref.shape}"
    std = float(ref.std(axis=1).mean())
    assert std >= MIN_STD, f"the synthetic model's logits are too flat to test (std {std:.2f})"
    tolerance = max(1.0, 0.05 * std)
    top10 = np.argsort(ref, axis=1)[:, -10:]
    error = np.abs(np.take_along_axis(ours, top10, 1) - np.take_along_axis(ref, top10, 1)).max(axis=1)
    worst = int(error.argmax())
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) >= CLEAR_GAP
    mismatched = np.flatnonzero(clear & (ours.argmax(axis=1) != ref.argmax(axis=1)))
    if record_property is not None:
        record_property("numbers", f"std {std:.2f} top10_err {error[worst]:.3f} tol {tolerance:.2f} "
                                   f"clear {int(clear.sum())} argmax_mismatch {mismatched.size}")
    suffix = f" ({context})" if context else ""
    assert error[worst] <= tolerance, (f"position {first_position + worst}: top-10 logits differ by "
                                       f"{error[worst]:.3f} (tolerance {tolerance:.2f}){suffix}")
    assert mismatched.size == 0, f"argmax differs at positions {(mismatched + first_position).tolist()}{suffix}"
