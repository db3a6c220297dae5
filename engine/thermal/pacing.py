"""StreamPacer: the thermal limits applied to one stream generated outside the Scheduler.

A lone chat reply in the app runs through ``Model.chat`` (replies that overlap run under the Scheduler, which
applies the limits itself); the pacer gives that reply the prefill chunk the policy allows, feeds every decode step's time to the drift detector, caps a speculator's draft length, and rests
between tokens when the policy asks for a pause (at "critical"), in short slices so Stop still acts at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from .monitor import ThermalMonitor
from .policy import Limits, Mode

PAUSE_SLICE_S = 0.05  # a pause is slept in slices this long, checking for Stop between them


class StreamPacer:
    """Limits for one stream at a time, from a ThermalMonitor the caller owns. Not thread-safe: use it on the thread
    that generates."""

    def __init__(self, monitor: ThermalMonitor, sleep: Callable[[float], None] = time.sleep):
        self.monitor, self.sleep = monitor, sleep
        self._draft_cap = 0
        self._speculator = None

    @property
    def limits(self) -> Limits:
        return self.monitor.policy.limits

    def begin(self, mode: Mode | None = None, speculator=None, preferred_chunk: int | None = None) -> int:
        """Start a stream: switch to ``mode`` if it changed, cap ``speculator``'s draft length; returns the prefill
        chunk to use (the policy's, and at most ``preferred_chunk``)."""
        if mode is not None and mode != self.monitor.policy.mode:
            self.monitor.set_mode(mode)
        limits = self.monitor.limits()
        self._speculator = speculator
        self._draft_cap = speculator.max_draft if speculator is not None else 0
        self._cap_drafts(limits)
        return min(limits.prefill_chunk, preferred_chunk or limits.prefill_chunk)

    def step(self, seconds: float | None, load: Hashable, stopped: Callable[[], bool] = lambda: False) -> float:
        """A decode step took ``seconds`` under drift-detector ``load`` (None: not a plain step, do not time it);
        rest as the policy says, until ``stopped()``. Returns the seconds rested."""
        if seconds is not None:
            self.monitor.observe_decode(seconds, load)
        limits = self.monitor.limits()
        self._cap_drafts(limits)
        rested = 0.0
        while rested < limits.pause_s and not stopped():
            nap = min(PAUSE_SLICE_S, limits.pause_s - rested)
            self.sleep(nap)
            rested += nap
        return rested

    def _cap_drafts(self, limits: Limits) -> None:
        if self._speculator is not None:
            self._speculator.max_draft = min(self._draft_cap, limits.max_draft)
