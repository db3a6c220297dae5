"""Linux: temperatures against their high/critical points, from psutil (hwmon) and /sys/class/thermal zones."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from .providers import ThermalProvider
from .state import ThermalState

SYSFS_THERMAL = Path("/sys/class/thermal")
FAIR_MARGIN_C = 10.0  # this close below the high point counts as "fair"
HIGH_BELOW_CRITICAL_C = 10.0  # when only a critical point is known, "high" is taken this far below it
PLAUSIBLE_C = (-40.0, 200.0)  # readings and trip points outside this are a driver's placeholder, not a temperature
HIGH_TRIP_TYPES = ("passive", "hot")  # passive: the kernel starts throttling; hot: the platform warns
PSUTIL_SENSORS = getattr(psutil, "sensors_temperatures", None)  # psutil has it on Linux and FreeBSD only


@dataclasses.dataclass(frozen=True)
class TemperatureReading:
    """One sensor: its temperature and the points where the platform considers it high and critical, in °C."""

    source: str
    current_c: float
    high_c: float | None = None
    critical_c: float | None = None


def _plausible(value: float | None) -> float | None:
    if value is None or not PLAUSIBLE_C[0] < value < PLAUSIBLE_C[1] or value == 0.0:
        return None
    return float(value)


def classify(reading: TemperatureReading) -> ThermalState:
    """Place one reading on the four-step scale; UNKNOWN when it has no usable high or critical point."""
    current, critical = _plausible(reading.current_c), _plausible(reading.critical_c)
    high = _plausible(reading.high_c)
    if current is None:
        return ThermalState.UNKNOWN
    if critical is not None and (high is None or high >= critical):
        high = critical - HIGH_BELOW_CRITICAL_C  # drivers often report high == critical
    if high is None:
        return ThermalState.UNKNOWN
    if critical is not None and current >= critical:
        return ThermalState.CRITICAL
    if current >= high:
        return ThermalState.SERIOUS
    if current >= high - FAIR_MARGIN_C:
        return ThermalState.FAIR
    return ThermalState.NOMINAL


def psutil_readings(sensors: Callable[[], dict]) -> list[TemperatureReading]:
    """Readings from ``psutil.sensors_temperatures()``-shaped data; [] when it fails or is empty."""
    try:
        groups = sensors() or {}
    except (OSError, RuntimeError, ValueError):
        return []
    return [TemperatureReading(f"psutil:{name}/{entry.label or name}", entry.current, entry.high, entry.critical)
            for name, entries in groups.items() for entry in entries]


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:  # absent, or the driver refuses (EAGAIN/ENODATA while the sensor is asleep)
        return None


def _read_millidegrees(path: Path) -> float | None:
    text = _read_text(path)
    try:
        return int(text) / 1000.0 if text is not None else None
    except ValueError:
        return None


def zone_reading(zone: Path) -> TemperatureReading | None:
    """One ``thermal_zoneN`` directory as a reading: ``temp`` plus its passive/hot and critical trip points."""
    if _read_text(zone / "mode") == "disabled":
        return None
    current = _read_millidegrees(zone / "temp")
    if current is None:
        return None
    highs, criticals = [], []
    for type_file in sorted(zone.glob("trip_point_*_type")):
        kind = _read_text(type_file)
        temp = _read_millidegrees(type_file.with_name(type_file.name.replace("_type", "_temp")))
        if temp is None or _plausible(temp) is None:
            continue
        if kind in HIGH_TRIP_TYPES:
            highs.append(temp)
        elif kind == "critical":
            criticals.append(temp)
    kind = _read_text(zone / "type") or "?"
    return TemperatureReading(f"sysfs:{zone.name} ({kind})", current,
                              min(highs) if highs else None, min(criticals) if criticals else None)


def sysfs_readings(root: Path) -> list[TemperatureReading]:
    """Readings of every thermal zone under ``root`` (normally /sys/class/thermal)."""
    try:
        zones = sorted(root.glob("thermal_zone*"))
    except OSError:
        return []
    return [r for r in map(zone_reading, zones) if r is not None]


class LinuxThermalProvider(ThermalProvider):
    """The hottest classified sensor among hwmon (through psutil) and the kernel's thermal zones.

    Sensors without a high or critical point cannot be classified and are left out; with none left the
    state is "unknown" (common in virtual machines and containers).
    """

    name = "linux"

    def __init__(self, sysfs_root: Path = SYSFS_THERMAL,
                 sensors: Callable[[], dict] | None = PSUTIL_SENSORS):
        self.sysfs_root = Path(sysfs_root)
        self.sensors = sensors
        self.last_readings: tuple[TemperatureReading, ...] = ()

    def readings(self) -> list[TemperatureReading]:
        found = psutil_readings(self.sensors) if self.sensors is not None else []
        return found + sysfs_readings(self.sysfs_root)

    def read(self) -> ThermalState:
        self.last_readings = tuple(self.readings())
        state = _hottest(self.last_readings)
        self.reason = None if state is not ThermalState.UNKNOWN else "no temperature sensor with a high or critical point"
        return state


def _hottest(readings: Iterable[TemperatureReading]) -> ThermalState:
    return ThermalState.hottest(classify(r) for r in readings)
