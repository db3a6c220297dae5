"""Windows: no thermal state without administrator rights, so "unknown"; the drift detector does the work.

What was considered: ``MSAcpi_ThermalZoneTemperature`` (WMI ``root\\WMI``) needs administrator rights and on
many machines reports a fixed ACPI value rather than the CPU's; ``Win32_TemperatureProbe.CurrentReading`` is
documented as not populated. Neither is reliable enough to drive the scheduler, and WMI through raw COM from
ctypes is a lot of unsafe code for that. The throughput-drift detector (drift.py) infers throttling instead.
"""

from __future__ import annotations

from .providers import ThermalProvider
from .state import ThermalState


class WindowsThermalProvider(ThermalProvider):
    """Always "unknown", with the reason; see the module docstring."""

    name = "windows"
    reason = "Windows reports no thermal state to unprivileged programs; throttling is inferred from decode speed"

    def read(self) -> ThermalState:
        return ThermalState.UNKNOWN
