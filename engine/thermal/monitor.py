"""ThermalMonitor: polls a provider, feeds decode timings to the drift detector, and keeps the policy's limits."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from .drift import DriftDetector
from .policy import Limits, Mode, PolicyDecision, ThermalPolicy
from .providers import ThermalProvider
from .state import ThermalState

POLL_INTERVAL_S = 2.0  # sensors change over seconds; reading them every step would cost more than it tells


class ThermalMonitor:
    """The scheduler's one source of limits. Call ``limits()`` once per step. Not thread-safe.

    Every PolicyDecision is appended to ``decisions`` and passed to ``on_decision`` (the dashboard's hook).
    """

    def __init__(self, provider: ThermalProvider, policy: ThermalPolicy | None = None,
                 drift: DriftDetector | None = None, clock: Callable[[], float] = time.monotonic,
                 poll_interval_s: float = POLL_INTERVAL_S,
                 on_decision: Callable[[PolicyDecision], None] | None = None):
        self.provider, self.clock, self.poll_interval_s = provider, clock, poll_interval_s
        self.policy = policy or ThermalPolicy()
        self.drift = drift or DriftDetector()
        self.on_decision = on_decision
        self.state = ThermalState.UNKNOWN
        self.decisions: list[PolicyDecision] = []
        self._polled_at: float | None = None

    def limits(self) -> Limits:
        """The limits for the next step: re-reads the provider when a poll is due, then applies the policy."""
        now = self.clock()
        if self._polled_at is None or now - self._polled_at >= self.poll_interval_s:
            self.state, self._polled_at = self.provider.read(), now
        self._record(self.policy.update(now, self.state, self.drift.throttled))
        return self.policy.limits

    def observe_decode(self, seconds: float, load: Hashable) -> None:
        """One batched decode step took ``seconds`` under ``load`` (see DriftDetector.observe)."""
        self.drift.observe(seconds, load)

    def set_mode(self, mode: Mode) -> None:
        self._record(self.policy.set_mode(self.clock(), mode, self.state, self.drift.throttled))

    def _record(self, decision: PolicyDecision | None) -> None:
        if decision is None:
            return
        self.decisions.append(decision)
        if self.on_decision is not None:
            self.on_decision(decision)
