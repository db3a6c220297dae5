"""Host overhead per token: ``Model.generate``'s decode beside the bare backend forward on the same token ids.

A repeat is a pair: ``Model.generate`` with the chosen sampling (the path a reply takes: scheduler, sampler,
detokenizer, stop checks, event objects) and the backend alone fed the tokens generate produced in its untimed
warm-up (greedy or seeded, so every run produces them again), one ``forward`` per token into a cache of its own
holding the same prompt (allocated once, like the model's): both decode the same ids at the same positions.
Which of the two runs first alternates from pair to pair. The overhead of a pair is how much longer generate's
decode step took than the bare forward, in percent; the report gives its median and spread over the pairs.
``host_ms_per_token`` times generate again with the forward answering from stored logits: the host's share
alone, which a loaded machine's noise in the pairs can hide. Nothing here asserts a time.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

from ..model import Model, load
from ..sampling import SamplingParams, make_sampler
from .runners import GREEDY
from .speed import machine
from .workload import bench_prompt, set_threads, spread, threads_in_use

SAMPLING_MODES = ("greedy", "chat")
CHAT_SEED = 1234  # a fixed seed: every repeat samples the same tokens, so the pairs decode the same ids
WARM_UP_TOKENS = 8


def sampling_params(mode: str, overrides: dict | None = None) -> SamplingParams:
    """The parameters of a sampling mode: "greedy" (plain argmax, as ``Model.generate`` decodes by default) or
    "chat" (``SamplingParams``' own defaults, which ``Model.chat`` uses: penalties, top-k, top-p, min-p and a
    temperature), seeded; ``overrides`` (field -> value, e.g. ``{"top_k": 0}``) replace the mode's fields.

    Raises:
        ValueError: an unknown mode or an invalid override.
    """
    if mode == "greedy":
        params = GREEDY
    elif mode == "chat":
        params = dataclasses.replace(SamplingParams(), seed=CHAT_SEED)
    else:
        raise ValueError(f"unknown sampling mode {mode!r}; choose from {', '.join(SAMPLING_MODES)}")
    return dataclasses.replace(params, **(overrides or {}))


def generate_decode(model: Model, ids: list[int], params: SamplingParams, gen_tokens: int) -> tuple[list[int], list[float]]:
    """The tokens ``Model.generate`` produced and the seconds between consecutive events (its decode steps)."""
    tokens: list[int] = []
    times: list[float] = []
    for event in model.generate_ids(ids, params, gen_tokens):
        times.append(time.perf_counter())
        tokens.append(event.id)
    return tokens, [b - a for a, b in zip(times, times[1:])]


def prefilled_cache(model: Model, ids: list[int]):
    """A cache of the bare backend's own holding ``ids``, with room for the whole context (as the model's)."""
    cache = model.backend.new_cache(model.n_ctx)
    cache.reserve(model.n_ctx)  # allocated now: growing inside the timed steps would charge the bare forward
    model.backend.forward(ids, cache)
    return cache


def forward_decode(model: Model, cache, n_prompt: int, tokens: list[int]) -> list[float]:
    """Seconds of each bare backend step decoding ``tokens[:-1]`` one at a time after the first ``n_prompt``
    positions of ``cache`` (the prompt, kept from one pair to the next)."""
    backend = model.backend
    cache.truncate(n_prompt)
    steps = []
    for token in tokens[:-1]:
        start = time.perf_counter()
        backend.forward([token], cache)
        steps.append(time.perf_counter() - start)
    return steps


def host_ms_per_token(model: Model, ids: list[int], params: SamplingParams, gen_tokens: int) -> float:
    """Milliseconds per decoded token ``Model.generate`` spends outside the backend: the same run with the
    backend's ``forward`` answering from a stored logits row, so a loaded machine's noise in the forward pass
    does not hide the host's share."""
    backend = model.backend
    logits = backend.forward(ids, backend.new_cache(model.n_ctx))  # (n_vocab,)

    def stored(tokens, cache, all_logits=False):
        cache.reserve(len(tokens))
        cache.advance(len(tokens))  # positions counted, nothing written: the caches are the bench's own
        return logits

    backend.forward = stored  # this instance only, undone below
    try:
        steps = []
        for _ in range(3):  # a cache of the request's own (resident=False): the model's resident cache stays true
            times = [time.perf_counter() for _ in model.stream(model.submit(ids, params, gen_tokens, resident=False,
                                                                             queued=False))]
            steps.append([b - a for a, b in zip(times, times[1:])])
    finally:
        del backend.forward
    return min(statistics.median(s) for s in steps) * 1e3


def sampler_ms(model: Model, ids: list[int], params: SamplingParams, calls: int = 50) -> float:
    """Milliseconds one sampler call takes on the model's logits after ``ids`` (median of ``calls``)."""
    logits = model.backend.forward(ids, model.backend.new_cache(model.n_ctx))  # (n_vocab,)
    sampler, history, times = make_sampler(params), list(ids), []
    for _ in range(calls):
        start = time.perf_counter()
        sampler(logits, history)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_overhead_bench(path: Path, backend: str, threads: int | None, prompt_tokens: int, gen_tokens: int,
                       mode: str, repeats: int, overrides: dict | None = None) -> dict:
    """The ``python -m engine bench MODEL --sampling MODE`` report as a dict (see the module docstring);
    ``overrides`` replace fields of the mode's parameters (``--top-k 0`` ...), reported in ``sampling_params``.

    Raises:
        ValueError: an unknown mode or override, or generation ended before a second token (nothing to time).
    """
    params = sampling_params(mode, overrides)
    if threads:
        set_threads(backend, threads)
    model = load(path, backend, prompt_tokens + gen_tokens + 8)
    ids = bench_prompt(model, prompt_tokens)
    bare_cache = prefilled_cache(model, ids)
    # untimed warm-ups, both paths (the resident cache grown); greedy or seeded, every run gives these tokens
    tokens = generate_decode(model, ids, params, gen_tokens)[0]
    if len(tokens) < 2:
        raise ValueError(f"generation ended after {len(tokens)} token(s): no decode step to time")
    forward_decode(model, bare_cache, len(ids), tokens)
    generated, bare, overhead, overhead_median, same = [], [], [], [], []
    for repeat in range(repeats):
        if repeat % 2:  # which path runs first alternates, so a drifting load favours neither
            forward_steps = forward_decode(model, bare_cache, len(ids), tokens)
        run_tokens, generate_steps = generate_decode(model, ids, params, gen_tokens)
        if not repeat % 2:
            forward_steps = forward_decode(model, bare_cache, len(ids), tokens)
        same.append(run_tokens == tokens)
        generated.append(len(generate_steps) / sum(generate_steps))
        bare.append(len(forward_steps) / sum(forward_steps))
        overhead.append((bare[-1] / generated[-1] - 1.0) * 100.0)  # per token: equal runs, equal steps
        overhead_median.append((statistics.median(generate_steps) / statistics.median(forward_steps) - 1.0) * 100.0)
    host_ms = host_ms_per_token(model, ids, params, gen_tokens)
    step_ms = 1e3 / statistics.median(bare)
    return {
        "machine": machine(), "model": model.name, "file": str(path), "backend": model.backend.name,
        "threads": threads_in_use(backend, threads), "prompt_tokens": len(ids), "gen_tokens": gen_tokens,
        "repeats": repeats, "sampling": mode, "sampling_params": dataclasses.asdict(params),
        "n_vocab": model.config.n_vocab, "decode_steps": len(tokens) - 1, "same_tokens_every_run": all(same),
        "generate_decode_tps": spread(generated), "forward_decode_tps": spread(bare),
        "overhead_pct": spread(overhead, 3), "overhead_pct_of_median_steps": spread(overhead_median, 3),
        "host_ms_per_token": round(host_ms, 5), "forward_ms_per_token": round(step_ms, 5),
        "host_pct_of_forward": round(host_ms / step_ms * 100.0, 3),
        "sampler_ms": round(sampler_ms(model, ids, params), 4),
    }
