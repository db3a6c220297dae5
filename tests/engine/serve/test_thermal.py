"""Headless API sequences under the app's thermal policy (``hearth serve --thermal``): its levels scaled to
``--parallel``, and the served scheduler taking its limits from the monitor each step."""

from __future__ import annotations

import time

from engine.model import load
from engine.serve.cli import thermal_monitor
from engine.serve.host import ServedModel
from engine.thermal import ScriptedProvider, ThermalState
from tests.model_store import model_path


def test_the_policy_levels_scale_to_the_servers_parallel_sequences():
    assert thermal_monitor("off", 16) is None
    monitor = thermal_monitor("balanced", 16)
    assert [level.max_batch for level in monitor.policy.config.levels] == [16, 8, 4, 2]
    assert monitor.policy.mode.value == "balanced"
    assert thermal_monitor("cool", 4).policy.mode.value == "cool"


def test_a_hot_machine_limits_the_served_schedulers_batch_and_paces_it():
    monitor = thermal_monitor("balanced", 16)
    monitor.provider = ScriptedProvider([(0.0, ThermalState.CRITICAL)], time.monotonic)
    served = ServedModel(load(model_path("smollm2"), backend="cpu", n_ctx=256), "smol", parallel=16, thermal=monitor)
    scheduler = served.host.model.scheduler
    assert scheduler.monitor is monitor
    limits = scheduler._limits()  # what each step runs under
    assert limits.max_batch == 2 and limits.pause_s > 0
    cool = thermal_monitor("balanced", 16)
    cool.provider = ScriptedProvider([(0.0, ThermalState.NOMINAL)], time.monotonic)
    scheduler.monitor = cool
    assert scheduler._limits().max_batch == 16 and scheduler._limits().pause_s == 0
