"""The thermal policy and monitor: limits shrink when hot and recover with hysteresis, on a fake clock."""

from __future__ import annotations

import dataclasses

import pytest

from engine.thermal import (
    DEFAULT_LEVELS,
    Limits,
    Mode,
    PolicyConfig,
    PolicyDecision,
    ScriptedProvider,
    ThermalMonitor,
    ThermalPolicy,
    ThermalState,
)
from engine.thermal.drift import DriftStatus

N, F, S, C, U = (ThermalState.NOMINAL, ThermalState.FAIR, ThermalState.SERIOUS, ThermalState.CRITICAL,
                 ThermalState.UNKNOWN)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(trace, seconds: int, cooldown_s: float = 10.0, mode: Mode = Mode.BALANCED):
    """Run a monitor over ``trace`` one second at a time; return {t: Limits} and the decisions."""
    clock = FakeClock()
    monitor = ThermalMonitor(ScriptedProvider(trace, clock), ThermalPolicy(PolicyConfig(cooldown_s=cooldown_s), mode),
                             clock=clock, poll_interval_s=1.0)
    limits = {}
    for t in range(seconds):
        clock.now = float(t)
        limits[t] = monitor.limits()
    return limits, monitor.decisions


def test_nominal_serious_critical_nominal_shrinks_then_recovers_one_level_per_cooldown():
    limits, decisions = replay([(0, N), (10, S), (20, C), (30, N)], 80)
    batch = {t: lim.max_batch for t, lim in limits.items()}
    chunk = {t: lim.prefill_chunk for t, lim in limits.items()}
    assert batch[9] == 8 and chunk[9] == 512
    assert batch[10] == 2 and chunk[10] == 128  # hotter applies at once
    assert batch[20] == 1 and chunk[20] == 64 and limits[20].pause_s > 0
    assert batch[39] == 1 and limits[39].pause_s > 0  # nominal since 30, but not for 10 s yet
    assert (batch[40], chunk[40], limits[40].pause_s) == (2, 128, 0.0)  # one level down
    assert (batch[50], chunk[50]) == (4, 256)
    assert (batch[60], chunk[60]) == (8, 512)
    assert all(batch[t] == 8 for t in range(60, 80))
    assert [(d.time, d.level) for d in decisions] == [(0, 0), (10, 2), (20, 3), (40, 2), (50, 1), (60, 0)]
    assert decisions[1].state is S and "hotter" in decisions[1].reason
    assert "cooler" in decisions[3].reason and decisions[3].state is N


def test_a_flickering_sensor_does_not_make_the_limits_oscillate():
    trace = [(0, S)] + [(t, N if t % 2 else S) for t in range(1, 60)]
    limits, decisions = replay(trace, 60)
    assert {lim.max_batch for lim in limits.values()} == {2}
    assert len(decisions) == 1


def test_a_short_cool_spell_resets_the_cooldown():
    limits, _ = replay([(0, S), (10, N), (18, S), (19, N)], 40)
    assert limits[28].max_batch == 2  # 10..18 was not long enough, and the clock restarted at 19
    assert limits[29].max_batch == 4


def test_decisions_are_frozen_records_the_dashboard_can_show():
    _, decisions = replay([(0, N), (5, C)], 6)
    decision = decisions[-1]
    assert isinstance(decision, PolicyDecision)
    assert (decision.time, decision.state, decision.prefill_chunk, decision.max_batch) == (5, C, 64, 1)
    assert decision.pause_s > 0 and decision.reason
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.max_batch = 3


@pytest.mark.parametrize("mode, expected", [
    (Mode.PERFORMANCE, {N: 8, F: 8, S: 4, C: 1}),
    (Mode.BALANCED, {N: 8, F: 4, S: 2, C: 1}),
    (Mode.COOL, {N: 2, F: 2, S: 1, C: 1}),
])
def test_modes(mode, expected):
    policy = ThermalPolicy(mode=mode)
    assert {state: DEFAULT_LEVELS[policy.target_level(state, False)].max_batch for state in expected} == expected


def test_cool_mode_caps_the_load_on_a_cool_machine():
    limits, _ = replay([(0, N)], 5, mode=Mode.COOL)
    assert limits[4].max_batch == 2 and limits[4].prefill_chunk == 128


def test_unknown_counts_as_nominal_and_drift_counts_as_serious():
    policy = ThermalPolicy()
    assert policy.target_level(U, False) == 0
    assert policy.target_level(U, True) == policy.target_level(S, False) == 2
    assert policy.target_level(C, True) == 3


def test_inferred_throttling_backs_off_through_the_monitor():
    clock = FakeClock()
    monitor = ThermalMonitor(ScriptedProvider([(0, U)], clock), ThermalPolicy(PolicyConfig(cooldown_s=10)), clock=clock)
    assert monitor.limits().max_batch == 8
    monitor.drift.status = DriftStatus(True, 1.5, "test")
    clock.now = 1
    assert monitor.limits().max_batch == 2
    assert monitor.decisions[-1].drift_throttled and "drift" in monitor.decisions[-1].reason


def test_a_mode_change_applies_at_once_and_is_recorded():
    clock = FakeClock()
    seen = []
    monitor = ThermalMonitor(ScriptedProvider([(0, N)], clock), clock=clock, on_decision=seen.append)
    monitor.limits()
    monitor.set_mode(Mode.COOL)
    assert monitor.limits().max_batch == 2
    monitor.set_mode(Mode.PERFORMANCE)
    assert monitor.limits().max_batch == 8
    assert [d.mode for d in seen] == [Mode.BALANCED, Mode.COOL, Mode.PERFORMANCE]
    assert seen == monitor.decisions


def test_the_provider_is_read_once_per_poll_interval():
    clock = FakeClock()

    class CountingProvider(ScriptedProvider):
        reads = 0

        def read(self):
            CountingProvider.reads += 1
            return super().read()

    monitor = ThermalMonitor(CountingProvider([(0, N)], clock), clock=clock, poll_interval_s=2.0)
    for t in range(10):
        clock.now = t * 0.5
        monitor.limits()
    assert CountingProvider.reads == 3  # at 0, 2 and 4 s


def test_a_policy_needs_four_levels():
    with pytest.raises(ValueError, match="4 levels"):
        ThermalPolicy(PolicyConfig(levels=(Limits(1, 1, 0.0),)))


def test_a_replayed_trace_file_records_the_batch_decisions(tiny_model_path, tmp_path):
    from engine.backends.numpy_backend import NumpyBackend
    from engine.thermal.replay import replay_thermal_trace
    from engine.config import ModelConfig
    from engine.gguf_file import read_gguf

    gguf = read_gguf(tiny_model_path)
    backend = NumpyBackend(gguf, ModelConfig.from_gguf(gguf))
    trace = tmp_path / "trace.json"
    trace.write_text('[[0, "nominal"], [10, "serious"], [20, "critical"], [30, "nominal"]]')
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    result = replay_thermal_trace(backend, prompts, trace, PolicyConfig(cooldown_s=10))
    batch = [(row[0], row[2], row[5]) for row in result["timeline"]]  # (t, max_batch, in flight)
    assert batch[0] == (0, 8, 4)
    assert (10, 2, 2) in batch and (20, 1, 1) in batch
    recovered = [t for t, max_batch, _ in batch if t > 30 and max_batch == 8]
    assert recovered and recovered[0] >= 30 + 3 * 10  # three levels down, one cooldown each
    assert [d["max_batch"] for d in result["decisions"]] == [8, 2, 1, 2, 4, 8]
    assert result["decisions"][2]["pause_s"] > 0 and result["decisions"][2]["state"] == "critical"
