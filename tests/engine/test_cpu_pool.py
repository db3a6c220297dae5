"""The C thread pool's spin policy (pool.c), read from the kernel's per-thread counters, not from wall-clock times.

Between two decode steps the host samples the next token (a few hundred microseconds on a loaded machine); a worker
that fell asleep in that gap costs a wake-up (slow in a VM) at the start of the next step. While jobs stream the
worker must stay awake across such gaps, and once the jobs stop it must go to sleep instead of burning a core.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from engine.backends.cpu import kernels

TASKS = Path("/proc/self/task")
STEPS = 60
HOST_GAP_S = 1e-3  # the host's work between two steps (at most): 10 times the short spin, half the linger


def _tids() -> set[str]:
    return set(os.listdir(TASKS))


def _sleeps(tid: str) -> int:
    """How often thread ``tid`` blocked (voluntary context switches: a sleep on the pool's condition)."""
    for line in (TASKS / tid / "status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches in /proc/self/task/{tid}/status")


def _busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.fixture
def one_worker():
    """A pool of 2 threads (the caller and one new worker); yields the worker's thread id."""
    before = kernels.get_threads()
    kernels.set_threads(1)
    existing = _tids()
    kernels.set_threads(2)
    new = _tids() - existing
    assert len(new) == 1, f"set_threads(2) started {len(new)} threads"
    try:
        yield new.pop()
    finally:
        kernels.set_threads(before)


def _weights():
    rng = np.random.default_rng(7)
    w = quantize(rng.standard_normal((512, 256)).astype(np.float32), GGMLQuantizationType.Q8_0)
    return w, rng.standard_normal((1, 256)).astype(np.float32)


def test_worker_stays_awake_between_streaming_jobs(one_worker):
    w, x = _weights()
    for _ in range(5):  # the stream starts: the first gaps may still use the short spin
        kernels.matmul(w, GGMLQuantizationType.Q8_0, x)
        _busy_wait(HOST_GAP_S)
    before = _sleeps(one_worker)
    for _ in range(STEPS):
        kernels.matmul(w, GGMLQuantizationType.Q8_0, x)
        _busy_wait(HOST_GAP_S)
    slept = _sleeps(one_worker) - before
    # with a 100 us spin it slept in nearly every gap; a loaded machine may still deschedule the host for longer
    # than the linger now and then
    assert slept < STEPS // 3, f"the worker slept {slept} times in {STEPS} gaps of {HOST_GAP_S * 1e6:.0f} us"


def test_idle_pool_sleeps_instead_of_spinning(one_worker):
    w, x = _weights()
    for _ in range(20):  # a stream of jobs: the worker lingers after the last one
        kernels.matmul(w, GGMLQuantizationType.Q8_0, x)
    start = time.process_time()
    time.sleep(0.3)  # this thread sleeps: the process's CPU time is the worker's
    spent = time.process_time() - start
    assert spent < 0.05, f"the idle worker used {spent * 1e3:.0f} ms of CPU in 300 ms"
    assert _sleeps(one_worker) > 0
