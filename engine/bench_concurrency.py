"""Concurrency bench: aggregate decode tokens/sec of N sequences batched by the scheduler, beside one sequence
alone in the same run; and a scripted thermal trace replayed through the policy on a fake clock.

Decode speed is measured over whole scheduler steps that do no prefill (sampling and bookkeeping included), and
also over bare ``forward`` / ``forward_batch`` calls, in wall-clock and in CPU time. Single and batched runs are
interleaved ``repeats`` times and medians reported. Nothing here asserts a time.
"""

from __future__ import annotations

import dataclasses
import enum
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .backends.base import Backend
from .bench import _set_threads, bench_prompt
from .model import load
from .sampling import SamplingParams, make_sampler
from .scheduler import Request, Scheduler, StepReport
from .thermal import Limits, PolicyConfig, ScriptedProvider, ThermalMonitor, ThermalPolicy, load_trace

PROMPT_STRIDE = 16  # each sequence's prompt starts this many tokens later and is a few tokens shorter
FAKE_STEP_S = 1.0  # fake seconds per scheduler step in a thermal replay
REPLAY_PROMPT_TOKENS = 32


def prompts_for(ids: list[int], n: int, prompt_tokens: int) -> list[list[int]]:
    """``n`` different prompts of different lengths cut from ``ids`` (which needs ``prompt_tokens + n * STRIDE``)."""
    return [ids[i * PROMPT_STRIDE:i * PROMPT_STRIDE + max(1, prompt_tokens - 3 * i)] for i in range(n)]


def _greedy() -> Callable:
    return make_sampler(SamplingParams(temperature=0.0))


@dataclasses.dataclass
class Speed:
    """Decode tokens and the time they took: wall clock, and CPU time of this process (all its threads).

    On a machine shared with other work, tokens per CPU-second is the steadier number for a one-thread run.
    """

    tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def add(self, tokens: int, wall_s: float, cpu_s: float) -> None:
        self.tokens, self.wall_s, self.cpu_s = self.tokens + tokens, self.wall_s + wall_s, self.cpu_s + cpu_s

    @property
    def tps(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tps_per_cpu(self) -> float:
        return self.tokens / self.cpu_s if self.cpu_s > 0 else 0.0


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def scheduler_decode_speed(backend: Backend, prompts: list[list[int]], gen_tokens: int, n_ctx: int) -> Speed:
    """Decode speed over the scheduler steps that only decode, with every prompt in one batch."""
    limits = Limits(prefill_chunk=max(map(len, prompts)) * len(prompts), max_batch=len(prompts), pause_s=0.0)
    scheduler = Scheduler(backend, n_ctx, limits=limits)
    for prompt in prompts:
        scheduler.submit(Request(tuple(prompt), _greedy(), max_tokens=gen_tokens))
    speed = Speed()
    while scheduler.has_work:
        wall, cpu = _clocks()
        report = scheduler.step()
        if report.prefill_tokens == 0 and report.decode_batch == len(prompts):
            speed.add(report.decode_batch, time.perf_counter() - wall, time.process_time() - cpu)
    return speed


def forward_decode_speed(backend: Backend, prompts: list[list[int]], gen_tokens: int, n_ctx: int) -> Speed:
    """Speed of bare greedy decode: ``forward`` for one prompt, ``forward_batch`` for several."""
    caches = [backend.new_cache(n_ctx) for _ in prompts]
    for cache in caches:
        cache.reserve_whole_room()  # as the scheduler does, so no cache grows inside the timed loop
    tokens = [int(np.argmax(backend.forward(p, c))) for p, c in zip(prompts, caches)]
    wall, cpu = _clocks()
    for _ in range(gen_tokens - 1):
        if len(prompts) == 1:
            logits = backend.forward(tokens, caches[0])[None, :]
        else:
            logits = backend.forward_batch(tokens, caches)
        tokens = [int(t) for t in np.argmax(logits, axis=-1)]
    return Speed(len(prompts) * (gen_tokens - 1), time.perf_counter() - wall, time.process_time() - cpu)


def measure_concurrency(backend: Backend, prompts: list[list[int]], gen_tokens: int, n_ctx: int,
                        repeats: int) -> dict:
    """Single vs batched decode speed, interleaved ``repeats`` times; medians, runs and ratios.

    ``decode_tps`` / ``single_decode_tps`` go through the scheduler; ``forward_batch_tps`` /
    ``single_forward_tps`` are the bare backend calls. ``*_per_cpu_s`` count tokens per CPU-second.
    """
    runs: dict[str, list[Speed]] = {"single_decode": [], "decode": [], "single_forward": [], "forward_batch": []}
    for _ in range(repeats):
        runs["single_decode"].append(scheduler_decode_speed(backend, prompts[:1], gen_tokens, n_ctx))
        runs["decode"].append(scheduler_decode_speed(backend, prompts, gen_tokens, n_ctx))
        runs["single_forward"].append(forward_decode_speed(backend, prompts[:1], gen_tokens, n_ctx))
        runs["forward_batch"].append(forward_decode_speed(backend, prompts, gen_tokens, n_ctx))
    report = {}
    for name, speeds in runs.items():
        report[f"{name}_tps"] = round(statistics.median(s.tps for s in speeds), 2)
        report[f"{name}_tps_runs"] = [round(s.tps, 2) for s in speeds]
        report[f"{name}_tokens_per_cpu_s"] = round(statistics.median(s.tps_per_cpu for s in speeds), 2)
    report["ratio.decode"] = round(report["decode_tps"] / report["single_decode_tps"], 3)
    report["ratio.forward"] = round(report["forward_batch_tps"] / report["single_forward_tps"], 3)
    report["ratio.decode_per_cpu_s"] = round(report["decode_tokens_per_cpu_s"] / report["single_decode_tokens_per_cpu_s"], 3)
    return report


class _FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay_thermal_trace(backend: Backend, prompts: list[list[int]], trace_path: Path,
                         policy_config: PolicyConfig | None = None) -> dict:
    """Run the scheduler on ``prompts`` under a scripted thermal trace, one fake second per step (pauses add
    their length), until the trace ends and the policy has had time to recover; record what it decided."""
    trace = load_trace(trace_path)
    policy_config = policy_config or PolicyConfig()
    clock = _FakeClock()
    monitor = ThermalMonitor(ScriptedProvider(trace, clock), ThermalPolicy(policy_config), clock=clock,
                             poll_interval_s=0.0)
    end = trace[-1][0] + (len(policy_config.levels) + 1) * policy_config.cooldown_s
    steps = int(end / FAKE_STEP_S) + 1
    n_ctx = max(map(len, prompts)) + steps + 1
    scheduler = Scheduler(backend, n_ctx, monitor=monitor, clock=clock)
    for prompt in prompts:
        scheduler.submit(Request(tuple(prompt), _greedy(), max_tokens=steps))
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


def run_concurrency_bench(path: Path, backend: str, threads: int | None, prompt_tokens: int, gen_tokens: int,
                          concurrency: int, repeats: int, thermal_script: Path | None = None) -> dict:
    """The report of ``python -m engine bench MODEL --concurrency N [--thermal-script FILE]``."""
    if concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
    if threads:
        _set_threads(backend, threads)
    n_ctx = prompt_tokens + gen_tokens + 8
    model = load(path, backend, n_ctx)
    ids = bench_prompt(model, prompt_tokens + PROMPT_STRIDE * concurrency)
    prompts = prompts_for(ids, concurrency, prompt_tokens)
    report = {"model": model.name, "file": str(path), "backend": model.backend.name, "threads": threads,
              "concurrency": concurrency, "prompt_tokens": [len(p) for p in prompts], "gen_tokens": gen_tokens,
              "repeats": repeats, "notices": model.notices}
    report.update(measure_concurrency(model.backend, prompts, gen_tokens, n_ctx, repeats))
    if thermal_script is not None:
        replay_prompts = prompts_for(ids, concurrency, min(prompt_tokens, REPLAY_PROMPT_TOKENS))
        report["thermal"] = replay_thermal_trace(model.backend, replay_prompts, thermal_script)
    return report
