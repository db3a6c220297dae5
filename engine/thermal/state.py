"""ThermalState: how hot the machine says it is, on Apple's four-step scale plus "unknown"."""

from __future__ import annotations

import enum


class ThermalState(enum.Enum):
    """The machine's thermal state. ``severity`` orders the states; "unknown" ranks with "nominal"."""

    NOMINAL = "nominal"
    FAIR = "fair"
    SERIOUS = "serious"
    CRITICAL = "critical"
    UNKNOWN = "unknown"

    @property
    def severity(self) -> int:
        """0 (nominal or unknown) .. 3 (critical)."""
        return _SEVERITY[self]

    @classmethod
    def parse(cls, text: str) -> ThermalState:
        """The state named ``text`` (case-insensitive); ValueError for any other text."""
        try:
            return cls(text.strip().lower())
        except ValueError:
            names = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown thermal state {text!r} (expected one of {names})") from None

    @classmethod
    def hottest(cls, states) -> ThermalState:
        """The most severe of ``states``; UNKNOWN when there are none or all are unknown."""
        known = [s for s in states if s is not cls.UNKNOWN]
        return max(known, key=lambda s: s.severity) if known else cls.UNKNOWN


_SEVERITY = {ThermalState.NOMINAL: 0, ThermalState.UNKNOWN: 0, ThermalState.FAIR: 1,
             ThermalState.SERIOUS: 2, ThermalState.CRITICAL: 3}
