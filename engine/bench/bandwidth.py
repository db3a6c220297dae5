"""This machine's read bandwidth, STREAM-like, and what it means for decode: the bytes a token reads.

The pass sums a buffer several times larger than the last-level cache, split over the same number of threads
as the engine decodes with, one slice per thread, in two ways taken in turn: NumPy's ``np.add.reduce`` over
int64 words, and the C kernels' bare read loop (``kernels.read_words``), which prefetches the stream ahead as the
decode's products do where the CPU needs it (on an Intel Xeon the hardware prefetcher alone left NumPy's pass at
15.6-19.4 GB/s while the products read up to 22 and the C loop 20.9-24.0). Both release the GIL and do a trivial
amount of work per byte; the ceiling is the best pass of either, so a reader that leaves bandwidth unused cannot
lower it.

Python threads start milliseconds apart (each waits for the GIL in turn), so a pass timed from the first start
to the last end counts part of the time with one thread reading alone: on a 2-core host that under-read two
threads by up to 40 % (37.5 against 58.4 GB/s, back to back). So each thread reads its slice a few times over in
``CHUNK_BYTES`` pieces, timing every piece, and the pass is the sum of the threads' rates over the pieces that
lie wholly inside the window when all of them were reading (``concurrent_read_rate``).

The best of several passes is reported: bandwidth is a ceiling, and a neighbour can only lower a pass. The speed
bench takes passes after every round of its runs as well as at the end (``merge_measurements``): on a shared
host the figure also moves from one minute to the next.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from ..backends.cpu import kernels
from ..config import ModelConfig
from ..gguf_file import GGUFFile
from ..memory_estimate import EXPERT_TENSOR_SUFFIXES

MIN_BUFFER_BYTES = 256 * 2**20
CHUNK_BYTES = 32 * 2**20  # a timed piece of a thread's slice
ROUNDS = 4  # times each thread reads its slice in a pass: enough that the threads' start skew is a small part


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache's size from sysfs (Linux), or None where it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes) if sizes else None


def measure_read_bandwidth(threads: int, passes: int = 5, buffer_bytes: int | None = None) -> dict:
    """Read bandwidth in GB/s (10**9 bytes per second) with ``threads`` threads, the readers taking passes in turn.

    Returns:
        ``gbps`` (best pass), ``gbps_median``, ``buffer_mb``, ``threads``, ``passes``, ``method``, every pass's
        ``rates`` and the same per reader (``rates_by_reader``).
    """
    llc = last_level_cache_bytes()
    size = buffer_bytes or max(MIN_BUFFER_BYTES, 4 * (llc or 0))
    words = np.ones(size // 8, np.int64)  # written once, so every page is really there
    pieces = [np.array_split(part, max(1, part.nbytes // CHUNK_BYTES)) for part in np.array_split(words, threads)]
    names = ["numpy", "kernels"] if kernels.AVAILABLE else ["numpy"]
    rates = [_one_pass(pieces, READERS[names[i % len(names)]]) for i in range(passes)]  # a neighbour weighs on both
    return {"gbps": round(max(rates), 2), "gbps_median": round(float(np.median(rates)), 2),
            "buffer_mb": round(words.nbytes / 2**20), "last_level_cache_mb": round(llc / 2**20, 1) if llc else None,
            "threads": threads, "passes": passes, "method": _method(names),
            "rates": [round(r, 2) for r in rates],
            "rates_by_reader": {name: [round(r, 2) for r in rates[k::len(names)]] for k, name in enumerate(names)}}


READERS = {"numpy": np.add.reduce, "kernels": kernels.read_words}


def _method(names: list[str]) -> str:
    ahead = kernels.stream_prefetch()
    readers = {"numpy": "numpy np.add.reduce over int64",
               "kernels": f"the C kernels' read loop (stream prefetched {ahead} bytes ahead into L1, {4 * ahead} "
                          "into L2)"}
    return (f"{' and '.join(readers[n] for n in names)} in turn, one slice per thread read {ROUNDS} times in timed "
            f"{CHUNK_BYTES >> 20} MiB pieces, summed over the window when every thread reads; the best pass")


def _one_pass(pieces: list[list[np.ndarray]], reader) -> float:
    """GB/s of one pass: each thread reads its pieces ``ROUNDS`` times over with ``reader``, recording every
    piece's span."""
    spans: list[list[tuple[float, float, int]]] = [[] for _ in pieces]

    def read(mine: list[np.ndarray], out: list[tuple[float, float, int]]) -> None:
        for _ in range(ROUNDS):
            for piece in mine:
                start = time.perf_counter()
                reader(piece)
                out.append((start, time.perf_counter(), piece.nbytes))

    workers = [threading.Thread(target=read, args=(mine, out)) for mine, out in zip(pieces, spans, strict=True)]
    first = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return concurrent_read_rate(spans, fallback_seconds=time.perf_counter() - first)


def concurrent_read_rate(spans: list[list[tuple[float, float, int]]], fallback_seconds: float) -> float:
    """The threads' summed read rate (GB/s) over the window when all of them were reading: from the last
    thread's first piece to the first thread's last one, each thread's rate over its pieces wholly inside. Where
    a thread has no piece inside (the threads barely overlapped), every byte over ``fallback_seconds``: a figure
    that can only be low."""
    opens, closes = max(s[0][0] for s in spans), min(s[-1][1] for s in spans)
    total = 0.0
    for own in spans:
        inside = [(a, b, n) for a, b, n in own if a >= opens and b <= closes]
        if not inside:
            return sum(n for own in spans for _, _, n in own) / fallback_seconds / 1e9
        total += sum(n for _, _, n in inside) / (inside[-1][1] - inside[0][0])
    return total / 1e9


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
