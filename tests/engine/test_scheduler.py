"""The scheduler: batched decode, chunked prefill between decode steps, priorities, preemption, cancellation,
thermal limits. Logic runs on a fake backend whose next token depends on the whole history (so a wrong cache or a
wrong token fed back shows); the tiny random model checks the real decoder path."""

from __future__ import annotations

import itertools
import math
import threading

import numpy as np
import pytest

from engine.backends.base import Backend, KVCache, KVState, MemoryStats
from engine.backends.numpy_backend import NumpyBackend
from engine.config import ModelConfig
from engine.generate import GenerationEvent
from engine.gguf_file import read_gguf
from engine.scheduler import Request, RequestEvent, Scheduler, decode_load
from engine.thermal import Limits, ScriptedProvider, ThermalMonitor, ThermalPolicy, ThermalState
from engine.thermal.policy import PolicyConfig

VOCAB = 97


class FakeCache(KVCache):
    def __init__(self, n_ctx: int):
        self.n_ctx, self.tokens = n_ctx, []

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def reserve(self, n_new: int) -> None:
        if self.n_past + n_new > self.n_ctx:
            raise ValueError("the context is full")

    def truncate(self, n_past: int) -> None:
        del self.tokens[n_past:]

    def export_state(self) -> KVState:
        raise NotImplementedError

    def import_state(self, state: KVState) -> None:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        return 0


def next_token(tokens: list[int]) -> int:
    """The fake model: the next token is a function of every token before it."""
    return (sum((i + 1) * t for i, t in enumerate(tokens)) + 3) % VOCAB


class FakeBackend(Backend):
    """Records every call: ("prefill", n_tokens) or ("decode", batch)."""

    name = "fake"

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def new_cache(self, n_ctx: int) -> FakeCache:
        return FakeCache(n_ctx)

    def _logits(self, tokens: list[int]) -> np.ndarray:
        logits = np.zeros(VOCAB, np.float32)
        logits[next_token(tokens)] = 5.0
        return logits

    def forward(self, tokens, cache, all_logits=False):
        if any(not 0 <= t < VOCAB for t in tokens):
            raise ValueError("token id out of range")
        # a sequence decoding alone is a batch of one that calls forward (no prompt here is fed one token late)
        kind = "decode" if len(tokens) == 1 and cache.n_past > 0 else "prefill"
        cache.reserve(len(tokens))
        cache.tokens.extend(tokens)
        self.calls.append((kind, len(tokens)))
        return self._logits(cache.tokens)

    def forward_batch(self, tokens, caches):
        self.calls.append(("decode", len(tokens)))
        for t, c in zip(tokens, caches):
            c.reserve(1)
            c.tokens.append(t)
        return np.stack([self._logits(c.tokens) for c in caches])

    def memory(self) -> MemoryStats:
        return MemoryStats(0, 0)


def greedy(logits, history):
    return int(np.argmax(logits)), 0.0


def solo(prompt: list[int], n: int) -> list[int]:
    tokens, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(tokens))
        tokens.append(out[-1])
    return out


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_to_end(scheduler: Scheduler, max_steps: int = 10_000) -> list:
    reports = []
    while scheduler.has_work:
        reports.append(scheduler.step())
        assert len(reports) < max_steps
    return reports


def tokens_of(reports, request_id: int) -> list[int]:
    return [e.id for r in reports for rid, e in r.events if rid == request_id and isinstance(e, GenerationEvent)]


def kinds_of(reports, request_id: int) -> list[str]:
    return [e.kind for r in reports for rid, e in r.events if rid == request_id and isinstance(e, RequestEvent)]


def request(prompt, max_tokens=8, **kw) -> Request:
    return Request(tuple(prompt), greedy, max_tokens=max_tokens, **kw)


PROMPTS = [[1, 2, 3], [5] * 17, [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11], [42]]


def test_concurrent_requests_decode_in_one_batched_pass_and_match_solo():
    backend = FakeBackend()
    scheduler = Scheduler(backend, n_ctx=64, limits=Limits(prefill_chunk=512, max_batch=8, pause_s=0.0))
    handles = [scheduler.submit(request(p, max_tokens=6 + i)) for i, p in enumerate(PROMPTS)]
    reports = run_to_end(scheduler)
    for i, (h, p) in enumerate(zip(handles, PROMPTS)):
        assert tokens_of(reports, h.id) == solo(p, 6 + i)
    decodes = [b for kind, b in backend.calls if kind == "decode"]
    assert decodes[0] == 4 and max(decodes) == 4  # all four in one pass, not four passes
    assert sum(1 for r in reports if r.decode_batch) == len(decodes)  # one pass per step
    assert decodes[-1] == 1  # the longest request's last token: a batch of one, through forward


def test_every_stream_ends_with_one_final_event_with_timings():
    clock = FakeClock()
    scheduler = Scheduler(FakeBackend(), n_ctx=64, clock=clock)
    handle = scheduler.submit(request([1, 2], max_tokens=3))
    while scheduler.has_work:
        clock.now += 1.0
        scheduler.step()
    events = list(handle.stream(timeout=0))
    assert [type(e).__name__ for e in events] == ["RequestEvent", "RequestEvent"] + ["GenerationEvent"] * 3
    assert [e.kind for e in events[:2]] == ["queued", "started"]
    tokens = events[2:]
    assert [e.index for e in tokens] == [0, 1, 2] and tokens[-1].finish_reason == "length"
    assert [e.finish_reason for e in tokens[:-1]] == [None, None]
    assert tokens[0].prefill_s == 0.0 and tokens[-1].decode_s == 2.0 and tokens[-1].prompt_tokens == 2


def test_long_prompt_delays_a_running_stream_by_at_most_one_prefill_chunk():
    chunk = 256
    backend = FakeBackend()
    scheduler = Scheduler(backend, n_ctx=4096, limits=Limits(prefill_chunk=chunk, max_batch=4, pause_s=0.0))
    a = scheduler.submit(request([1, 2, 3], max_tokens=40))
    for _ in range(3):
        scheduler.step()
    long_prompt = [(7 * i) % VOCAB for i in range(2000)]
    b = scheduler.submit(request(long_prompt, max_tokens=4))
    reports = [scheduler.step() for _ in range(12)]
    a_steps = [any(rid == a.id and isinstance(e, GenerationEvent) for rid, e in r.events) for r in reports]
    assert all(a_steps)  # A gets a token on every step while B prefills
    assert all(r.prefill_tokens <= chunk for r in reports)
    b_first = next(i for i, r in enumerate(reports) if b.id in [rid for rid, e in r.events if isinstance(e, GenerationEvent)])
    assert b_first == math.ceil(2000 / chunk) - 1  # B's prefill took 8 steps, one chunk each
    # between two of A's tokens the backend ran one decode pass and at most one chunk of prefill
    calls, segments = backend.calls, []
    decode_at = [i for i, c in enumerate(calls) if c[0] == "decode"]
    for lo, hi in itertools.pairwise(decode_at):
        segments.append(sum(n for kind, n in calls[lo + 1:hi] if kind == "prefill"))
    assert max(segments) == chunk
    rest = run_to_end(scheduler)
    assert tokens_of(reports + rest, b.id) == solo(long_prompt, 4)


def test_short_prompts_share_one_step_of_prefill_budget():
    backend = FakeBackend()
    scheduler = Scheduler(backend, n_ctx=64, limits=Limits(prefill_chunk=20, max_batch=4, pause_s=0.0))
    for p in ([1] * 8, [2] * 8, [3] * 8):
        scheduler.submit(request(p, max_tokens=2))
    report = scheduler.step()
    assert report.prefill_tokens == 20
    assert [c for c in backend.calls] == [("prefill", 8), ("prefill", 8), ("prefill", 4)]


def test_a_higher_priority_request_preempts_and_the_preempted_one_resumes_with_its_cache():
    backend = FakeBackend()
    scheduler = Scheduler(backend, n_ctx=128, limits=Limits(prefill_chunk=64, max_batch=2, pause_s=0.0))
    low1, low2 = scheduler.submit(request([1, 2], 10)), scheduler.submit(request([3, 4], 10))
    early = [scheduler.step() for _ in range(3)]
    high = scheduler.submit(request([5, 6, 7], 5, priority=10))
    reports = early + run_to_end(scheduler)
    assert kinds_of(reports, low2.id) == ["queued", "started", "preempted", "resumed"]
    assert kinds_of(reports, low1.id) == ["queued", "started"]
    for h, p, n in ((low1, [1, 2], 10), (low2, [3, 4], 10), (high, [5, 6, 7], 5)):
        assert tokens_of(reports, h.id) == solo(p, n)
    # kept caches: nothing was prefilled twice
    assert sum(n for kind, n in backend.calls if kind == "prefill") == 2 + 2 + 3
    assert max(r.in_flight for r in reports) == 2


def test_recompute_preemption_drops_the_cache_and_prefills_the_history_again():
    backend = FakeBackend()
    scheduler = Scheduler(backend, n_ctx=128, limits=Limits(prefill_chunk=64, max_batch=1, pause_s=0.0),
                          preempt="recompute")
    low = scheduler.submit(request([1, 2], 8))
    early = [scheduler.step() for _ in range(4)]  # prompt + 4 tokens generated
    high = scheduler.submit(request([5, 6], 3, priority=1))
    reports = early + run_to_end(scheduler)
    assert tokens_of(reports, low.id) == solo([1, 2], 8)
    assert tokens_of(reports, high.id) == solo([5, 6], 3)
    prefills = [n for kind, n in backend.calls if kind == "prefill"]
    assert prefills == [2, 2, 2 + 4 - 1]  # low's prompt, high's prompt, low's history without its pending token


def test_set_priority_brings_a_waiting_conversation_forward():
    scheduler = Scheduler(FakeBackend(), n_ctx=64, limits=Limits(prefill_chunk=64, max_batch=1, pause_s=0.0))
    first, second = scheduler.submit(request([1], 20)), scheduler.submit(request([2], 3))
    reports = [scheduler.step() for _ in range(2)]
    scheduler.set_priority(second.id, 5)
    reports += run_to_end(scheduler)
    assert kinds_of(reports, first.id) == ["queued", "started", "preempted", "resumed"]
    second_done = next(i for i, r in enumerate(reports) if any(rid == second.id and getattr(e, "finish_reason", None)
                                                               for rid, e in r.events))
    first_done = next(i for i, r in enumerate(reports) if any(rid == first.id and getattr(e, "finish_reason", None)
                                                              for rid, e in r.events))
    assert second_done < first_done


def test_cancel_ends_one_stream_and_leaves_the_others_running():
    scheduler = Scheduler(FakeBackend(), n_ctx=64)
    a, b = scheduler.submit(request([1, 2], 30)), scheduler.submit(request([3], 5))
    reports = [scheduler.step() for _ in range(3)]
    scheduler.cancel(a.id)
    scheduler.cancel(12345)  # unknown ids are ignored
    reports += run_to_end(scheduler)
    a_events = list(a.stream(timeout=0))
    assert isinstance(a_events[-1], RequestEvent) and a_events[-1].kind == "cancelled"
    assert len(tokens_of(reports, a.id)) == 3
    assert tokens_of(reports, b.id) == solo([3], 5)


def test_cancel_before_the_first_step():
    scheduler = Scheduler(FakeBackend(), n_ctx=64)
    handle = scheduler.submit(request([1], 5))
    scheduler.cancel(handle.id)
    report = scheduler.step()
    assert [e.kind for _, e in report.events] == ["queued", "cancelled"]
    assert not scheduler.has_work


class LetterDecoder:
    def add(self, token: int) -> str:
        return chr(ord("a") + token % 26)

    def flush(self) -> str:
        return ""


def test_stop_strings_and_end_of_generation_tokens():
    prompt = [1, 2, 3]
    expected = solo(prompt, 12)
    text = "".join(chr(ord("a") + t % 26) for t in expected)
    stop = text[4:6]
    scheduler = Scheduler(FakeBackend(), n_ctx=64)
    h_stop = scheduler.submit(Request(tuple(prompt), greedy, 12, stop=(stop,), decoder=LetterDecoder()))
    h_eos = scheduler.submit(Request(tuple(prompt), greedy, 12, eog_ids=frozenset({expected[2]}), decoder=LetterDecoder()))
    run_to_end(scheduler)
    stop_events = [e for e in h_stop.stream(timeout=0) if isinstance(e, GenerationEvent)]
    assert stop_events[-1].finish_reason == "stop"
    assert "".join(e.text for e in stop_events) == text[:text.find(stop)]
    eos_events = [e for e in h_eos.stream(timeout=0) if isinstance(e, GenerationEvent)]
    assert [e.id for e in eos_events] == expected[:3] and eos_events[-1].finish_reason == "eos"


def test_a_full_context_ends_with_context_and_bad_requests_are_refused():
    scheduler = Scheduler(FakeBackend(), n_ctx=8)
    handle = scheduler.submit(request([1, 2, 3], max_tokens=50))
    run_to_end(scheduler)
    events = [e for e in handle.stream(timeout=0) if isinstance(e, GenerationEvent)]
    assert events[-1].finish_reason == "context" and len(events) == 8 - 3 + 1
    with pytest.raises(ValueError, match="prompt"):
        scheduler.submit(request([], 5))
    with pytest.raises(ValueError, match="n_ctx"):
        scheduler.submit(request(list(range(8)), 5))
    with pytest.raises(ValueError, match="max_tokens"):
        scheduler.submit(request([1], 0))
    with pytest.raises(ValueError, match="preempt"):
        Scheduler(FakeBackend(), n_ctx=8, preempt="swap")


def test_a_bad_prompt_fails_its_own_request_only():
    scheduler = Scheduler(FakeBackend(), n_ctx=64)
    bad, good = scheduler.submit(request([1, VOCAB + 5], 3)), scheduler.submit(request([2], 3))
    reports = run_to_end(scheduler)
    assert kinds_of(reports, bad.id)[-1] == "failed"
    assert tokens_of(reports, good.id) == solo([2], 3)


def test_thermal_limits_shrink_the_batch_preempt_and_recover():
    clock = FakeClock()
    trace = [(0, ThermalState.NOMINAL), (10, ThermalState.SERIOUS), (20, ThermalState.CRITICAL), (30, ThermalState.NOMINAL)]
    monitor = ThermalMonitor(ScriptedProvider(trace, clock), ThermalPolicy(PolicyConfig(cooldown_s=5.0)),
                             clock=clock, poll_interval_s=1.0)
    scheduler = Scheduler(FakeBackend(), n_ctx=512, monitor=monitor, clock=clock)
    handles = [scheduler.submit(request([i + 1], 400)) for i in range(4)]
    timeline = []
    for _ in range(60):
        report = scheduler.step()
        timeline.append((clock.now, report.in_flight, report.limits.prefill_chunk, report.pause_s))
        clock.now += 1.0
    at = {t: (n, chunk, pause) for t, n, chunk, pause in timeline}
    assert at[5.0] == (4, 512, 0.0)
    assert at[15.0] == (2, 128, 0.0)
    assert at[25.0] == (1, 64, 0.5)
    assert at[34.0] == (1, 64, 0.5)  # cooler, but not for long enough yet
    assert at[36.0][0] == 2 and at[41.0][0] == 4 and at[47.0] == (4, 512, 0.0)
    assert sum("preempted" in _kinds(h) for h in handles) == 3  # two at serious, one more at critical


def _kinds(handle) -> list[str]:
    out = []
    while not handle.events.empty():
        event = handle.events.get()
        if isinstance(event, RequestEvent):
            out.append(event.kind)
    return out


def test_decode_timings_reach_the_drift_detector_keyed_by_load():
    clock = FakeClock()
    monitor = ThermalMonitor(ScriptedProvider([(0, ThermalState.NOMINAL)], clock), clock=clock)
    seen = []
    monitor.observe_decode = lambda seconds, load: seen.append(load)
    scheduler = Scheduler(FakeBackend(), n_ctx=64, monitor=monitor, clock=clock)
    scheduler.submit(request([1, 2, 3], 3))
    scheduler.submit(request([4], 3))
    run_to_end(scheduler)
    assert seen[0] == decode_load(2, 3 + 1) == (2, 0)
    assert decode_load(1, 256) == (1, 1) and decode_load(1, 767) == (1, 1) and decode_load(1, 768) == (1, 2)


def test_a_request_goes_on_from_the_cache_it_brings():
    backend = FakeBackend()
    prompt = [5, 9, 2, 7, 1]
    cache = backend.new_cache(64)
    backend.forward(prompt[:3], cache)  # the caller prefilled part of the prompt already
    scheduler = Scheduler(backend, 64)
    handle = scheduler.submit(request(prompt, max_tokens=4, cache=cache))
    reports = run_to_end(scheduler)
    assert tokens_of(reports, handle.id) == solo(prompt, 4)
    assert backend.calls[1] == ("prefill", 2)  # only the two tokens the cache lacked
    assert cache.tokens == prompt + solo(prompt, 4)[:-1]  # the caller's cache went on
    with pytest.raises(ValueError, match="left to feed"):
        scheduler.submit(request(prompt[:3], cache=cache))


def test_run_serves_requests_from_another_thread_until_stopped():
    scheduler = Scheduler(FakeBackend(), n_ctx=64)
    stop = threading.Event()
    worker = threading.Thread(target=scheduler.run, args=(stop, 0.01))
    worker.start()
    try:
        handle = scheduler.submit(request([1, 2, 3], 5))
        events = list(handle.stream(timeout=10))
    finally:
        stop.set()
        worker.join(timeout=10)
    assert not worker.is_alive()
    assert [e.id for e in events if isinstance(e, GenerationEvent)] == solo([1, 2, 3], 5)


def recording_caches(model_path) -> tuple[NumpyBackend, list]:
    """A NumPy backend on ``model_path`` and the list every cache it makes is appended to."""
    gguf = read_gguf(model_path)
    backend = NumpyBackend(gguf, ModelConfig.from_gguf(gguf))
    caches = []
    make_cache = backend.new_cache
    backend.new_cache = lambda n_ctx: caches.append(make_cache(n_ctx)) or caches[-1]
    return backend, caches


def test_a_fresh_zero_page_cache_gets_all_the_room_of_its_request_at_the_start(tiny_model_path):
    """Reserved ahead, room costs a NumPy cache nothing until written; grown in steps, it would be copied inside
    a decode step (of every sequence in a batch)."""
    backend, caches = recording_caches(tiny_model_path)
    scheduler = Scheduler(backend, n_ctx=1024)
    scheduler.submit(request([1, 2, 3], 300))
    scheduler.step()
    assert caches[0].room_is_free and caches[0].n_past == 3
    assert caches[0].capacity == 303  # not GROWTH_STEP's 256


def test_the_real_decoder_batched_through_the_scheduler_matches_solo_decoding(tiny_model_path):
    gguf = read_gguf(tiny_model_path)
    backend = NumpyBackend(gguf, ModelConfig.from_gguf(gguf))
    prompts = [[1, 2, 3, 4], [10, 20], [7] * 9]

    def solo_greedy(prompt: list[int], n: int) -> list[int]:
        cache = backend.new_cache(64)
        logits, out = backend.forward(prompt, cache), []
        for _ in range(n):
            out.append(int(np.argmax(logits)))
            logits = backend.forward([out[-1]], cache)
        return out

    scheduler = Scheduler(backend, n_ctx=64, limits=Limits(prefill_chunk=5, max_batch=4, pause_s=0.0))
    handles = [scheduler.submit(request(p, 8)) for p in prompts]
    reports = run_to_end(scheduler)
    assert max(r.decode_batch for r in reports) == 3
    for h, p in zip(handles, prompts):
        assert tokens_of(reports, h.id) == solo_greedy(p, 8)


# -- NumpyBackend.forward_batch -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_backend(tiny_model_path):
    gguf = read_gguf(tiny_model_path)
    return NumpyBackend(gguf, ModelConfig.from_gguf(gguf))


def test_forward_batch_gives_each_sequence_the_logits_and_cache_it_would_get_alone(tiny_backend):
    prompts = [[1, 2, 3, 4, 5], [9], [30, 31, 32], [100] * 12]
    solo_caches, batch_caches = [], []
    for p in prompts:
        for caches in (solo_caches, batch_caches):
            caches.append(tiny_backend.new_cache(64))
            tiny_backend.forward(p, caches[-1])
    tokens = [11, 12, 13, 14]
    solo_logits = np.stack([tiny_backend.forward([t], c) for t, c in zip(tokens, solo_caches)])
    batch_logits = tiny_backend.forward_batch(tokens, batch_caches)
    assert batch_logits.shape == (4, tiny_backend.config.n_vocab) and batch_logits.dtype == np.float32
    np.testing.assert_allclose(batch_logits, solo_logits, rtol=0, atol=1e-5)
    for solo_cache, batch_cache, p in zip(solo_caches, batch_caches, prompts):
        assert batch_cache.n_past == solo_cache.n_past == len(p) + 1
        np.testing.assert_allclose(batch_cache.export_state().keys[1], solo_cache.export_state().keys[1], atol=1e-5)


def test_forward_batch_refuses_mismatched_or_repeated_caches(tiny_backend):
    cache = tiny_backend.new_cache(8)
    tiny_backend.forward([1], cache)
    with pytest.raises(ValueError, match="one token per cache"):
        tiny_backend.forward_batch([1, 2], [cache])
    with pytest.raises(ValueError, match="same cache twice"):
        tiny_backend.forward_batch([1, 2], [cache, cache])
    full = tiny_backend.new_cache(1)
    tiny_backend.forward([1], full)
    with pytest.raises(ValueError, match="context is full"):
        tiny_backend.forward_batch([1, 2], [cache, full])
    assert cache.n_past == 1  # nothing was written when one cache had no room


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["numpy", "cpu"])  # the C backend inherits forward_batch
def test_batched_greedy_decoding_on_smollm2_equals_each_prompt_alone(backend_name):
    import json
    from pathlib import Path

    from engine.backends import create_backend
    from tests.model_store import model_path

    gguf = read_gguf(model_path("smollm2"))
    backend, _ = create_backend(backend_name, gguf, ModelConfig.from_gguf(gguf))
    assert backend.name == backend_name
    reference = json.loads((Path(__file__).parent.parent / "reference" / "public_smollm2.json").read_text())
    prompts = [case["prompt_ids"] for case in reference["generate"]][:4]
    assert len({len(p) for p in prompts}) == 4  # different lengths, so different positions in one batch
    n = 8

    def greedy_alone(prompt):
        cache = backend.new_cache(64)
        out = [int(np.argmax(backend.forward(prompt, cache)))]
        for _ in range(n - 1):
            out.append(int(np.argmax(backend.forward([out[-1]], cache))))
        return out

    caches = [backend.new_cache(64) for _ in prompts]
    outs = [[int(np.argmax(backend.forward(p, c)))] for p, c in zip(prompts, caches)]
    for _ in range(n - 1):
        logits = backend.forward_batch([o[-1] for o in outs], caches)
        for o, row in zip(outs, logits):
            o.append(int(np.argmax(row)))
    assert outs == [greedy_alone(p) for p in prompts]


def test_bench_concurrency_reports_aggregate_and_single_decode_speed(tiny_model_path, tmp_path):
    """Through the command line; the bare forward loops give every cache its room before timing (as the scheduler
    does: a cache grown inside the loop would time its copy as decode)."""
    from tests.engine.bench_cli import bench_json

    trace = tmp_path / "trace.json"
    trace.write_text('[[0, "nominal"], [3, "critical"], [4, "nominal"]]')
    report = bench_json(tiny_model_path, "--backend", "numpy", "--concurrency", "3", "--prompt-tokens", "12",
                        "--gen-tokens", "260", "--repeats", "1", "--thermal-script", trace, "--json")
    assert report["concurrency"] == 3 and len(set(report["prompt_tokens"])) == 3
    for key in ("decode_tps", "single_decode_tps", "forward_batch_tps", "single_forward_tps",
                "decode_tokens_per_cpu_s", "single_decode_tokens_per_cpu_s"):
        assert report[key] > 0
    assert report["ratio.decode"] == round(report["decode_tps"] / report["single_decode_tps"], 3)
    assert report["forward_cache_growths"] == 0  # 280 positions: a cache starting at GROWTH_STEP's 256 would grow
    assert [d["max_batch"] for d in report["thermal"]["decisions"]][:2] == [8, 1]
