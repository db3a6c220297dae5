"""``python -m engine bench --backend mlx``: our MLX backend against mlx-lm's model code on the same weights.

Both run in this process, interleaved (the order rotates from one repeat to the next), on the same prompt of
random token ids with greedy decoding, and the medians are reported. Ours is timed through the path the engine uses
(``forward`` returning NumPy logits, argmax on the host); the peer through ``mlx_lm.generate.generate_step``.
Prefill time is time to the first token; decode speed counts the tokens after it.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from ..config import ModelConfig
from ..gguf_file import read_gguf
from .mlx_backend import MlxBackend


def run_mlx_bench(model_path: str | os.PathLike, prompt_tokens: int = 512, gen_tokens: int = 128, compare: bool = True,
                  repeats: int = 3) -> dict:
    """Benchmark the MLX backend on ``model_path``; with ``compare``, also mlx-lm on the same weights.

    Returns:
        A flat dict: ``prefill_tps``, ``decode_tps``, ``decode_pipelined_tps``, ``load_s``, ``peak_rss_mb``,
        ``mlx_active_mb``, ``gguf_mb`` and, when comparing, ``peer.prefill_tps``, ``peer.decode_tps``,
        ``ratio.prefill``, ``ratio.decode`` (ours / peer, medians of interleaved runs).
    """
    if prompt_tokens < 1 or gen_tokens < 2 or repeats < 1:
        raise ValueError("need prompt_tokens >= 1, gen_tokens >= 2 and repeats >= 1")
    gguf = read_gguf(model_path)
    start = time.perf_counter()
    backend = MlxBackend(gguf, ModelConfig.from_gguf(gguf))
    report = {"model": gguf.path.name, "device": str(mx.default_device()),
              "load_s": round(time.perf_counter() - start, 3), "peak_rss_mb": round(_peak_rss_bytes() / 1e6, 1),
              "mlx_active_mb": round(mx.get_active_memory() / 1e6, 1), "gguf_mb": round(gguf.file_size / 1e6, 1),
              "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "repeats": repeats}
    prompt = np.random.default_rng(0).integers(0, backend.config.n_vocab, prompt_tokens).tolist()
    runners: dict[str, Callable[[], tuple[float, float]]] = {
        "": lambda: _run_ours(backend, prompt, gen_tokens),
        "pipelined.": lambda: _run_ours_pipelined(backend, prompt, gen_tokens),
    }
    if compare:
        from .mlx.peer import build_peer
        peer = build_peer(backend)
        runners["peer."] = lambda: _run_peer(peer, prompt, gen_tokens)
    runs: dict[str, list[tuple[float, float]]] = {key: [] for key in runners}
    order = list(runners)
    for repeat in range(repeats):
        for key in order[repeat % len(order):] + order[:repeat % len(order)]:  # rotate: no engine always goes first
            runs[key].append(runners[key]())
            mx.clear_cache()
    for key, results in runs.items():
        report[f"{key}prefill_tps"] = round(statistics.median(r[0] for r in results), 2)
        report[f"{key}decode_tps"] = round(statistics.median(r[1] for r in results), 2)
    if compare:
        report["ratio.prefill"] = round(report["prefill_tps"] / report["peer.prefill_tps"], 3)
        report["ratio.decode"] = round(report["decode_tps"] / report["peer.decode_tps"], 3)
    report["peak_rss_mb_after_runs"] = round(_peak_rss_bytes() / 1e6, 1)
    backend.close()
    return report


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _rates(n_prompt: int, n_gen: int, t0: float, t_first: float, t_end: float) -> tuple[float, float]:
    return n_prompt / (t_first - t0), (n_gen - 1) / (t_end - t_first)


def _run_ours(backend: MlxBackend, prompt: list[int], gen_tokens: int) -> tuple[float, float]:
    """The engine's path: forward -> NumPy logits -> argmax, one token at a time."""
    cache = backend.new_cache(len(prompt) + gen_tokens)
    t0 = time.perf_counter()
    token = int(np.argmax(backend.forward(prompt, cache)))
    t_first = time.perf_counter()
    for _ in range(gen_tokens - 1):
        token = int(np.argmax(backend.forward([token], cache)))
    return _rates(len(prompt), gen_tokens, t0, t_first, time.perf_counter())


def _run_ours_pipelined(backend: MlxBackend, prompt: list[int], gen_tokens: int) -> tuple[float, float]:
    """Greedy decoding on the device, the next step queued before the current token is read."""
    cache = backend.new_cache(len(prompt) + gen_tokens)
    t0 = time.perf_counter()
    steps = backend.decode_pipelined(prompt, cache, lambda logits: mx.argmax(logits, axis=-1))
    next(steps)
    t_first = time.perf_counter()
    for _ in range(gen_tokens - 1):
        next(steps)
    t_end = time.perf_counter()
    steps.close()
    return _rates(len(prompt), gen_tokens, t0, t_first, t_end)


def _run_peer(model, prompt: list[int], gen_tokens: int) -> tuple[float, float]:
    from mlx_lm.generate import generate_step

    t0 = time.perf_counter()
    steps = generate_step(mx.array(prompt), model, max_tokens=gen_tokens, sampler=lambda lp: mx.argmax(lp, axis=-1))
    next(steps)
    t_first = time.perf_counter()
    for _ in range(gen_tokens - 1):
        next(steps)
    t_end = time.perf_counter()
    steps.close()
    return _rates(len(prompt), gen_tokens, t0, t_first, t_end)
