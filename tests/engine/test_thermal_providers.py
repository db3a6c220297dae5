"""Thermal providers with the platform faked: a fake sysfs tree and psutil data, fake Objective-C runtimes; and
the real provider of this machine."""

from __future__ import annotations

import collections
import ctypes
import json
from pathlib import Path

import pytest

from engine.thermal import ScriptedProvider, ThermalState, UnknownProvider, default_provider, load_trace, parse_trace
from engine.thermal.linux import LinuxThermalProvider, TemperatureReading, classify, zone_reading
from engine.thermal.macos import MacThermalProvider, ObjcRuntime
from engine.thermal.windows import WindowsThermalProvider

N, F, S, C, U = (ThermalState.NOMINAL, ThermalState.FAIR, ThermalState.SERIOUS, ThermalState.CRITICAL,
                 ThermalState.UNKNOWN)
shwtemp = collections.namedtuple("shwtemp", "label current high critical")  # psutil's record


# -- Linux ----------------------------------------------------------------------------------------------
def make_zone(root: Path, index: int, temp, trips=(), kind="x86_pkg_temp", mode: str | None = "enabled") -> Path:
    zone = root / f"thermal_zone{index}"
    zone.mkdir(parents=True)
    (zone / "type").write_text(kind + "\n")
    if mode is not None:
        (zone / "mode").write_text(mode + "\n")
    if temp is not None:
        (zone / "temp").write_text(f"{temp}\n")
    for i, (trip_type, trip_temp) in enumerate(trips):
        (zone / f"trip_point_{i}_type").write_text(trip_type + "\n")
        (zone / f"trip_point_{i}_temp").write_text(f"{trip_temp}\n")
    return zone


TRIPS = (("active", 60000), ("passive", 95000), ("critical", 105000))


@pytest.mark.parametrize("millidegrees, expected", [(45000, N), (84999, N), (85000, F), (94000, F), (95000, S),
                                                    (104999, S), (105000, C), (120000, C)])
def test_a_thermal_zone_against_its_passive_and_critical_trip_points(tmp_path, millidegrees, expected):
    make_zone(tmp_path, 0, millidegrees, TRIPS)
    assert LinuxThermalProvider(sysfs_root=tmp_path, sensors=None).read() is expected


def test_zone_reading_takes_the_lowest_high_and_critical_points_and_skips_active_ones(tmp_path):
    zone = make_zone(tmp_path, 3, 50000, TRIPS + (("hot", 90000), ("critical", 110000), ("passive", 255000)))
    assert zone_reading(zone) == TemperatureReading("sysfs:thermal_zone3 (x86_pkg_temp)", 50.0, 90.0, 105.0)


def test_the_hottest_zone_wins_and_unclassifiable_or_broken_zones_are_left_out(tmp_path):
    make_zone(tmp_path, 0, 50000, TRIPS)
    make_zone(tmp_path, 1, 99000, TRIPS)  # serious
    make_zone(tmp_path, 2, 130000, (), kind="no_trips")  # no points: cannot be classified
    make_zone(tmp_path, 3, 200000, TRIPS, mode="disabled")
    make_zone(tmp_path, 4, None, TRIPS)  # temp unreadable (driver asleep)
    make_zone(tmp_path, 5, "garbage", TRIPS)
    make_zone(tmp_path, 6, 110000, (("critical", 0),))  # a 0 °C trip point is a placeholder
    provider = LinuxThermalProvider(sysfs_root=tmp_path, sensors=None)
    assert provider.read() is S
    assert len(provider.last_readings) == 4  # zones 0, 1, 2, 6


def test_no_classifiable_sensor_is_unknown_with_a_reason(tmp_path):
    make_zone(tmp_path, 0, 70000, ())
    provider = LinuxThermalProvider(sysfs_root=tmp_path, sensors=dict)
    assert provider.read() is U and "no temperature sensor" in provider.reason
    assert LinuxThermalProvider(sysfs_root=tmp_path / "absent", sensors=None).read() is U


def test_psutil_sensors_with_high_and_critical_points(tmp_path):
    data = {"coretemp": [shwtemp("Package id 0", 88.0, 90.0, 100.0), shwtemp("Core 0", 60.0, 90.0, 100.0)],
            "nvme": [shwtemp("Composite", 40.0, None, None)]}
    assert LinuxThermalProvider(sysfs_root=tmp_path, sensors=lambda: data).read() is F
    data["coretemp"][0] = shwtemp("Package id 0", 95.0, 90.0, 100.0)
    assert LinuxThermalProvider(sysfs_root=tmp_path, sensors=lambda: data).read() is S


def test_psutil_and_sysfs_are_combined_and_a_failing_psutil_is_ignored(tmp_path):
    make_zone(tmp_path, 0, 101000, (("critical", 100000),))
    assert LinuxThermalProvider(sysfs_root=tmp_path, sensors=dict).read() is C

    def broken():
        raise OSError("hwmon went away")

    assert LinuxThermalProvider(sysfs_root=tmp_path, sensors=broken).read() is C


@pytest.mark.parametrize("reading, expected", [
    (TemperatureReading("acpitz", 95.0, 103.0, 103.0), S),  # high == critical: high is taken 10 °C below
    (TemperatureReading("acpitz", 84.0, 103.0, 103.0), F),
    (TemperatureReading("x", 79.0, None, 100.0), N),
    (TemperatureReading("x", 82.0, None, 100.0), F),
    (TemperatureReading("x", 70.0, 80.0, None), F),
    (TemperatureReading("x", 81.0, 80.0, None), S),
    (TemperatureReading("x", 70.0, None, None), U),
    (TemperatureReading("x", -273.0, 80.0, 100.0), U),
])
def test_classify(reading, expected):
    assert classify(reading) is expected


def test_this_machine_reports_a_valid_state_without_error():
    provider = default_provider()
    state = provider.read()
    assert isinstance(state, ThermalState)
    assert isinstance(provider, LinuxThermalProvider)
    assert (state is U) == (provider.reason is not None)


# -- macOS ----------------------------------------------------------------------------------------------
class FakeRuntime:
    """The Objective-C runtime as the provider uses it; ``thermal_state`` is what thermalState returns."""

    CLASS, PROCESS_INFO = 0x1000, 0x2000

    def __init__(self, thermal_state: int = 0, has_class: bool = True, responds: bool = True):
        self.thermal_state, self.has_class, self.responds = thermal_state, has_class, responds
        self.selectors: dict[bytes, int] = {}

    def get_class(self, name: bytes):
        return self.CLASS if self.has_class and name == b"NSProcessInfo" else None

    def selector(self, name: bytes) -> int:
        return self.selectors.setdefault(name, 0x100 + len(self.selectors))

    def send_id(self, receiver, selector):
        assert (receiver, selector) == (self.CLASS, self.selector(b"processInfo"))
        return self.PROCESS_INFO

    def send_long(self, receiver, selector):
        assert (receiver, selector) == (self.PROCESS_INFO, self.selector(b"thermalState"))
        return self.thermal_state

    def responds_to(self, receiver, selector):
        return self.responds


@pytest.mark.parametrize("raw, expected", [(0, N), (1, F), (2, S), (3, C), (4, U), (-1, U)])
def test_macos_maps_nsprocessinfo_thermal_states(raw, expected):
    runtime = FakeRuntime(raw)
    provider = MacThermalProvider(lambda: runtime)
    assert provider.read() is expected and provider.reason is None


def test_macos_follows_the_state_as_it_changes():
    runtime = FakeRuntime(0)
    provider = MacThermalProvider(lambda: runtime)
    runtime.thermal_state = 3
    assert provider.read() is C


@pytest.mark.parametrize("runtime, message", [
    (FakeRuntime(has_class=False), "NSProcessInfo"),
    (FakeRuntime(responds=False), "10.10.3"),
])
def test_macos_without_thermal_state_is_unknown(runtime, message):
    provider = MacThermalProvider(lambda: runtime)
    assert provider.read() is U and message in provider.reason


def test_macos_provider_off_macos_is_unknown_without_error():
    provider = default_provider("darwin")  # loads the real libobjc, which is absent here
    assert isinstance(provider, MacThermalProvider)
    assert provider.read() is U and "libobjc" in provider.reason


class FakeLibObjc:
    """C callbacks standing in for libobjc's functions, so ObjcRuntime's ctypes prototypes are really called."""

    def __init__(self, thermal_state: int):
        self.names: dict[int, bytes] = {}
        self.get_class_proto = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
        self.objc_getClass = self.get_class_proto(lambda name: 0x1000 if name == b"NSProcessInfo" else None)
        self.sel_registerName = self.get_class_proto(self._register)
        # one C function for every message, as objc_msgSend is; unused trailing arguments are ignored
        self.objc_msgSend = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
            self._send)
        self.thermal_state = thermal_state

    def _register(self, name: bytes) -> int:
        key = 0x5000 + 8 * (sum(name) + len(name))
        self.names[key] = name
        return key

    def _send(self, receiver, selector, argument) -> int:
        message = self.names[selector]
        if message == b"processInfo":
            return 0x2000 if receiver == 0x1000 else 0
        if message == b"respondsToSelector:":
            return int(self.names.get(argument) == b"thermalState")
        if message == b"thermalState":
            return self.thermal_state if receiver == 0x2000 else -1
        return 0


def test_objc_runtime_calls_through_typed_prototypes():
    lib = FakeLibObjc(thermal_state=2)
    runtime = ObjcRuntime(lib)
    assert runtime.get_class(b"NSProcessInfo") == 0x1000 and runtime.get_class(b"NSNothing") is None
    assert MacThermalProvider(lambda: runtime).read() is S
    lib.thermal_state = 1
    assert MacThermalProvider(lambda: ObjcRuntime(lib)).read() is F


# -- Windows and the rest -------------------------------------------------------------------------------
def test_windows_is_unknown_and_says_why():
    provider = default_provider("win32")
    assert isinstance(provider, WindowsThermalProvider)
    assert provider.read() is U and "inferred from decode speed" in provider.reason


def test_other_platforms_get_an_unknown_provider():
    provider = default_provider("sunos5")
    assert isinstance(provider, UnknownProvider) and provider.read() is U and "sunos5" in provider.reason


def test_scripted_provider_replays_a_trace_against_its_clock():
    now = [100.0]
    provider = ScriptedProvider([(0, N), (10, S), (20, C)], lambda: now[0])
    readings = {}
    for t in (0, 9.9, 10, 25):
        now[0] = 100.0 + t
        readings[t] = provider.read()
    assert readings == {0: N, 9.9: N, 10: S, 25: C} and provider.duration == 20
    now[0] = 99.0
    assert provider.read() is U  # before the first point


def test_trace_files_are_parsed_and_checked(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([[0, "nominal"], [5.5, "Serious"], [9, "critical"]]))
    assert load_trace(path) == [(0.0, N), (5.5, S), (9.0, C)]
    for bad in ([], {"t": 1}, [[0]], [["0", "nominal"]], [[0, "warm"]], [[5, "fair"], [1, "nominal"]]):
        with pytest.raises(ValueError):
            parse_trace(bad)


def test_state_names_and_severity():
    assert ThermalState.parse(" CRITICAL ") is C
    assert [s.severity for s in (N, F, S, C, U)] == [0, 1, 2, 3, 0]
    assert ThermalState.hottest([N, U, F]) is F and ThermalState.hottest([U, U]) is U and ThermalState.hottest([]) is U
