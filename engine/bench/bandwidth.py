"""This machine's read bandwidth, STREAM-like, and what it means for decode: the bytes a token reads.

The pass sums a buffer several times larger than the last-level cache, split over the same number of threads
as the engine decodes with. It runs in NumPy (``np.add.reduce`` over int64 words, which releases the GIL, one
slice per thread): the C extension has no bare read loop, and a sum does a trivial amount of work per byte.
The best of several passes is reported: bandwidth is a ceiling, and a neighbour can only lower a pass. The speed
bench takes passes after every round of its runs as well as at the end (``merge_measurements``): on this kind of
shared host the figure moves by a factor of up to two from one minute to the next.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from ..memory_estimate import EXPERT_TENSOR_SUFFIXES

MIN_BUFFER_BYTES = 256 * 2**20


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache's size from sysfs (Linux), or None where it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes) if sizes else None


def measure_read_bandwidth(threads: int, passes: int = 5, buffer_bytes: int | None = None) -> dict:
    """Read bandwidth in GB/s (10**9 bytes per second) with ``threads`` threads.

    Returns:
        ``gbps`` (best pass), ``gbps_median``, ``buffer_mb``, ``threads``, ``passes`` and ``method``.
    """
    llc = last_level_cache_bytes()
    size = buffer_bytes or max(MIN_BUFFER_BYTES, 4 * (llc or 0))
    words = np.ones(size // 8, np.int64)  # written once, so every page is really there
    slices = np.array_split(words, threads)
    rates = []
    for _ in range(passes):
        workers = [threading.Thread(target=np.add.reduce, args=(part,)) for part in slices]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        rates.append(words.nbytes / (time.perf_counter() - start) / 1e9)
    return {"gbps": round(max(rates), 2), "gbps_median": round(float(np.median(rates)), 2),
            "buffer_mb": round(words.nbytes / 2**20), "last_level_cache_mb": round(llc / 2**20, 1) if llc else None,
            "threads": threads, "passes": passes, "method": "numpy np.add.reduce over int64, one slice per thread",
            "rates": [round(r, 2) for r in rates]}


def merge_measurements(measurements: list[dict]) -> dict:
    """One figure from passes taken at several moments of a run (``measure_read_bandwidth`` results): the best
    pass over all of them and the median pass, with every pass's rate. On a machine whose bandwidth moves from
    minute to minute (a shared host), passes spread through the run bound the decode better than passes taken
    once."""
    rates = [r for m in measurements for r in m["rates"]]
    return {**measurements[-1], "gbps": max(rates), "gbps_median": round(float(np.median(rates)), 2),
            "passes": len(rates), "moments": len(measurements), "rates": rates}


def weight_bytes_per_token(gguf: GGUFFile, config: ModelConfig | None = None) -> int:
    """The weight bytes one decode step reads: every tensor once, but of the embedding table only one row
    (unless the output matrix is the embedding table itself), and of a mixture of experts' expert tensors
    (``config`` given) only ``n_expert_used`` of ``n_expert`` experts' rows."""
    tied = "output.weight" not in gguf.tensors
    moe = config is not None and config.is_moe
    total = 0
    for name, info in gguf.tensors.items():
        nbytes = gguf.raw(name).nbytes
        if name == "token_embd.weight" and not tied:
            nbytes //= gguf.raw(name).shape[0]
        if moe and name.endswith(EXPERT_TENSOR_SUFFIXES):
            nbytes = nbytes * config.n_expert_used // config.n_expert
        total += nbytes
    return total
