"""The long-context bench: prefill and decode speed after ``depth`` positions of context, beside llama.cpp.

As llama-bench's ``-d``: each engine first fills its cache with ``depth`` prompt ids (untimed), then, repeat by
repeat, times a ``prompt_tokens`` chunk appended at that depth and, the cache cut back to the depth, ``gen_tokens``
greedy decode steps from it. Our engine runs through the backend's forward calls (at these depths the attention
dominates a step; ``python -m engine bench`` without ``--depth`` measures the whole reply path), llama.cpp through
llama-cpp-python with flash attention off and on, and llama-bench with ``-d``. Both engines fill with the same ids.
With a q8_0 KV cache the llama.cpp peers run with flash attention on only (llama.cpp quantizes the V cache only
there). Nothing here asserts a time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import numpy as np

from ..model import Model, load
from .llama_bench import default_binary, run_llama_bench
from .peer_check import check_llama_cpp_runs
from .runners import GGML_KV_TYPES
from .speed import machine
from .workload import bench_prompt, first_divergence, set_threads, spread, threads_in_use

PEERS = ("llama.cpp", "llama-bench")


class DepthRunner(Protocol):
    """One engine at depth: fill its cache, then time a chunk or decode steps from the filled depth."""

    name: str

    def fill(self, ids: list[int]) -> None: ...

    def prefill(self, ids: list[int]) -> float: ...

    def decode(self, n: int) -> tuple[list[int], float]: ...

    def close(self) -> None: ...


class HearthDepthRunner:
    """Our backend's forward calls on one cache of ``n_ctx`` positions."""

    def __init__(self, model: Model, n_ctx: int, name: str = "hearth"):
        self.name, self.backend, self.n_ctx = name, model.backend, n_ctx
        self.cache, self.depth, self.first = None, 0, 0

    def fill(self, ids: list[int]) -> None:
        self.cache = self.backend.new_cache(self.n_ctx)
        self.first = int(np.argmax(self.backend.forward(ids, self.cache)))
        self.depth = len(ids)

    def prefill(self, ids: list[int]) -> float:
        self.cache.truncate(self.depth)
        start = time.perf_counter()
        self.backend.forward(ids, self.cache)
        return time.perf_counter() - start

    def decode(self, n: int) -> tuple[list[int], float]:
        self.cache.truncate(self.depth)
        tokens, start = [self.first], time.perf_counter()
        for _ in range(n):
            tokens.append(int(np.argmax(self.backend.forward(tokens[-1:], self.cache))))
        return tokens[1:], time.perf_counter() - start

    def close(self) -> None:
        self.cache = None


class LlamaCppDepthRunner:
    """llama.cpp through llama-cpp-python: ``n_tokens`` set back to the depth drops the positions after it."""

    def __init__(self, path: Path, n_ctx: int, threads: int, flash_attn: bool, kv_type: str):
        check_llama_cpp_runs(Path(path))  # before this process loads it: a crash here would say nothing
        import llama_cpp  # a test and bench dependency: pip install .[bench]

        self.name = f"llama.cpp fa={'on' if flash_attn else 'off'}"
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   n_batch=512, n_ubatch=512, flash_attn=flash_attn, type_k=GGML_KV_TYPES[kv_type],
                                   type_v=GGML_KV_TYPES[kv_type], verbose=False)
        self._llama_cpp, self.n_vocab, self.depth, self.first = llama_cpp, self.llm.n_vocab(), 0, 0

    def _greedy(self) -> int:
        logits = np.ctypeslib.as_array(self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def fill(self, ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(ids)
        self.depth, self.first = len(ids), self._greedy()

    def prefill(self, ids: list[int]) -> float:
        self.llm.n_tokens = self.depth
        start = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - start

    def decode(self, n: int) -> tuple[list[int], float]:
        self.llm.n_tokens = self.depth
        tokens, start = [self.first], time.perf_counter()
        for _ in range(n):
            self.llm.eval(tokens[-1:])
            tokens.append(self._greedy())
        return tokens[1:], time.perf_counter() - start

    def close(self) -> None:
        self.llm.close()


def measure_at_depth(runner: DepthRunner, context: list[int], chunk: list[int], gen_tokens: int,
                     repeats: int) -> dict:
    """Fill, one untimed warm-up of each phase, then ``repeats`` timed chunks and decodes; rates and tokens."""
    start = time.perf_counter()
    runner.fill(context)
    fill_s = time.perf_counter() - start
    runner.prefill(chunk[:16])
    runner.decode(2)
    prefill, decode, tokens = [], [], []
    for _ in range(repeats):
        prefill.append(len(chunk) / runner.prefill(chunk))
        tokens, seconds = runner.decode(gen_tokens)
        decode.append(gen_tokens / seconds)
    return {"fill_s": round(fill_s, 1), "prefill_tps": spread(prefill), "decode_tps": spread(decode), "tokens": tokens}


def run_depth_bench(path: Path, backend: str, threads: int | None, depths: list[int], prompt_tokens: int,
                    gen_tokens: int, compare: list[str], repeats: int, kv_type: str | None = None,
                    llama_bench: Path | None = None) -> dict:
    """The ``python -m engine bench MODEL --depth N ...`` report: per depth, every engine's rates and ours / the best
    llama.cpp setting for prefill and decode (``ratio.prefill`` / ``ratio.decode``), and the peers' flash-attention
    settings apart (the issue's acceptance compares decode at 16k with flash attention on).

    Args:
        kv_type: our KV cache type (None: the backend's, float16 on the cpu backend); the peers get the same.
    """
    if unknown := set(compare) - set(PEERS):
        raise ValueError(f"unknown peer {sorted(unknown)[0]!r} with --depth; choose from {', '.join(PEERS)}")
    if threads:
        set_threads(backend, threads)
    n_threads = threads_in_use(backend, threads)
    cache_type = kv_type or "f16"
    n_ctx = max(depths) + max(prompt_tokens, gen_tokens) + 8
    model = load(path, backend, n_ctx, kv_type=kv_type)
    report = {"machine": machine(), "model": model.name, "file": str(path), "backend": model.backend.name,
              "threads": n_threads, "kv_type": cache_type, "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens,
              "repeats": repeats, "depths": {}}
    ids = bench_prompt(model, max(depths) + prompt_tokens)
    for depth in depths:
        context, chunk = ids[:depth], ids[depth:depth + prompt_tokens]
        engines = {}
        runner = HearthDepthRunner(model, depth + max(prompt_tokens, gen_tokens) + 8)
        engines["hearth"] = measure_at_depth(runner, context, chunk, gen_tokens, repeats)
        runner.close()
        if "llama.cpp" in compare:
            for flash_attn in ((True,) if cache_type == "q8_0" else (False, True)):
                peer = LlamaCppDepthRunner(path, depth + max(prompt_tokens, gen_tokens) + 8, n_threads, flash_attn,
                                           cache_type)
                try:
                    engines[peer.name] = measure_at_depth(peer, context, chunk, gen_tokens, repeats)
                finally:
                    peer.close()
        if "llama-bench" in compare:
            rates = run_llama_bench(llama_bench or default_binary(), path, prompt_tokens, gen_tokens, n_threads,
                                    repeats, depth=depth, kv_type=cache_type,
                                    flash_attn=(1,) if cache_type == "q8_0" else (0, 1))
            engines.update({name: {k: spread(v) for k, v in r.items() if v} for name, r in rates.items()})
        report["depths"][str(depth)] = _summary(engines)
    report["machine"]["load_average_after"] = machine()["load_average"]
    return report


def _summary(engines: dict[str, dict]) -> dict:
    """Tokens agreement with ours, and ours / each peer and / the best peer, per phase."""
    ours = engines["hearth"]
    for name, e in engines.items():
        if name != "hearth" and "tokens" in e:
            e["first_divergence"] = first_divergence(ours["tokens"], e["tokens"])
    out: dict = {"engines": {name: {k: v for k, v in e.items() if k != "tokens"} for name, e in engines.items()}}
    for phase in ("prefill", "decode"):
        rated = {name: e[f"{phase}_tps"]["median"] for name, e in engines.items()
                 if name != "hearth" and f"{phase}_tps" in e}
        mine = ours[f"{phase}_tps"]["median"]
        for name, tps in rated.items():
            out[f"ratio.{phase}.vs {name}"] = round(mine / tps, 3)
        if rated:
            best = max(rated, key=rated.get)
            out[f"ratio.{phase}"] = round(mine / rated[best], 3)
            out[f"peer.best_{phase}"] = best
    return out
