"""A scripted thermal trace replayed through the policy and the scheduler on a fake clock: what the policy decided.

One fake second passes per scheduler step (a step's pause adds its length), so a trace of minutes replays in a
moment and the same trace always gives the same decisions. Benches report the result; tests check the policy by it.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

from ..backends.base import Backend
from ..sampling import SamplingParams, make_sampler
from ..scheduler import Request, Scheduler, StepReport
from .monitor import ThermalMonitor
from .policy import PolicyConfig, ThermalPolicy
from .providers import ScriptedProvider, load_trace

FAKE_STEP_S = 1.0  # fake seconds per scheduler step


class FakeClock:
    """A clock that moves only when told (``now`` is set by the replay loop)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay_thermal_trace(backend: Backend, prompts: list[list[int]], trace_path: Path,
                         policy_config: PolicyConfig | None = None) -> dict:
    """Run the scheduler on ``prompts`` under a scripted thermal trace until the trace ends and the policy has had
    time to recover; record what it decided.

    Args:
        backend: the backend the scheduler decodes on (greedy).
        prompts: one prompt per sequence.
        trace_path: a JSON list of ``[t_seconds, state]`` (see ``providers.load_trace``).
        policy_config: the policy's levels and cooldown (default: ``PolicyConfig()``).

    Returns:
        ``trace``, ``fake_step_s``, ``cooldown_s``, ``steps``, ``decisions`` (the policy's decisions as dicts) and
        ``timeline``: ``[t, state, max_batch, prefill_chunk, pause_s, in_flight]`` rows, one per change.
    """
    trace = load_trace(trace_path)
    policy_config = policy_config or PolicyConfig()
    clock = FakeClock()
    monitor = ThermalMonitor(ScriptedProvider(trace, clock), ThermalPolicy(policy_config), clock=clock,
                             poll_interval_s=0.0)
    end = trace[-1][0] + (len(policy_config.levels) + 1) * policy_config.cooldown_s
    steps = int(end / FAKE_STEP_S) + 1
    n_ctx = max(map(len, prompts)) + steps + 1
    scheduler = Scheduler(backend, n_ctx, monitor=monitor, clock=clock)
    for prompt in prompts:
        scheduler.submit(Request(tuple(prompt), make_sampler(SamplingParams(temperature=0.0)), max_tokens=steps))
    timeline: list[list] = []
    n_steps = 0
    while clock.now <= end:
        report = scheduler.step()
        n_steps += 1
        _record(timeline, clock.now, monitor.state.value, report)
        clock.now += FAKE_STEP_S + report.pause_s
    return {"trace": [[t, s.value] for t, s in trace], "fake_step_s": FAKE_STEP_S,
            "cooldown_s": policy_config.cooldown_s, "steps": n_steps,
            "decisions": [_jsonable(dataclasses.asdict(d)) for d in monitor.decisions],
            "timeline": timeline}


def _record(timeline: list[list], now: float, state: str, report: StepReport) -> None:
    """Append ``[t, state, max_batch, prefill_chunk, pause_s, in_flight]`` when anything but t changed."""
    row = [now, state, report.limits.max_batch, report.limits.prefill_chunk, report.limits.pause_s, report.in_flight]
    if not timeline or timeline[-1][1:] != row[1:]:
        timeline.append(row)


def _jsonable(record: dict) -> dict:
    return {k: v.value if isinstance(v, enum.Enum) else v for k, v in record.items()}
