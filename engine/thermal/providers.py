"""Thermal providers: one per platform behind one interface, plus a scripted one for tests and benches.

Every provider's ``read()`` returns a ThermalState and never raises: a sensor that cannot be read is
"unknown", and the throughput-drift detector (drift.py) covers machines that report nothing.
"""

from __future__ import annotations

import abc
import bisect
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .state import ThermalState


class ThermalProvider(abc.ABC):
    """Reads the machine's thermal state."""

    name: str = "provider"
    reason: str | None = None  # why the provider can only say "unknown", when that is so

    @abc.abstractmethod
    def read(self) -> ThermalState:
        """The current thermal state; UNKNOWN when it cannot be told (never raises)."""


class UnknownProvider(ThermalProvider):
    """A provider for platforms with no usable thermal signal."""

    name = "unknown"

    def __init__(self, reason: str):
        self.reason = reason

    def read(self) -> ThermalState:
        return ThermalState.UNKNOWN


class ScriptedProvider(ThermalProvider):
    """Replays a trace of ``(t_seconds, state)`` points against a clock: the state of the last point at or before now.

    Before the first point the state is UNKNOWN. Times are relative to ``start`` (the clock's value when created,
    unless given).
    """

    name = "scripted"

    def __init__(self, trace: Sequence[tuple[float, ThermalState]], clock: Callable[[], float],
                 start: float | None = None):
        points = sorted(trace, key=lambda p: p[0])
        self.times = [float(t) for t, _ in points]
        self.states = [s for _, s in points]
        self.clock = clock
        self.start = clock() if start is None else start

    def read(self) -> ThermalState:
        i = bisect.bisect_right(self.times, self.clock() - self.start)
        return self.states[i - 1] if i else ThermalState.UNKNOWN

    @property
    def duration(self) -> float:
        """Seconds from the start to the trace's last point."""
        return self.times[-1] if self.times else 0.0


def parse_trace(data: object) -> list[tuple[float, ThermalState]]:
    """A thermal trace from JSON data: a list of ``[t_seconds, state]`` pairs, times non-decreasing.

    Raises:
        ValueError: when the data is not such a list.
    """
    if not isinstance(data, list) or not data:
        raise ValueError("a thermal trace is a non-empty JSON list of [t_seconds, state] pairs")
    trace = []
    for item in data:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (int, float))
                and isinstance(item[1], str)):
            raise ValueError(f"bad thermal trace point {item!r}: expected [t_seconds, state]")
        trace.append((float(item[0]), ThermalState.parse(item[1])))
    if any(b[0] < a[0] for a, b in itertools.pairwise(trace)):
        raise ValueError("thermal trace times must not decrease")
    return trace


def load_trace(path: str | Path) -> list[tuple[float, ThermalState]]:
    """Read a thermal trace JSON file (see ``parse_trace``)."""
    return parse_trace(json.loads(Path(path).read_text(encoding="utf-8")))


def default_provider(platform: str = sys.platform) -> ThermalProvider:
    """The provider for ``platform`` (a ``sys.platform`` value)."""
    if platform == "darwin":
        from .macos import MacThermalProvider
        return MacThermalProvider()
    if platform.startswith("linux"):
        from .linux import LinuxThermalProvider
        return LinuxThermalProvider()
    if platform in ("win32", "cygwin"):
        from .windows import WindowsThermalProvider
        return WindowsThermalProvider()
    return UnknownProvider(f"no thermal sensor support for platform {platform!r}")
