"""Resting between scheduler steps as the thermal policy asks, in short slices so Stop still acts at once.

The scheduler applies the rest of the policy itself (prefill chunk, sequences in flight, draft length, the drift
detector's decode timings) to every sequence, a lone reply included; the loop that steps it rests with ``rest``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

PAUSE_SLICE_S = 0.05  # a pause is slept in slices this long, checking for Stop between them


def rest(pause_s: float, stopped: Callable[[], bool] = lambda: False,
         sleep: Callable[[float], None] = time.sleep) -> float:
    """Sleep ``pause_s`` seconds in slices of at most PAUSE_SLICE_S until ``stopped()``; returns the seconds rested."""
    rested = 0.0
    while rested < pause_s and not stopped():
        nap = min(PAUSE_SLICE_S, pause_s - rested)
        sleep(nap)
        rested += nap
    return rested
