"""The speed bench: prefill and decode tokens/sec, load time and memory, beside peers measured fairly.

Every engine runs in turn on the same prompt ids with greedy decoding, after an untimed warm-up of its own,
repeat by repeat (ours, peer, ours, peer, ...); the report gives each engine's median with its min/max spread,
says whether each peer produced our greedy tokens (and where they first differ), and sets our figures against
the best peer setting (llama.cpp with flash attention on or off, whichever is faster), median over median and
round by round (a shared host's speed drifts between rounds), and against this machine's read bandwidth,
twice: against the best pass of the whole run (strict: on a shared host the pass moves by up to a factor of two
from minute to minute) and round by round against short passes taken just before and just after that round's
decode (paired: the bandwidth the decode actually had). With llama-bench as a peer, our model's pages are read
back in (untimed) after each of its rounds, since both engines are timed warm, and its decode is timed after the
prompt's positions, as ours is (``run_llama_bench_reply``; until 2026-11-28 it decoded from an empty cache).
Nothing here asserts a time.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..gguf_file import touch_tensors
from ..memory_estimate import KV_TYPE_ELEMENT_BYTES, kv_cache_bytes, kv_layout
from ..model import load
from .bandwidth import measure_read_bandwidth, merge_measurements, weight_bytes_per_token
from .llama_bench import default_binary, run_llama_bench_reply
from .runners import HearthRunner, LlamaCppRunner, Run, Runner
from .workload import bench_prompt, first_divergence, peak_rss_mb, rss_mb, set_threads, spread, threads_in_use

PEERS = ("llama.cpp", "llama-bench", "hearth")  # --compare choices on the CPU; "hearth" times our engine twice
WARM_UP_TOKENS = 8
PAIRED_PASSES = 3  # bandwidth passes just before and just after each of our timed runs
BANDWIDTH_BACKENDS = ("cpu", "numpy")  # the backends whose decode is set against this machine's read bandwidth


def _timed(fn: Callable, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def machine() -> dict:
    """What the figures were taken on: processor, cores and the load average (a shared machine's neighbours)."""
    return {"processor": _cpu_name(), "logical_cpus": os.cpu_count(),
            "load_average": [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor())
    except OSError:
        return platform.processor()


def measure(runners: list[Runner], ids: list[int], gen_tokens: int, repeats: int,
            between: Callable[[], None] | None = None) -> dict[str, list[Run]]:
    """Warm every runner up (untimed), then run them in turn ``repeats`` times; every run of each.

    ``between`` runs after each round of runners (the llama-bench peer, which is a process of its own).
    """
    for runner in runners:
        runner.run(ids, min(gen_tokens, WARM_UP_TOKENS))
    runs: dict[str, list[Run]] = {r.name: [] for r in runners}
    for _ in range(repeats):
        for runner in runners:
            runs[runner.name].append(runner.run(ids, gen_tokens))
        if between is not None:
            between()
    return runs


def summarise(runs: list[Run], prompt_tokens: int, reference: list[int] | None) -> dict:
    """Rates (median, min, max, every run) and, against ``reference`` tokens, whether the greedy tokens match."""
    out = {"prefill_tps": spread([r.prefill_tps(prompt_tokens) for r in runs]),
           "decode_tps": spread([r.decode_tps for r in runs])}
    if reference is not None:
        divergence = first_divergence(reference, runs[0].tokens)
        consistent = all(r.tokens == runs[0].tokens for r in runs)
        out.update({"same_tokens": divergence is None, "first_divergence": divergence,
                    "same_tokens_every_run": consistent})
    return out


class PassesBeside:
    """A runner with a short bandwidth pass (best of ``PAIRED_PASSES``) just before and just after each run, so
    each run's decode can be set against the bandwidth of its own minute. ``pairs`` holds (before, after) for
    every run, the untimed warm-up's first."""

    def __init__(self, runner: Runner, threads: int):
        self.runner, self.name, self.threads = runner, runner.name, threads
        self.pairs: list[tuple[dict, dict]] = []

    def run(self, ids: list[int], gen_tokens: int) -> Run:
        before = measure_read_bandwidth(self.threads, passes=PAIRED_PASSES)
        run = self.runner.run(ids, gen_tokens)
        self.pairs.append((before, measure_read_bandwidth(self.threads, passes=PAIRED_PASSES)))
        return run

    def close(self) -> None:
        self.runner.close()


def run_bench(path: Path, backend: str, threads: int | None, prompt_tokens: int, gen_tokens: int,
              compare: list[str], repeats: int, llama_bench: Path | None = None, kv_type: str | None = None) -> dict:
    """The ``python -m engine bench MODEL`` report as a dict (see the module docstring).

    Args:
        compare: peers from PEERS: "llama.cpp" (llama-cpp-python, flash attention off and on), "llama-bench"
            (llama.cpp's own binary, ``llama_bench`` or its default path) and "hearth" (our engine a second time:
            the harness's own check, whose tokens must match).
        kv_type: our KV cache type (None: the backend's, float16 on the cpu backend); the peers get the same
            (llama.cpp with a q8_0 cache: flash attention on only, where llama.cpp quantizes the V cache).
    """
    if unknown := set(compare) - set(PEERS):
        raise ValueError(f"unknown peer {sorted(unknown)[0]!r} for this backend; choose from {', '.join(PEERS)}")
    if threads:
        set_threads(backend, threads)
    n_threads = threads_in_use(backend, threads)
    n_ctx = prompt_tokens + gen_tokens + 8
    report = {"machine": machine()}
    gc.collect()
    rss_before = rss_mb()
    model, load_s = _timed(load, path, backend, n_ctx, kv_type)
    cache_type = kv_type or "f16"
    report.update({
        "model": model.name, "file": str(path), "file_mb": round(path.stat().st_size / 2**20, 1),
        "backend": model.backend.name, "threads": n_threads, "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens, "repeats": repeats, "sampling": "greedy", "load_s": round(load_s, 3),
        "rss_after_load_mb": round(rss_mb(), 1), "rss_growth_mb": round(rss_mb() - rss_before, 1),
        "notices": model.notices, "kv_type": cache_type,
    })
    ids = bench_prompt(model, prompt_tokens)
    report["prompt_tokens"] = len(ids)
    hearth = HearthRunner(model)
    hearth.run(ids, 4)  # touch every weight page before measuring memory
    paired = PassesBeside(hearth, n_threads) if model.backend.name in BANDWIDTH_BACKENDS else None
    runners: list[Runner] = [paired or hearth]
    report["peak_rss_mb"] = round(peak_rss_mb(), 1)
    report["rss_after_run_mb"] = round(rss_mb(), 1)
    if "hearth" in compare:
        runners.append(HearthRunner(model, "hearth again"))
    if "llama.cpp" in compare:
        runners += [LlamaCppRunner(path, n_ctx, n_threads, flash_attn, cache_type)
                    for flash_attn in ((True,) if cache_type == "q8_0" else (False, True))]
    bench_runs: dict[str, dict[str, list[float]]] = {}
    between = None
    if "llama-bench" in compare:
        binary = llama_bench or default_binary()

        def between() -> None:
            for name, rates in run_llama_bench_reply(binary, path, len(ids), gen_tokens, n_threads, kv_type=cache_type,
                                                     flash_attn=(1,) if cache_type == "q8_0" else (0, 1)).items():
                for key, values in rates.items():
                    bench_runs.setdefault(name, {}).setdefault(key, []).extend(values)
            # llama-bench times its rounds after loading, and its repacked copy of the weights (10 GB for a 30B
            # mixture of experts) can push our mapped file out of the page cache; ours is warmed again, untimed
            report["rewarm_s"].append(round(_timed(touch_tensors, model.gguf)[1], 2))
        report["rewarm_s"] = []
    passes: list[dict] = []  # bandwidth passes after every round: the machine's bandwidth moves during a run
    peer_round = between

    def between() -> None:
        if model.backend.name in BANDWIDTH_BACKENDS:
            passes.append(measure_read_bandwidth(n_threads, passes=3))
        if peer_round is not None:
            peer_round()
    try:
        runs = measure(runners, ids, gen_tokens, repeats, between)
    finally:
        for runner in runners[1:]:
            runner.close()
    ours = runs["hearth"][0].tokens
    engines = {name: summarise(r, len(ids), None if name == "hearth" else ours) for name, r in runs.items()}
    engines.update({name: {key: spread(values) for key, values in rates.items()} for name, rates in bench_runs.items()})
    report["engines"] = engines
    report["prefill_tps"] = engines["hearth"]["prefill_tps"]["median"]
    report["decode_tps"] = engines["hearth"]["decode_tps"]["median"]
    report.update(_against_peers(engines))
    if paired is not None:
        report.update(_against_bandwidth(model, n_threads, len(ids), gen_tokens, runs["hearth"], cache_type, passes,
                                         paired.pairs[-repeats:]))
    report["machine"]["load_average_after"] = machine()["load_average"]
    return report


def _against_peers(engines: dict[str, dict]) -> dict:
    """The best peer setting for prefill and for decode, ours / that, and whether every peer matched our tokens."""
    peers = {name: e for name, e in engines.items() if name not in ("hearth", "hearth again")}
    out: dict = {}
    if "hearth again" in engines:
        out["self_check.same_tokens"] = engines["hearth again"]["same_tokens"]
    if not peers:
        return out
    for phase in ("prefill", "decode"):
        rated = {name: e[f"{phase}_tps"]["median"] for name, e in peers.items() if e.get(f"{phase}_tps", {}).get("runs")}
        if rated:
            best = max(rated, key=rated.get)
            out[f"peer.best_{phase}"] = {"engine": best, "tps": rated[best]}
            out[f"ratio.{phase}"] = round(engines["hearth"][f"{phase}_tps"]["median"] / rated[best], 3)
            mine, theirs = engines["hearth"][f"{phase}_tps"]["runs"], peers[best][f"{phase}_tps"]["runs"]
            if len(mine) == len(theirs):  # round by round: both runs saw the machine as it was then
                out[f"ratio.{phase}_paired"] = spread([m / t for m, t in zip(mine, theirs)], 3)
    matched = [e["same_tokens"] for e in peers.values() if "same_tokens" in e]
    if matched:
        out["same_tokens"] = all(matched)
    return out


def _against_bandwidth(model, threads: int, prompt_tokens: int, gen_tokens: int, runs: list[Run],
                       kv_type: str, between: list[dict], pairs: list[tuple[dict, dict]]) -> dict:
    """Our decode against this machine's read bandwidth: the bytes a decode step reads, what our decode read per
    second, and the decode as a fraction of the ceiling (bandwidth / bytes per token) twice.

    Strict (``decode_bandwidth_fraction``): the median decode against the best pass of the whole run (``between``
    the rounds, ``pairs`` beside our runs, and passes now). Paired (``decode_bandwidth_fraction_paired``): each
    run's decode against the better of the two passes just before and just after it (``pairs``), median and
    spread over the runs.
    """
    element = KV_TYPE_ELEMENT_BYTES[kv_type] if model.backend.name == "cpu" else kv_layout(model.backend.name).element_bytes
    per_position = kv_cache_bytes(model.config, 1, element, False)
    weights = weight_bytes_per_token(model.gguf, model.config)  # a mixture of experts: the chosen experts only
    kv = int(per_position * (prompt_tokens + gen_tokens / 2))  # the cache at the decoded tokens' mean position
    beside = [m for pair in pairs for m in pair]
    bandwidth = merge_measurements([*between, *beside, measure_read_bandwidth(threads)])
    decode_tps = statistics.median(r.decode_tps for r in runs)
    ceiling = bandwidth["gbps"] * 1e9 / (weights + kv)
    own = [max(before["gbps"], after["gbps"]) for before, after in pairs]
    fractions = [r.decode_tps * (weights + kv) / 1e9 / gbps for r, gbps in zip(runs, own, strict=True)]
    return {"bandwidth": bandwidth, "bytes_per_token": weights + kv, "weight_bytes_per_token": weights,
            "kv_bytes_per_token": kv, "decode_read_gbps": round(decode_tps * (weights + kv) / 1e9, 2),
            "decode_ceiling_tps": round(ceiling, 2),
            "decode_bandwidth_fraction": round(decode_tps / ceiling, 3),
            "paired_bandwidth_gbps": [round(g, 2) for g in own],
            "decode_bandwidth_fraction_paired": spread(fractions, 3)}


def run_session_bench(path: Path, backend: str, n_tokens: int, repeats: int) -> dict:
    """Restoring a snapshot of ``n_tokens`` against processing the same tokens again (medians)."""
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
    report = {"machine": machine(), "model": model.name, "backend": model.backend.name, "tokens": len(ids),
              "repeats": repeats, "reprocess_s": round(statistics.median(reprocess), 4),
              "restore_s": round(statistics.median(restore), 4), "snapshot_mb": round(size_mb, 1)}
    report["ratio.restore_speedup"] = round(report["reprocess_s"] / report["restore_s"], 1)
    return report
