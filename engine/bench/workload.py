"""What every bench shares: the prompt it feeds, the thread count it sets, memory readings and run statistics."""

from __future__ import annotations

import resource
import statistics
import sys

import psutil

from ..model import Model

BENCH_TEXT = (
    "The history of computing is a story of ideas that moved from the laboratory to the kitchen table. "
    "Early machines filled rooms, drew kilowatts and were programmed with cables and switches; within a few "
    "decades the same arithmetic ran on chips smaller than a fingernail. Language models follow the same path: "
    "what needed a data centre now runs on a laptop, if the software respects the memory and the heat of the "
    "machine it runs on. "
)


def bench_prompt(model: Model, n_tokens: int) -> list[int]:
    """``n_tokens`` ids of ordinary English prose (repeated as needed)."""
    ids = model.tokenize(BENCH_TEXT * (n_tokens // 40 + 1), add_special=False)
    return ids[:n_tokens]


def set_threads(backend: str, threads: int) -> None:
    """Size the C kernels' thread pool (the backends that use it: cpu, and auto when it resolves to cpu)."""
    if backend in ("cpu", "auto"):
        from ..backends.cpu import kernels
        if kernels.AVAILABLE:
            kernels.set_threads(threads)


def threads_in_use(backend: str, threads: int | None) -> int:
    """The thread count our engine computes with: ``threads`` when given, else the C kernels' pool size."""
    if threads:
        return threads
    if backend in ("cpu", "auto"):
        from ..backends.cpu import kernels
        if kernels.AVAILABLE:
            return kernels.get_threads()
    return psutil.cpu_count(logical=False) or 1


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def spread(values: list[float], digits: int = 2) -> dict:
    """``median``, ``min``, ``max`` and every run of a list of rates."""
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "runs": [round(v, digits) for v in values]}


def first_divergence(ours: list[int], theirs: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length if one is a prefix), or None."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))
