"""The worker under the thermal policy: the prefill chunk it asks for, the mode a request carries, what the
dashboard is told. (The pauses and draft caps themselves: tests/engine/test_thermal_pacing.py.)"""

import pytest

from app.engine_host import EngineHost
from app.worker import thermal_mode
from engine.thermal import Mode, ScriptedProvider, ThermalMonitor, ThermalState

from .fake_engine import FakeFactory, FakeModel

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def host_at(qtbot):
    hosts = []

    def make(trace, model: FakeModel, clock=lambda: 0.0):
        monitor = ThermalMonitor(ScriptedProvider(trace, clock), clock=clock)
        host = EngineHost(FakeFactory(model), lambda options: options, thermal=monitor)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.shutdown()


def reply(qtbot, host, options: dict) -> list:
    samples = []
    host.telemetry.connect(samples.append)
    with qtbot.waitSignal(host.finished, timeout=20000):
        host.generate("/m.gguf", 4096, MESSAGES, {"max_tokens": 8, **options})
    host.telemetry.disconnect(samples.append)
    return samples


def test_a_hot_machine_gets_smaller_prefill_chunks_and_the_dashboard_hears_of_it(qtbot, host_at):
    model, now = FakeModel(["a", "b"]), [0.0]
    host = host_at([(0, ThermalState.SERIOUS), (10, ThermalState.CRITICAL)], model, clock=lambda: now[0])
    samples = reply(qtbot, host, {})
    assert model.prefill_chunks == [128]  # serious allows 128: the chat default stands
    now[0] = 10.0
    samples = reply(qtbot, host, {})
    assert model.prefill_chunks == [128, 64]
    assert {s.prefill_chunk for s in samples if s.generating} == {64}
    assert host.thermal.policy.limits.pause_s > 0  # critical: the worker rests between tokens


def test_the_mode_a_request_carries_switches_the_policy(qtbot, host_at):
    model = FakeModel(["a", "b"])
    host = host_at([(0, ThermalState.NOMINAL)], model)
    reply(qtbot, host, {"thermal_mode": "cool"})
    assert host.thermal.policy.mode is Mode.COOL and host.thermal.decisions[-1].reason == "mode set to cool"
    reply(qtbot, host, {"thermal_mode": "performance"})
    assert host.thermal.policy.mode is Mode.PERFORMANCE and model.prefill_chunks == [128, 128]


def test_unknown_modes_keep_the_current_one():
    assert thermal_mode("cool") is Mode.COOL
    assert thermal_mode(None) is None and thermal_mode("arctic") is None
