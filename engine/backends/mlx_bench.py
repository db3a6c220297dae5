"""``python -m engine bench --backend mlx``: our MLX backend against mlx-lm's model code on the same weights.

Both run in this process on the same prompt of random token ids with greedy decoding, interleaved: prefills
in turn, then decoding in turns of SEGMENT tokens, so a change in the machine's load hits every engine alike;
medians over the repeats are reported. Ours is timed through the engine's host path (``forward`` returning
NumPy logits, argmax on the host: what sampling and penalties use) and through ``decode_pipelined`` (what
``Model`` uses for greedy decoding without penalties, via ``MlxBackend.greedy_step``); the peer through
``mlx_lm.generate.generate_step``. Prefill time is time to the first token; decode speed counts the tokens
after it. Every rate is also given per second of this process's CPU time (``*_cpu_tps``): MLX's CPU kernels
run on its worker threads, so that clock counts the engines' own work and not the other processes of a
shared machine, which is what decides whether our code adds work over mlx-lm's.

Memory is measured before the peer exists: RSS before the backend's load (the Python runtime, MLX and the
parsed GGUF metadata, vocabulary included), after it, and the peak through it; ``peak_rss_mb_after_runs``
includes the peer's modules (which hold our arrays, not copies) and both engines' KV caches.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np
import psutil

from ..config import ModelConfig
from ..gguf_file import read_gguf
from .mlx_backend import MlxBackend


SEGMENT = 16  # decode tokens per engine turn: short turns cancel the drift of a shared machine's load


def run_mlx_bench(model_path: str | os.PathLike, prompt_tokens: int = 512, gen_tokens: int = 128, compare: bool = True,
                  repeats: int = 3) -> dict:
    """Benchmark the MLX backend on ``model_path``; with ``compare``, also mlx-lm on the same weights.

    Each repeat prefills the prompt with every engine in turn (the order rotates between repeats), then
    decodes ``gen_tokens`` with them taking turns of SEGMENT tokens; each engine is timed on its own turns.

    Returns:
        A flat dict: ``prefill_tps``, ``decode_tps`` (the engine's path: NumPy logits per token),
        ``pipelined.prefill_tps``, ``pipelined.decode_tps`` (sampling on the device, ``decode_pipelined``), the
        same per CPU second (``prefill_cpu_tps``, ``decode_cpu_tps``, ...), ``load_s``, ``gguf_mb``,
        ``rss_before_load_mb``, ``rss_after_load_mb``, ``peak_rss_mb`` (through the load), ``mlx_active_mb``,
        their ratios to the file size (``*_per_gguf``) and, when comparing, the ``peer.`` rates and
        ``ratio.prefill``, ``ratio.decode``, ``ratio.decode_pipelined`` and their ``_cpu`` twins (ours / peer;
        medians over the repeats).
    """
    if prompt_tokens < 1 or gen_tokens < 2 or repeats < 1:
        raise ValueError("need prompt_tokens >= 1, gen_tokens >= 2 and repeats >= 1")
    gguf = read_gguf(model_path)
    rss_before = _rss_bytes()
    start = time.perf_counter()
    backend = MlxBackend(gguf, ModelConfig.from_gguf(gguf))
    report = {"model": gguf.path.name, "device": str(mx.default_device()),
              "load_s": round(time.perf_counter() - start, 3), **_load_memory(gguf.file_size, rss_before),
              "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "repeats": repeats}
    prompt = np.random.default_rng(0).integers(0, backend.config.n_vocab, prompt_tokens).tolist()
    engines: dict[str, Callable[[], Iterator[int]]] = {
        "": lambda: _ours(backend, prompt, gen_tokens),
        "pipelined.": lambda: _ours_pipelined(backend, prompt, gen_tokens),
    }
    streams = [mx.default_stream(mx.default_device())]
    if compare:
        from mlx_lm.generate import generation_stream

        from .mlx.peer import build_peer
        peer = build_peer(backend)
        engines["peer."] = lambda: _peer(peer, prompt, gen_tokens)
        streams.append(generation_stream)
    rates: dict[str, list[dict[str, float]]] = {key: [] for key in engines}
    for repeat in range(repeats):
        order = list(engines)[repeat % len(engines):] + list(engines)[:repeat % len(engines)]
        for key, rate in _interleaved(order, engines, streams, prompt_tokens, gen_tokens).items():
            rates[key].append(rate)
        mx.clear_cache()
    for key, results in rates.items():
        for name in results[0]:
            report[f"{key}{name}"] = round(statistics.median(r[name] for r in results), 3)
    if compare:
        report.update(_ratios(report))
    report["peak_rss_mb_after_runs"] = round(_peak_rss_bytes() / 1e6, 1)
    backend.close()
    return report


def _interleaved(order: list[str], engines: dict[str, Callable[[], Iterator[int]]], streams: list,
                 prompt_tokens: int, gen_tokens: int) -> dict[str, dict[str, float]]:
    """One repeat: every engine's prefill (to its first token), then decode turns; each engine's rates.

    A turn ends when ``streams`` are idle: a pipelined engine's queued step is its own work, not the next one's.
    The step a pipelined engine queues with its first token is timed in neither phase: its decode turns then
    compute ``gen_tokens - 1`` steps, as the one-token-at-a-time engine's do.
    """
    steps, prefill, decode = {}, {}, {key: np.zeros(2) for key in order}
    for key in order:
        t0 = _clocks()
        steps[key] = engines[key]()
        next(steps[key])
        prefill[key] = _clocks() - t0
        _settle(streams)
    for done in range(1, gen_tokens, SEGMENT):
        for key in order:
            t0 = _clocks()
            for _ in range(min(SEGMENT, gen_tokens - done)):
                next(steps[key])
            _settle(streams)
            decode[key] += _clocks() - t0
    for generator in steps.values():
        generator.close()
    return {key: {"prefill_tps": prompt_tokens / prefill[key][0], "decode_tps": (gen_tokens - 1) / decode[key][0],
                  "prefill_cpu_tps": prompt_tokens / prefill[key][1],
                  "decode_cpu_tps": (gen_tokens - 1) / decode[key][1]} for key in order}


def _clocks() -> np.ndarray:
    """(wall seconds, CPU seconds of this process, MLX's worker threads included)."""
    return np.array([time.perf_counter(), time.process_time()])


def _ratios(report: dict) -> dict[str, float]:
    """Ours / peer for each rate, by the wall clock and (``_cpu``) by CPU time."""
    out = {}
    for clock in ("", "_cpu"):
        peer_prefill, peer_decode = report[f"peer.prefill{clock}_tps"], report[f"peer.decode{clock}_tps"]
        out[f"ratio.prefill{clock}"] = round(report[f"prefill{clock}_tps"] / peer_prefill, 3)
        out[f"ratio.decode{clock}"] = round(report[f"decode{clock}_tps"] / peer_decode, 3)
        out[f"ratio.decode_pipelined{clock}"] = round(report[f"pipelined.decode{clock}_tps"] / peer_decode, 3)
    return out


def _load_memory(gguf_bytes: int, rss_before: int) -> dict[str, float]:
    """Resident memory around the backend's load (before any peer exists), in MB and per byte of the GGUF file."""
    rss_after, peak, active = _rss_bytes(), _peak_rss_bytes(), mx.get_active_memory()
    return {"gguf_mb": round(gguf_bytes / 1e6, 1), "rss_before_load_mb": round(rss_before / 1e6, 1),
            "rss_after_load_mb": round(rss_after / 1e6, 1), "peak_rss_mb": round(peak / 1e6, 1),
            "mlx_active_mb": round(active / 1e6, 1), "peak_rss_per_gguf": round(peak / gguf_bytes, 3),
            "load_rss_growth_per_gguf": round((rss_after - rss_before) / gguf_bytes, 3),
            "mlx_active_per_gguf": round(active / gguf_bytes, 3)}


def _settle(streams: list) -> None:
    for stream in streams:
        mx.synchronize(stream)


def _rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def _peak_rss_bytes() -> int:
    """The peak RSS so far; Linux updates the high-water mark lazily, so it can trail the current RSS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(_rss_bytes(), peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def _ours(backend: MlxBackend, prompt: list[int], gen_tokens: int) -> Iterator[int]:
    """The engine's path: forward -> NumPy logits -> argmax on the host, one token at a time."""
    cache = backend.new_cache(len(prompt) + gen_tokens)
    token = int(np.argmax(backend.forward(prompt, cache)))
    while True:
        yield token
        token = int(np.argmax(backend.forward([token], cache)))


def _ours_pipelined(backend: MlxBackend, prompt: list[int], gen_tokens: int) -> Iterator[int]:
    """Greedy decoding on the device, the next step queued before the current token is read."""
    cache = backend.new_cache(len(prompt) + gen_tokens + 1)
    for token, _ in backend.decode_pipelined(prompt, cache, lambda logits: mx.argmax(logits, axis=-1)):
        yield token


def _peer(model, prompt: list[int], gen_tokens: int) -> Iterator[int]:
    from mlx_lm.generate import generate_step

    for token, _ in generate_step(mx.array(prompt), model, max_tokens=gen_tokens,
                                  sampler=lambda logprobs: mx.argmax(logprobs, axis=-1)):
        yield token
