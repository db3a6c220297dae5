"""``python -m engine bench MODEL --backend mlx``: our MLX backend against mlx-lm's model code on the same weights.

Both run in this process on the same prompt of random token ids with greedy decoding, interleaved: prefills
in turn, then decoding in turns of SEGMENT tokens, so a change in the machine's load hits every engine alike;
medians over the repeats are reported. Ours is timed as the engine decodes greedily, which is the peer's job:
``decode_pipelined`` with the argmax on the device (what ``Model`` uses for greedy decoding without penalties,
via ``MlxBackend.greedy_step``), and, under ``host.``, through the host path (``forward`` returning NumPy
logits, argmax on the host: what sampling with penalties uses); the peer through
``mlx_lm.generate.generate_step``. Prefill time is time to the first token; decode speed counts the tokens
after it. Every rate is also given per second of this process's CPU time (``*_cpu_tps``): MLX's CPU kernels
run on its worker threads, so that clock counts the engines' own work and not the other processes of a
shared machine, which is what decides whether our code adds work over mlx-lm's.

Memory is measured in fresh processes, one per engine, so neither the other engine nor the timed runs
count: RSS once the runtime and MLX are up (``rss_before_load_mb``), after reading the GGUF and loading the
backend (``rss_after_load_mb``), the process's peak through it (``peak_rss_mb``: VmHWM on Linux, ru_maxrss
elsewhere) and MLX's active memory (``mlx_active_mb``). ``with_tokenizer.*`` is the same for the engine's
whole model (tokenizer and chat template too, after a first encode); ``peer.*`` for mlx-lm's model built on
the loaded backend (its arrays, not copies, plus mlx-lm's modules). ``peak_rss_mb_after_runs`` is this
process's peak after the timed runs: both engines and their KV caches.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np
import psutil

from ..backends.mlx_backend import MlxBackend
from ..config import ModelConfig
from ..gguf_file import read_gguf


PEER_CHECK_TOKENS = 24  # prompt positions whose logits are compared with the peer's
SEGMENT = 16  # decode tokens per engine turn: short turns cancel the drift of a shared machine's load
LOADS = {"": "backend", "with_tokenizer.": "model", "peer.": "peer"}  # report prefix -> what a fresh process loads
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where ``import engine`` resolves, for the child processes


def run_mlx_bench(model_path: str | os.PathLike, prompt_tokens: int = 512, gen_tokens: int = 128, compare: bool = True,
                  repeats: int = 3, memory: bool = True) -> dict:
    """Benchmark the MLX backend on ``model_path``; with ``compare``, also mlx-lm on the same weights.

    Each repeat prefills the prompt with every engine in turn (the order rotates between repeats), then
    decodes ``gen_tokens`` with them taking turns of SEGMENT tokens; each engine is timed on its own turns.

    Returns:
        A flat dict: ``prefill_tps``, ``decode_tps`` (greedy decoding as the engine runs it: the argmax on the
        device, ``decode_pipelined``), ``host.prefill_tps``, ``host.decode_tps`` (the host path: NumPy logits
        per token), the same per CPU second (``prefill_cpu_tps``, ``decode_cpu_tps``, ...), ``load_s``,
        ``gguf_mb``, the load's memory (``load_memory``; left out when not ``memory``) for the backend, ``with_tokenizer.`` for the engine's
        whole model and, when comparing, ``peer.`` for mlx-lm's, and then the ``peer.`` rates and
        ``ratio.prefill``, ``ratio.decode``, ``ratio.decode_host`` and their ``_cpu`` twins (ours / peer;
        medians over the repeats); ``host.same_tokens`` and ``peer.same_tokens`` (the greedy tokens of the last
        repeat equal ours) and ``peer.max_abs_logit_diff`` (our prompt logits against the peer's).
    """
    if prompt_tokens < 1 or gen_tokens < 2 or repeats < 1:
        raise ValueError("need prompt_tokens >= 1, gen_tokens >= 2 and repeats >= 1")
    report = {}
    for prefix, what in LOADS.items() if memory else ():
        if compare or what != "peer":
            report.update({f"{prefix}{key}": value for key, value in load_memory(model_path, what).items()
                           if not (prefix and key == "gguf_mb")})
    gguf = read_gguf(model_path)
    start = time.perf_counter()
    backend = MlxBackend(gguf, ModelConfig.from_gguf(gguf))
    report.update({"model": gguf.path.name, "device": str(mx.default_device()),
                   "load_s": round(time.perf_counter() - start, 3), "prompt_tokens": prompt_tokens,
                   "gen_tokens": gen_tokens, "repeats": repeats})
    prompt = np.random.default_rng(0).integers(0, backend.config.n_vocab, prompt_tokens).tolist()
    engines: dict[str, Callable[[], Iterator[int]]] = {
        "": lambda: _ours_pipelined(backend, prompt, gen_tokens),
        "host.": lambda: _ours_host(backend, prompt, gen_tokens),
    }
    streams = [mx.default_stream(mx.default_device())]
    if compare:
        from mlx_lm.generate import generation_stream

        from .mlx_peer import build_peer
        peer = build_peer(backend)
        report["peer.max_abs_logit_diff"] = _max_logit_difference(backend, peer, prompt[:PEER_CHECK_TOKENS])
        engines["peer."] = lambda: _peer(peer, prompt, gen_tokens)
        streams.append(generation_stream)
    rates: dict[str, list[dict[str, float]]] = {key: [] for key in engines}
    tokens: dict[str, list[int]] = {}
    for repeat in range(repeats):
        order = list(engines)[repeat % len(engines):] + list(engines)[:repeat % len(engines)]
        for key, rate in _interleaved(order, engines, streams, prompt_tokens, gen_tokens, tokens).items():
            rates[key].append(rate)
        mx.clear_cache()
    for key in engines:
        if key:
            report[f"{key}same_tokens"] = tokens[key] == tokens[""]
    for key, results in rates.items():
        for name in results[0]:
            report[f"{key}{name}"] = round(statistics.median(r[name] for r in results), 3)
    if compare:
        report.update(_ratios(report))
    report["peak_rss_mb_after_runs"] = round(_peak_rss_bytes() / 1e6, 1)
    backend.close()
    return report


def _interleaved(order: list[str], engines: dict[str, Callable[[], Iterator[int]]], streams: list,
                 prompt_tokens: int, gen_tokens: int, tokens: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """One repeat: every engine's prefill (to its first token), then decode turns; each engine's rates.
    Each engine's greedy tokens are left in ``tokens``.

    A turn ends when ``streams`` are idle: a pipelined engine's queued step is its own work, not the next one's.
    The step a pipelined engine queues with its first token is timed in neither phase: its decode turns then
    compute ``gen_tokens - 1`` steps, as the one-token-at-a-time engine's do.
    """
    steps, prefill, decode = {}, {}, {key: np.zeros(2) for key in order}
    for key in order:
        t0 = _clocks()
        steps[key] = engines[key]()
        tokens[key] = [int(next(steps[key]))]
        prefill[key] = _clocks() - t0
        _settle(streams)
    for done in range(1, gen_tokens, SEGMENT):
        for key in order:
            t0 = _clocks()
            for _ in range(min(SEGMENT, gen_tokens - done)):
                tokens[key].append(int(next(steps[key])))
            _settle(streams)
            decode[key] += _clocks() - t0
    for generator in steps.values():
        generator.close()
    return {key: {"prefill_tps": prompt_tokens / prefill[key][0], "decode_tps": (gen_tokens - 1) / decode[key][0],
                  "prefill_cpu_tps": prompt_tokens / prefill[key][1],
                  "decode_cpu_tps": (gen_tokens - 1) / decode[key][1]} for key in order}


def _max_logit_difference(backend: MlxBackend, peer, ids: list[int]) -> float:
    """The largest difference between our logits and the peer's over ``ids`` (one prefill each): the peer holds
    our arrays, so this says the bench compares like with like."""
    from mlx_lm.models.cache import make_prompt_cache

    theirs = np.array(peer(mx.array(ids)[None], cache=make_prompt_cache(peer))[0], dtype=np.float32)
    ours = backend.forward(ids, backend.new_cache(len(ids) + 1), all_logits=True)
    return float(np.max(np.abs(theirs - ours)))


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
        out[f"ratio.decode_host{clock}"] = round(report[f"host.decode{clock}_tps"] / peer_decode, 3)
    return out


def load_memory(model_path: str | os.PathLike, what: str = "backend") -> dict[str, float]:
    """Resident memory of a fresh process loading ``model_path`` on MLX, in MB and per byte of the GGUF file.

    Args:
        what: "backend" (read the GGUF, load MlxBackend: what the benchmark times), "model" (``engine.model.load``:
            tokenizer and chat template too, then one short encode) or "peer" (the backend, then mlx-lm's model
            built on its arrays).

    Returns:
        ``gguf_mb``, ``rss_before_load_mb`` (runtime and MLX up), ``rss_after_load_mb``, ``peak_rss_mb`` (the
        process's peak so far), ``mlx_active_mb`` and ``rss_after_load_per_gguf``, ``peak_rss_per_gguf``,
        ``load_rss_growth_per_gguf``, ``mlx_active_per_gguf``.
    """
    code = f"from engine.bench.mlx_speed import _print_load_memory; _print_load_memory({what!r})"
    out = subprocess.run([sys.executable, "-c", code, os.fspath(model_path)], capture_output=True, text=True,
                         check=True, cwd=_PACKAGE_ROOT)
    m = json.loads(out.stdout.splitlines()[-1])
    size = m["gguf"]
    report = {"gguf_mb": size, "rss_before_load_mb": m["before"], "rss_after_load_mb": m["after"],
              "peak_rss_mb": m["peak"], "mlx_active_mb": m["active"]}
    report = {key: round(value / 1e6, 1) for key, value in report.items()}
    report.update({"rss_after_load_per_gguf": round(m["after"] / size, 3),
                   "peak_rss_per_gguf": round(m["peak"] / size, 3),
                   "load_rss_growth_per_gguf": round((m["after"] - m["before"]) / size, 3),
                   "mlx_active_per_gguf": round(m["active"] / size, 3)})
    return report


def _print_load_memory(what: str) -> None:
    """In the child process of ``load_memory``: load ``sys.argv[1]`` and print the byte counts as JSON."""
    mx.eval(mx.zeros(1) + 1)  # MLX's device up before the baseline
    before = _rss_bytes()
    if what == "model":
        from ..model import load
        model = load(sys.argv[1], "mlx")
        model.tokenize("Measure the resident memory after the load.")
        size = model.gguf.file_size
    else:
        gguf = read_gguf(sys.argv[1])
        backend, size = MlxBackend(gguf, ModelConfig.from_gguf(gguf)), gguf.file_size
        if what == "peer":
            from .mlx_peer import build_peer
            peer = build_peer(backend)
    print(json.dumps({"gguf": size, "before": before, "after": _rss_bytes(), "peak": _peak_rss_bytes(),
                      "active": mx.get_active_memory()}))


def _settle(streams: list) -> None:
    for stream in streams:
        mx.synchronize(stream)


def _rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def _peak_rss_bytes() -> int:
    """The peak RSS so far: VmHWM on Linux (ru_maxrss there can be the parent's, inherited over fork + exec)."""
    if sys.platform.startswith("linux"):
        with open("/proc/self/status", encoding="ascii") as f:
            peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS
    return max(_rss_bytes(), peak)


def _ours_host(backend: MlxBackend, prompt: list[int], gen_tokens: int) -> Iterator[int]:
    """The host path: forward -> NumPy logits -> argmax on the host, one token at a time."""
    cache = backend.new_cache(len(prompt) + gen_tokens)
    token = int(np.argmax(backend.forward(prompt, cache)))
    while True:
        yield token
        token = int(np.argmax(backend.forward([token], cache)))


def _ours_pipelined(backend: MlxBackend, prompt: list[int], gen_tokens: int) -> Iterator[int]:
    """Greedy decoding as the engine runs it: the argmax on the device, the next step queued before the
    current token is read."""
    cache = backend.new_cache(len(prompt) + gen_tokens + 1)
    for token, _ in backend.decode_pipelined(prompt, cache, lambda logits: mx.argmax(logits, axis=-1)):
        yield token


def _peer(model, prompt: list[int], gen_tokens: int) -> Iterator[int]:
    from mlx_lm.generate import generate_step

    for token, _ in generate_step(mx.array(prompt), model, max_tokens=gen_tokens,
                                  sampler=lambda logprobs: mx.argmax(logprobs, axis=-1)):
        yield token
