"""Speculative decoding bench: plain greedy decode tokens/sec beside speculative decoding (a draft model or
prompt lookup) on the same prompt in the same run, interleaved, medians. Nothing here asserts a time.

Each repeat runs plain then speculative, or speculative then plain (alternating, so a drifting machine load
favours neither), each from a fresh cache and a fresh speculator (what it learns about acceptance and costs
is part of what is measured). Decode speed counts the tokens after the first over the time since the first,
as ``GenerationEvent.decode_tps`` does. ``ratio.spec`` is the median of the per-repeat ratios.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..generate import generate_step
from ..model import Model, load
from ..sampling import SamplingParams, make_sampler
from ..speculative import DraftModel, SpeculationStats, Speculator, check_same_vocabulary, prompt_lookup_speculator
from .workload import bench_prompt, set_threads

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)  # plain argmax, as the other benches decode


def prompt_ids(model: Model, prompt_file: Path | None, prompt_tokens: int) -> list[int]:
    """The file's text as a user message in the model's chat template, or ``prompt_tokens`` tokens of prose."""
    if prompt_file is None:
        return bench_prompt(model, prompt_tokens)
    return model.chat_ids([{"role": "user", "content": prompt_file.read_text(encoding="utf-8")}])


def timed_decode(steps: Iterator[tuple[int, float]], gen_tokens: int, eog_ids: frozenset[int]) -> tuple[list[int], float]:
    """Tokens (up to ``gen_tokens``, ending early at end-of-generation) and decode tokens/sec after the first."""
    tokens: list[int] = []
    first_at = last_at = 0.0
    for token, _ in steps:
        last_at = time.perf_counter()
        first_at = first_at or last_at
        tokens.append(token)
        if len(tokens) >= gen_tokens or token in eog_ids:
            break
    steps.close()
    seconds = last_at - first_at
    return tokens, (len(tokens) - 1) / seconds if seconds > 0 else 0.0


def decode_once(model: Model, ids: list[int], gen_tokens: int,
                speculator: Speculator | None) -> tuple[list[int], float]:
    cache = model.backend.new_cache(len(ids) + gen_tokens + 8)
    args = (model.backend, cache, ids, make_sampler(GREEDY), list(ids))
    steps = generate_step(*args) if speculator is None else speculator.generate_step(*args, params=GREEDY)
    return timed_decode(steps, gen_tokens, model.tokenizer.eog_ids)


def measure_speculation(model: Model, ids: list[int], gen_tokens: int, repeats: int,
                        new_speculator: Callable[[], Speculator]) -> dict:
    """Interleaved plain and speculative runs; medians, per-run values and whether the tokens were identical."""
    plain_runs, spec_runs, ratios, stats, identical, generated = [], [], [], [], True, 0
    for repeat in range(repeats):
        speculator = new_speculator()
        runs = {}
        for kind in (("plain", "spec") if repeat % 2 == 0 else ("spec", "plain")):
            runs[kind] = decode_once(model, ids, gen_tokens, speculator if kind == "spec" else None)
        (plain_tokens, plain_tps), (spec_tokens, spec_tps) = runs["plain"], runs["spec"]
        identical &= plain_tokens == spec_tokens
        generated = len(plain_tokens)
        plain_runs.append(plain_tps)
        spec_runs.append(spec_tps)
        ratios.append(spec_tps / plain_tps if plain_tps > 0 else 0.0)
        stats.append(speculator.stats)
    return {
        "generated_tokens": generated,
        "decode_tps": round(statistics.median(plain_runs), 2),
        "spec.decode_tps": round(statistics.median(spec_runs), 2),
        "spec.acceptance": round(statistics.median(s.acceptance_rate for s in stats), 3),
        "spec.tokens_per_verify": round(statistics.median(s.tokens_per_verify for s in stats), 2),
        "spec.mean_k": round(statistics.median(s.mean_k for s in stats), 2),
        "spec.plain_steps": round(statistics.median(s.plain_steps for s in stats), 1),
        "spec.identical": identical,
        "ratio.spec": round(statistics.median(ratios), 3),
        "decode_runs": [round(v, 2) for v in plain_runs],
        "spec.decode_runs": [round(v, 2) for v in spec_runs],
        "ratio.spec_runs": [round(v, 3) for v in ratios],
        "spec.stats_runs": [_stats_row(s) for s in stats],
    }


def _stats_row(s: SpeculationStats) -> dict:
    return {"proposed": s.proposed, "accepted": s.accepted, "verify_passes": s.verify_passes,
            "plain_steps": s.plain_steps}


def run_speculative_bench(path: Path, backend: str, threads: int | None, prompt_file: Path | None,
                          prompt_tokens: int, gen_tokens: int, draft: Path | None, lookup: bool,
                          repeats: int) -> dict:
    """The report of ``python -m engine bench MODEL [--prompt-file FILE] (--draft DRAFT_MODEL | --lookup)``."""
    if (draft is None) == (not lookup):
        raise ValueError("choose one kind of speculation: --draft DRAFT_MODEL or --lookup")
    if threads:
        set_threads(backend, threads)
    model = load(path, backend)
    ids = prompt_ids(model, prompt_file, prompt_tokens)
    if draft is not None:
        draft_model = load(draft, backend)
        check_same_vocabulary(model.tokenizer, model.config, draft_model.tokenizer, draft_model.config)

        def new_speculator() -> Speculator:
            return Speculator(DraftModel(draft_model.backend))
    else:
        new_speculator = prompt_lookup_speculator
    report = {"model": model.name, "file": str(path), "backend": model.backend.name, "threads": threads,
              "speculation": f"draft {draft_model.name}" if draft is not None else "prompt lookup",
              "prompt": str(prompt_file) if prompt_file else f"{prompt_tokens} tokens of prose",
              "prompt_tokens": len(ids), "gen_tokens": gen_tokens, "repeats": repeats, "sampling": "greedy",
              "notices": model.notices}
    decode_once(model, ids, 4, new_speculator())  # touch every weight page (both models') before timing
    report.update(measure_speculation(model, ids, gen_tokens, repeats, new_speculator))
    return report
