"""Thermal awareness: the machine's thermal state per platform, throttling inferred from decode speed, and the
policy that turns both into scheduler limits (prefill chunk, concurrent sequences, pause)."""

from .drift import DriftConfig, DriftDetector, DriftStatus
from .monitor import ThermalMonitor
from .pacing import PAUSE_SLICE_S, rest
from .policy import DEFAULT_LEVELS, Limits, Mode, PolicyConfig, PolicyDecision, ThermalPolicy
from .providers import ScriptedProvider, ThermalProvider, UnknownProvider, default_provider, load_trace, parse_trace
from .state import ThermalState

__all__ = [
    "DEFAULT_LEVELS", "PAUSE_SLICE_S", "DriftConfig", "DriftDetector", "DriftStatus", "Limits", "Mode", "PolicyConfig",
    "PolicyDecision", "ScriptedProvider", "ThermalMonitor", "ThermalPolicy", "ThermalProvider", "ThermalState",
    "UnknownProvider", "default_provider", "load_trace", "parse_trace", "rest",
]
