"""Thermal policy: thermal state (and inferred throttling) -> prefill chunk, concurrent sequences, pause.

Limits come in levels, one per severity. A hotter state raises the level at once; a cooler one lowers it one
level at a time, and only after the cooler state has held for ``cooldown_s`` (hysteresis, so a sensor that
flickers around a trip point does not make the batch size oscillate). Every change is a PolicyDecision.
"""

from __future__ import annotations

import dataclasses
import enum

from .state import ThermalState


class Mode(enum.Enum):
    """The user's choice. Performance tolerates "fair"; Cool caps the load even on a cool machine."""

    PERFORMANCE = "performance"
    BALANCED = "balanced"
    COOL = "cool"


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the scheduler may do per step."""

    prefill_chunk: int  # prompt tokens per step, across all prefilling sequences
    max_batch: int  # sequences in flight (decoding or prefilling)
    pause_s: float  # idle time between steps
    max_draft: int = 16  # speculative tokens per verify pass (0: no speculation); the user's cap applies too


DEFAULT_LEVELS = (
    Limits(prefill_chunk=512, max_batch=8, pause_s=0.0, max_draft=16),  # 0: nominal
    Limits(prefill_chunk=256, max_batch=4, pause_s=0.0, max_draft=8),  # 1: fair
    Limits(prefill_chunk=128, max_batch=2, pause_s=0.0, max_draft=4),  # 2: serious
    Limits(prefill_chunk=64, max_batch=1, pause_s=0.5, max_draft=0),  # 3: critical: one sequence, rest between steps
)

# level for each severity (nominal/unknown, fair, serious, critical), per mode
MODE_LEVELS = {
    Mode.PERFORMANCE: (0, 0, 1, 3),
    Mode.BALANCED: (0, 1, 2, 3),
    Mode.COOL: (2, 2, 3, 3),
}


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    levels: tuple[Limits, ...] = DEFAULT_LEVELS
    cooldown_s: float = 30.0  # a cooler state must hold this long before each step down
    drift_state: ThermalState = ThermalState.SERIOUS  # what inferred throttling counts as


@dataclasses.dataclass(frozen=True)
class PolicyDecision:
    """A change of limits, with why; the dashboard shows these."""

    time: float
    state: ThermalState  # as the provider reported it
    drift_throttled: bool  # throttling inferred from decode speed
    mode: Mode
    level: int
    prefill_chunk: int
    max_batch: int
    pause_s: float
    reason: str
    max_draft: int = 16


class ThermalPolicy:
    """Turns (time, state, drift) into Limits, with hysteresis on the way down. Not thread-safe."""

    def __init__(self, config: PolicyConfig = PolicyConfig(), mode: Mode = Mode.BALANCED):
        if len(config.levels) != 4:
            raise ValueError(f"a policy needs 4 levels (nominal, fair, serious, critical), got {len(config.levels)}")
        self.config, self.mode = config, mode
        self.level: int | None = None  # None until the first update
        self._cooler_since: float | None = None  # when the target level first fell below the current one

    @property
    def limits(self) -> Limits:
        return self.config.levels[self.level or 0]

    def target_level(self, state: ThermalState, drift_throttled: bool) -> int:
        """The level ``state`` calls for in the current mode, before hysteresis."""
        if drift_throttled:
            state = ThermalState.hottest([state, self.config.drift_state])
        return MODE_LEVELS[self.mode][state.severity]

    def update(self, now: float, state: ThermalState, drift_throttled: bool = False) -> PolicyDecision | None:
        """Advance to ``now``; return a decision when the limits change (and on the first call)."""
        target = self.target_level(state, drift_throttled)
        if self.level is None or target > self.level:
            first = self.level is None
            self.level, self._cooler_since = target, None
            return self._decision(now, state, drift_throttled, _why(state, drift_throttled, "start" if first else "hotter"))
        if target == self.level:
            self._cooler_since = None
            return None
        if self._cooler_since is None:
            self._cooler_since = now
            return None
        if now - self._cooler_since < self.config.cooldown_s:
            return None
        self.level -= 1
        self._cooler_since = now if target < self.level else None
        return self._decision(now, state, drift_throttled,
                              f"{_why(state, drift_throttled, 'cooler')} for {self.config.cooldown_s:g} s: one level down")

    def set_mode(self, now: float, mode: Mode, state: ThermalState, drift_throttled: bool = False) -> PolicyDecision:
        """Switch mode; the user asked, so the new mode's level applies at once in both directions."""
        self.mode = mode
        self.level, self._cooler_since = self.target_level(state, drift_throttled), None
        return self._decision(now, state, drift_throttled, f"mode set to {mode.value}")

    def _decision(self, now: float, state: ThermalState, drift: bool, reason: str) -> PolicyDecision:
        limits = self.limits
        return PolicyDecision(now, state, drift, self.mode, self.level, limits.prefill_chunk, limits.max_batch,
                              limits.pause_s, reason, limits.max_draft)


def _why(state: ThermalState, drift: bool, direction: str) -> str:
    text = f"{direction}: thermal state {state.value}"
    return text + " and throughput drift (throttling inferred)" if drift else text
