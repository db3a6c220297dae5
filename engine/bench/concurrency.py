"""Concurrency bench: aggregate decode tokens/sec of N sequences batched by the scheduler, beside one sequence
alone in the same run; and a scripted thermal trace replayed through the policy on a fake clock
(``engine.thermal.replay``).

Decode speed is measured over whole scheduler steps that do no prefill (sampling and bookkeeping included), and
also over bare ``forward`` / ``forward_batch`` calls, in wall-clock and in CPU time. Single and batched runs are
interleaved ``repeats`` times and medians reported. Nothing here asserts a time.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..backends.base import Backend
from ..model import load
from ..sampling import SamplingParams, make_sampler
from ..scheduler import Request, Scheduler
from ..thermal import Limits
from ..thermal.replay import replay_thermal_trace
from .workload import bench_prompt, set_threads

PROMPT_STRIDE = 16  # each sequence's prompt starts this many tokens later and is a few tokens shorter
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
    cache_growths: int = 0  # caches that grew inside the timed loop (their copy timed as decode): should be 0

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
    capacities = [c.capacity for c in caches]
    wall, cpu = _clocks()
    for _ in range(gen_tokens - 1):
        if len(prompts) == 1:
            logits = backend.forward(tokens, caches[0])[None, :]
        else:
            logits = backend.forward_batch(tokens, caches)
        tokens = [int(t) for t in np.argmax(logits, axis=-1)]
    wall_s, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    growths = sum(c.capacity != before for c, before in zip(caches, capacities))
    return Speed(len(prompts) * (gen_tokens - 1), wall_s, cpu_s, growths)


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
    report["forward_cache_growths"] = sum(s.cache_growths for s in runs["single_forward"] + runs["forward_batch"])
    report["ratio.decode"] = round(report["decode_tps"] / report["single_decode_tps"], 3)
    report["ratio.forward"] = round(report["forward_batch_tps"] / report["single_forward_tps"], 3)
    report["ratio.decode_per_cpu_s"] = round(report["decode_tokens_per_cpu_s"] / report["single_decode_tokens_per_cpu_s"], 3)
    return report


def run_concurrency_bench(path: Path, backend: str, threads: int | None, prompt_tokens: int, gen_tokens: int,
                          concurrency: int, repeats: int, thermal_script: Path | None = None) -> dict:
    """The report of ``python -m engine bench MODEL --concurrency N [--thermal-script FILE]``."""
    if concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
    if threads:
        set_threads(backend, threads)
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
