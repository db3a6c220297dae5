"""Benchmarks that print numbers: prefill and decode tokens/sec, load time and memory, beside a peer engine.

Ours and the peer run in the same process on the same GGUF and the same token ids, interleaved run by run,
and the report gives medians and ratios (ours / peer). Nothing here asserts a time.
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import psutil

from .model import Model, load

BENCH_TEXT = (
    "The history of computing is a story of ideas that moved from the laboratory to the kitchen table. "
    "Early machines filled rooms, drew kilowatts and were programmed with cables and switches; within a few "
    "decades the same arithmetic ran on chips smaller than a fingernail. Language models follow the same path: "
    "what needed a data centre now runs on a laptop, if the software respects the memory and the heat of the "
    "machine it runs on. "
)


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def bench_prompt(model: Model, n_tokens: int) -> list[int]:
    """``n_tokens`` ids of ordinary English prose (repeated as needed)."""
    ids = model.tokenize(BENCH_TEXT * (n_tokens // 40 + 1), add_special=False)
    return ids[:n_tokens]


class Runner(Protocol):
    """One engine under test: ``prefill(ids)`` returns the first greedy token, ``decode(first, n)`` n more."""

    name: str

    def prefill(self, ids: list[int]) -> int: ...

    def decode(self, first: int, n: int) -> None: ...


class HearthRunner:
    def __init__(self, model: Model, n_ctx: int):
        self.name, self.model, self.n_ctx, self.cache = "hearth", model, n_ctx, None

    def prefill(self, ids: list[int]) -> int:
        self.cache = self.model.backend.new_cache(self.n_ctx)
        logits = self.model.backend.forward(ids, self.cache)
        return int(np.argmax(logits))

    def decode(self, first: int, n: int) -> None:
        token = first
        for _ in range(n):
            token = int(np.argmax(self.model.backend.forward([token], self.cache)))


class LlamaCppRunner:
    def __init__(self, path: Path, n_ctx: int, threads: int):
        import llama_cpp  # optional extra: pip install .[bench]

        self.name = "llama.cpp"
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   n_batch=512, n_ubatch=512, verbose=False)
        self._llama_cpp, self.n_vocab = llama_cpp, self.llm.n_vocab()

    def _last_logits(self) -> np.ndarray:
        # llama-cpp-python >= 0.3 no longer copies logits into Llama.scores unless logits_all is set
        return np.ctypeslib.as_array(self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))

    def prefill(self, ids: list[int]) -> int:
        self.llm.reset()
        self.llm.eval(ids)
        return int(np.argmax(self._last_logits()))

    def decode(self, first: int, n: int) -> None:
        token = first
        for _ in range(n):
            self.llm.eval([token])
            token = int(np.argmax(self._last_logits()))


def _timed(fn: Callable, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def measure(runners: list[Runner], ids: list[int], gen_tokens: int, repeats: int) -> dict[str, dict[str, float]]:
    """Interleave the runners ``repeats`` times; median prefill and decode tokens/sec for each."""
    samples = {r.name: {"prefill": [], "decode": []} for r in runners}
    for _ in range(repeats):
        for r in runners:
            first, t_prefill = _timed(r.prefill, ids)
            _, t_decode = _timed(r.decode, first, gen_tokens)
            samples[r.name]["prefill"].append(len(ids) / t_prefill)
            samples[r.name]["decode"].append(gen_tokens / t_decode)
    return {name: {"prefill_tps": statistics.median(s["prefill"]), "decode_tps": statistics.median(s["decode"]),
                   "prefill_runs": [round(v, 2) for v in s["prefill"]], "decode_runs": [round(v, 2) for v in s["decode"]]}
            for name, s in samples.items()}


def run_bench(path: Path, backend: str, threads: int | None, prompt_tokens: int, gen_tokens: int,
              compare: str | None, repeats: int) -> dict:
    """The ``python -m engine bench`` report as a dict."""
    if threads:
        _set_threads(backend, threads)
    n_ctx = prompt_tokens + gen_tokens + 8
    gc.collect()
    rss_before = rss_mb()
    model, load_s = _timed(load, path, backend, n_ctx)
    report = {
        "model": model.name, "file": str(path), "file_mb": round(path.stat().st_size / 2**20, 1),
        "backend": model.backend.name, "threads": threads, "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens,
        "repeats": repeats, "load_s": round(load_s, 3), "rss_after_load_mb": round(rss_mb(), 1),
        "rss_growth_mb": round(rss_mb() - rss_before, 1), "notices": model.notices,
    }
    ids = bench_prompt(model, prompt_tokens)
    runners: list[Runner] = [HearthRunner(model, n_ctx)]
    runners[0].decode(runners[0].prefill(ids), 4)  # touch every weight page before measuring memory
    report["peak_rss_mb"] = round(peak_rss_mb(), 1)
    report["rss_after_run_mb"] = round(rss_mb(), 1)
    if compare == "llama.cpp":
        runners.append(LlamaCppRunner(path, n_ctx, threads or psutil.cpu_count(logical=False) or 1))
    results = measure(runners, ids, gen_tokens, repeats)
    report.update(results["hearth"])
    if compare:
        peer = results[runners[1].name]
        report.update({f"peer.{k}": v for k, v in peer.items()})
        report["peer.name"] = runners[1].name
        report["ratio.prefill"] = round(report["prefill_tps"] / peer["prefill_tps"], 3)
        report["ratio.decode"] = round(report["decode_tps"] / peer["decode_tps"], 3)
    return report


def _set_threads(backend: str, threads: int) -> None:
    if backend in ("cpu", "auto"):
        from .backends.cpu import kernels
        if kernels.AVAILABLE:
            kernels.set_threads(threads)


def run_session_bench(path: Path, backend: str, n_tokens: int, repeats: int) -> dict:
    """Restoring a snapshot of ``n_tokens`` against processing the same tokens again (medians)."""
    import tempfile

    model = load(path, backend, n_tokens + 16)
    ids = bench_prompt(model, n_tokens)
    reprocess, restore = [], []
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(tmp) / "bench.hearth"
        for _ in range(repeats):
            model._cache, model._tokens = None, []
            _, seconds = _timed(model.next_token_logits, ids)
            reprocess.append(seconds)
            model.save_session(snapshot)
            _, seconds = _timed(model.load_session, snapshot)
            restore.append(seconds)
        size_mb = snapshot.stat().st_size / 2**20
    report = {"model": model.name, "backend": model.backend.name, "tokens": len(ids), "repeats": repeats,
              "reprocess_s": round(statistics.median(reprocess), 4), "restore_s": round(statistics.median(restore), 4),
              "snapshot_mb": round(size_mb, 1)}
    report["ratio.restore_speedup"] = round(report["reprocess_s"] / report["restore_s"], 1)
    return report
