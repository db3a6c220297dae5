"""``python -m engine bench --backend mlx``: our MLX backend against mlx-lm's model code on the same weights.

Both run in this process on the same prompt of random token ids with greedy decoding, interleaved: prefills
in turn, then decoding in turns of SEGMENT tokens, so a change in the machine's load hits every engine alike;
medians over the repeats are reported. Ours is timed through the path the engine uses (``forward`` returning
NumPy logits, argmax on the host) and through ``decode_pipelined``; the peer through
``mlx_lm.generate.generate_step``. Prefill time is time to the first token; decode speed counts the tokens
after it.
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
        ``pipelined.prefill_tps``, ``pipelined.decode_tps`` (sampling on the device, ``decode_pipelined``),
        ``load_s``, ``peak_rss_mb``, ``mlx_active_mb``, ``gguf_mb`` and, when comparing, ``peer.prefill_tps``,
        ``peer.decode_tps``, ``ratio.prefill``, ``ratio.decode``, ``ratio.decode_pipelined`` (ours / peer;
        medians over the repeats).
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
    rates: dict[str, list[tuple[float, float]]] = {key: [] for key in engines}
    for repeat in range(repeats):
        order = list(engines)[repeat % len(engines):] + list(engines)[:repeat % len(engines)]
        for key, rate in _interleaved(order, engines, streams, prompt_tokens, gen_tokens).items():
            rates[key].append(rate)
        mx.clear_cache()
    for key, results in rates.items():
        report[f"{key}prefill_tps"] = round(statistics.median(r[0] for r in results), 2)
        report[f"{key}decode_tps"] = round(statistics.median(r[1] for r in results), 2)
    if compare:
        report["ratio.prefill"] = round(report["prefill_tps"] / report["peer.prefill_tps"], 3)
        report["ratio.decode"] = round(report["decode_tps"] / report["peer.decode_tps"], 3)
        report["ratio.decode_pipelined"] = round(report["pipelined.decode_tps"] / report["peer.decode_tps"], 3)
    report["peak_rss_mb_after_runs"] = round(_peak_rss_bytes() / 1e6, 1)
    backend.close()
    return report


def _interleaved(order: list[str], engines: dict[str, Callable[[], Iterator[int]]], streams: list,
                 prompt_tokens: int, gen_tokens: int) -> dict[str, tuple[float, float]]:
    """One repeat: every engine's prefill (to its first token), then decode turns; (prefill_tps, decode_tps) each.

    A turn ends when ``streams`` are idle: a pipelined engine's queued step is its own work, not the next one's.
    """
    steps, prefill_s, decode_s = {}, {}, dict.fromkeys(order, 0.0)
    for key in order:
        t0 = time.perf_counter()
        steps[key] = engines[key]()
        next(steps[key])
        _settle(streams)
        prefill_s[key] = time.perf_counter() - t0
    for done in range(1, gen_tokens, SEGMENT):
        for key in order:
            t0 = time.perf_counter()
            for _ in range(min(SEGMENT, gen_tokens - done)):
                next(steps[key])
            _settle(streams)
            decode_s[key] += time.perf_counter() - t0
    for generator in steps.values():
        generator.close()
    return {key: (prompt_tokens / prefill_s[key], (gen_tokens - 1) / decode_s[key]) for key in order}


def _settle(streams: list) -> None:
    for stream in streams:
        mx.synchronize(stream)


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


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
