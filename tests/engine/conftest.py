"""Fixtures for engine tests: a tiny random-weight llama model, and a guard that bounds one case's time and memory."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from tests.engine.gguf_builders import write_tiny_llama

CASE_CPU_SECONDS = 1.0
CASE_MAX_BYTES = 200 << 20


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid tiny llama GGUF (2 layers, n_embd 64, byte-level GPT-2 vocabulary, ChatML); treat it as read-only."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny_model") / "tiny-llama.gguf")


class _CpuTimeout(BaseException):
    """Raised by the SIGPROF handler; a BaseException so no ``except Exception`` in the code under test eats it."""


def _on_cpu_timeout(signum: int, frame: Any) -> None:
    raise _CpuTimeout


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one guarded case returned or raised, and what it used."""

    value: Any
    error: Exception | None
    seconds: float  # wall time
    cpu_seconds: float  # CPU time of the process (the limit applies to this: the machine may be shared)
    peak_bytes: int  # tracemalloc peak above the level at the start (Python and NumPy allocations)
    rss_delta: int  # resident set size after minus before (memory the case kept)


class CaseGuard:
    """Runs cases one at a time, failing the test with the case's label if one exceeds its limits.

    The time limit is on CPU time, not wall time, so that other processes on a shared machine cannot fail
    a case; a CPU-time timer (SIGPROF) interrupts a runaway loop, leaving pytest-timeout's SIGALRM alone.
    Memory is measured with tracemalloc (peak) and psutil (RSS kept); a subprocess gives an honest peak
    RSS but is too slow for thousands of cases, so tests use one only for a few worst cases.
    """

    def __init__(self, max_seconds: float = CASE_CPU_SECONDS, max_bytes: int = CASE_MAX_BYTES):
        self.max_seconds, self.max_bytes = max_seconds, max_bytes
        self.worst_seconds: tuple[float, str] = (0.0, "")  # wall
        self.worst_cpu_seconds: tuple[float, str] = (0.0, "")
        self.worst_bytes: tuple[int, str] = (0, "")
        self._process = psutil.Process()

    def run(self, label: str, fn: Callable[[], Any]) -> Outcome:
        """Call ``fn`` and return its outcome; any exception it raises is returned, not propagated."""
        rss_before = self._process.memory_info().rss
        tracemalloc.reset_peak()
        traced_before = tracemalloc.get_traced_memory()[0]
        previous = signal.signal(signal.SIGPROF, _on_cpu_timeout)
        value, error, start, cpu_start = None, None, time.perf_counter(), time.process_time()
        try:
            signal.setitimer(signal.ITIMER_PROF, self.max_seconds)
            value = fn()
        except _CpuTimeout:
            pytest.fail(f"{label}: still running after {self.max_seconds} s of CPU time", pytrace=False)
        except Exception as e:  # the caller decides which exception types are acceptable
            error = e
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, previous)
        outcome = Outcome(value, error, time.perf_counter() - start, time.process_time() - cpu_start,
                          tracemalloc.get_traced_memory()[1] - traced_before,
                          self._process.memory_info().rss - rss_before)
        self._check(label, outcome)
        return outcome

    def _check(self, label: str, outcome: Outcome) -> None:
        self.worst_seconds = max(self.worst_seconds, (outcome.seconds, label))
        self.worst_cpu_seconds = max(self.worst_cpu_seconds, (outcome.cpu_seconds, label))
        self.worst_bytes = max(self.worst_bytes, (max(outcome.peak_bytes, outcome.rss_delta), label))
        if outcome.cpu_seconds > self.max_seconds:
            pytest.fail(f"{label}: took {outcome.cpu_seconds:.2f} s of CPU ({outcome.seconds:.2f} s wall; "
                        f"limit {self.max_seconds} s)", pytrace=False)
        if max(outcome.peak_bytes, outcome.rss_delta) > self.max_bytes:
            pytest.fail(f"{label}: used {outcome.peak_bytes >> 20} MB traced, {outcome.rss_delta >> 20} MB resident "
                        f"(limit {self.max_bytes >> 20} MB)", pytrace=False)


@contextlib.contextmanager
def tracing_memory() -> Iterator[None]:
    """Keep tracemalloc on for the duration (CaseGuard reads its peaks)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        yield
    finally:
        if started:
            tracemalloc.stop()


@pytest.fixture
def case_guard() -> Iterator[CaseGuard]:
    """A CaseGuard with the suite's limits (1 s of CPU, 200 MB), with tracemalloc on for the test."""
    with tracing_memory():
        yield CaseGuard()


@pytest.fixture(params=["c", "numpy"])
def implementation(request, monkeypatch):
    """Runs a test once with the CPU extension and once with the NumPy or Python code that stands in for it where it
    is not built (``backends.cpu.kernels._ext`` switched off)."""
    from engine.backends.cpu import kernels

    assert kernels.AVAILABLE, "the C extension must be built for this comparison"
    if request.param == "numpy":
        monkeypatch.setattr(kernels, "_ext", None)
    return request.param
