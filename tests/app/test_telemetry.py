"""Telemetry without a window: engine samples, system samples against the operating system, history, memory warnings, CSV."""

import csv
import dataclasses
import io
import time
from types import SimpleNamespace

import pytest

from app import telemetry as telemetry_module

from app.generation_history import GenerationRecord, export_csv, recent_generations, write_csv
from app.store import ConversationStore
from app.telemetry import (EngineProbe, EngineSample, SystemSample, SystemSampler, Telemetry, TelemetryHistory,
                           format_bytes, memory_breakdown, memory_warnings, record_engine)
from app.engine_host import EngineHost
from engine.generate import GenerationEvent
from engine.model import KVCacheUsage
from engine.thermal import ScriptedProvider, ThermalState

from . import os_memory
from .fake_engine import FakeFactory, FakeModel

GB = 10**9


class Clock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def event(index, prefill_s=0.5, decode_s=0.0, prompt=40, cached=8, finish=None):
    return GenerationEvent(index, "x", -0.1, index, prompt, cached, prefill_s, decode_s, finish)


def system(available=8 * GB, total=16 * GB, rss=GB, t=0.0):
    return SystemSample(t, rss, 10.0, 20.0, total, available, ThermalState.NOMINAL, "test", 512, 8)


# -- engine samples -------------------------------------------------------------------------------------
def test_probe_samples_the_first_token_at_once_then_every_interval_and_reports_time_to_first_token():
    clock, sent, model = Clock(), [], FakeModel()
    probe = EngineProbe(sent.append, interval_s=0.5, clock=clock)
    probe.started(model, request_id=7)
    clock.t += 0.6
    probe.event(model, event(0, prefill_s=0.5))  # the first token ends prefill: sampled at once
    for i, dt in enumerate((0.1, 0.1, 0.1, 0.3), start=1):  # 0.6 s of decode: one more sample at 0.6 s
        clock.t += dt
        probe.event(model, event(i, decode_s=0.1 * i + (0.2 if i == 4 else 0.0)))
    timing = probe.finished(model, event(4, decode_s=0.6, finish="eos"))
    assert [s.phase for s in sent] == ["prefill", "decode", "decode", "idle"]
    assert all(s.request_id == 7 for s in sent)
    assert sent[0].batch == 1 and sent[-1].batch == 0 and sent[0].prefill_chunk == 128
    assert sent[1].decode_tps_now == 0.0 and sent[1].prefill_tps == pytest.approx(32 / 0.5)
    assert sent[2].decode_tps_now == pytest.approx(4 / 0.6)  # tokens 1..4 over their 0.6 s of decode
    assert timing == {"time_to_first_token_s": pytest.approx(0.6)}
    assert sent[1].kv is not None and sent[1].weights_bytes == 1_000_000


def test_probe_without_a_model_says_none():
    sent = []
    EngineProbe(sent.append).model_changed(None)
    assert sent[0].phase == "none" and sent[0].kv is None


def test_worker_streams_telemetry_through_a_reply(qtbot):
    host = EngineHost(FakeFactory(FakeModel(["a"] * 40, token_s=0.03, prefill_s=0.2)), lambda options: options)
    samples = []
    host.telemetry.connect(samples.append)
    try:
        with qtbot.waitSignal(host.finished, timeout=20000) as finished:
            request = host.generate("/m.gguf", 4096, [{"role": "user", "content": "hi"}], {"max_tokens": 40})
    finally:
        host.shutdown()
    phases = [s.phase for s in samples if s.request_id == request]
    assert samples[0].phase == "idle"  # loaded
    assert phases[0] == "prefill" and phases[-1] == "idle" and phases.count("decode") >= 2
    decoding = [s for s in samples if s.phase == "decode" and s.decode_tps_now > 0]
    assert decoding and all(s.decode_tps_now < 1 / 0.03 * 1.5 for s in decoding)
    assert samples[-1].kv.used_positions == 10 + 40 and samples[-1].generated_tokens == 40
    stats = finished.args[1]
    assert stats["time_to_first_token_s"] >= 0.2


# -- history ----------------------------------------------------------------------------------------------
def test_history_returns_the_window_and_the_point_before_it_and_forgets_old_points():
    history = TelemetryHistory(keep_s=100)
    for t in range(0, 200, 10):
        history.record("rss", float(t), t * 2)
    points = history.points("rss", since=150)
    assert points[0] == (140.0, 280.0) and points[-1] == (190.0, 380.0) and len(points) == 6
    assert history.points("rss")[0][0] == 90.0  # older than keep_s before the newest point: dropped
    assert history.points("missing") == [] and history.last("rss") == 380.0


def test_a_prefill_is_recorded_as_a_step_over_its_own_time():
    history = TelemetryHistory()
    start = EngineSample(10.0, "prefill", request_id=1, batch=1)
    first = EngineSample(10.5, "decode", request_id=1, prompt_tokens=100, cached_tokens=20, prefill_s=0.4, batch=1)
    later = EngineSample(11.0, "decode", request_id=1, prompt_tokens=100, cached_tokens=20, prefill_s=0.4,
                         decode_tps_now=25.0, batch=1)
    for previous, sample in ((None, start), (start, first), (first, later)):
        record_engine(history, sample, previous)
    assert history.points("prefill_tps") == [(pytest.approx(10.1), 200.0), (10.5, 0.0)]
    assert history.points("decode_tps") == [(10.0, 0.0), (10.5, 0.0), (11.0, 25.0)]
    assert [v for _, v in history.points("batch")] == [1, 1, 1]


# -- system samples -------------------------------------------------------------------------------------
def test_system_sample_agrees_with_the_operating_system_within_5_percent():
    sample = SystemSampler().sample()  # psutil inside; the figures here come from /proc (Linux) or ps/vm_stat
    assert sample.rss_bytes == pytest.approx(os_memory.process_rss_bytes(), rel=0.05)
    assert sample.available_bytes == pytest.approx(os_memory.available_bytes(), rel=0.05)
    assert sample.total_bytes == pytest.approx(os_memory.total_bytes(), rel=0.01)
    assert sample.used_bytes == sample.total_bytes - sample.available_bytes


def test_process_cpu_is_the_cpu_time_used_over_the_wall_time_across_all_cores():
    sampler = SystemSampler()
    cpu0, t0 = os_memory.process_cpu_seconds(), time.monotonic()
    while time.monotonic() - t0 < 0.6:  # one core busy (as much as the loaded machine allows)
        pass
    cpu1, t1 = os_memory.process_cpu_seconds(), time.monotonic()
    sample = sampler.sample()
    assert cpu1 - cpu0 > 0.05  # the loop did run, however little of a core the machine gave it
    expected = 100.0 * (cpu1 - cpu0) / (t1 - t0) / sampler.cpu_count
    assert sample.process_cpu_percent == pytest.approx(expected, rel=0.25, abs=3.0)


def test_cpu_figures_above_100_right_after_a_reading_are_clamped(monkeypatch):
    # psutil divides by the time since the previous call: a few ms after it, it can report more than all cores
    process = SimpleNamespace(cpu_percent=lambda interval: 0.0, memory_info=lambda: SimpleNamespace(rss=1))
    sampler = SystemSampler(process=process)
    process.cpu_percent = lambda interval: 450.0 * sampler.cpu_count
    monkeypatch.setattr(telemetry_module.psutil, "cpu_percent", lambda interval: 130.0)
    sample = sampler.sample()
    assert (sample.process_cpu_percent, sample.system_cpu_percent) == (100.0, 100.0)
    process.cpu_percent = lambda interval: 30.0 * sampler.cpu_count
    monkeypatch.setattr(telemetry_module.psutil, "cpu_percent", lambda interval: 42.0)
    sample = sampler.sample()
    assert (sample.process_cpu_percent, sample.system_cpu_percent) == (pytest.approx(30.0), 42.0)


def test_thermal_state_is_polled_at_its_interval_and_the_policy_limits_follow_it():
    clock = Clock(0.0)
    provider = ScriptedProvider([(0, ThermalState.NOMINAL), (5, ThermalState.CRITICAL)], clock, start=0.0)
    sampler = SystemSampler(provider=provider, clock=clock, thermal_interval_s=2.0)
    first = sampler.sample()
    clock.t = 5.5
    hot = sampler.sample()
    clock.t = 6.0
    held = sampler.sample()  # the provider is not read again within 2 s
    assert (first.thermal, first.allowed_prefill_chunk, first.allowed_batch) == (ThermalState.NOMINAL, 512, 8)
    assert (hot.thermal, hot.allowed_prefill_chunk, hot.allowed_batch) == (ThermalState.CRITICAL, 64, 1)
    assert held.thermal == ThermalState.CRITICAL and held.thermal_source == "scripted"


def test_watchers_set_the_sampling_rate_and_nobody_watching_stops_it(qtbot):
    telemetry = Telemetry(SystemSampler())
    assert telemetry.interval_s is None and not telemetry._timer.isActive()
    telemetry.watch("status strip", True)
    assert telemetry.interval_s == 5.0 and telemetry._timer.interval() == 5000 and telemetry.samples_taken == 1
    telemetry.watch("dashboard", True, detailed=True)
    assert telemetry._timer.interval() == 1000 and telemetry.samples_taken == 2
    qtbot.waitUntil(lambda: telemetry.samples_taken >= 4, timeout=15000)
    telemetry.watch("dashboard", False)
    assert telemetry._timer.interval() == 5000
    telemetry.watch("status strip", False)
    taken = telemetry.samples_taken
    qtbot.wait(2500)
    assert not telemetry._timer.isActive() and telemetry.samples_taken == taken


# -- memory -------------------------------------------------------------------------------------------------
def engine_with_kv(used, n_ctx=1000, per_position=1000, allocated=256_000):
    return EngineSample(0.0, "idle", weights_bytes=300_000_000,
                        kv=KVCacheUsage(used, n_ctx, allocated, per_position, n_ctx * per_position))


def test_breakdown_splits_resident_memory_and_the_kv_cache():
    b = memory_breakdown(system(rss=500_000_000), engine_with_kv(100))
    assert (b.weights_bytes, b.kv_allocated_bytes, b.kv_used_bytes, b.kv_max_bytes) == (300e6, 256e3, 1e5, 1e6)
    assert b.other_bytes == 500_000_000 - 300_000_000 - 256_000 and b.context_fraction == 0.1
    assert memory_breakdown(system(), EngineSample(0.0, "none")) is None


def test_a_sparse_model_shows_all_experts_resident_and_the_bytes_read_per_token(qtbot):
    from app.ui.dashboard_page import MemoryView

    sparse = dataclasses.replace(engine_with_kv(100), active_weights_bytes=40_000_000)
    b = memory_breakdown(system(rss=500_000_000), sparse)
    assert b.sparse and b.active_weights_bytes == 40_000_000
    assert not memory_breakdown(system(rss=500_000_000), engine_with_kv(100)).sparse  # None: every byte is read
    view = MemoryView()
    qtbot.addWidget(view)
    view.show_breakdown(b, [])
    assert "weights 300 MB (all experts; 40 MB read per token)" in view.process_text.text()
    view.show_breakdown(memory_breakdown(system(rss=500_000_000), engine_with_kv(100)), [])
    assert "read per token" not in view.process_text.text()


def test_warnings_come_before_the_context_or_the_memory_runs_out():
    assert memory_warnings(memory_breakdown(system(), engine_with_kv(100)), system()) == []
    context = memory_warnings(memory_breakdown(system(), engine_with_kv(850)), system())
    assert len(context) == 1 and "85%" in context[0] and "1,000-token" in context[0]
    big = engine_with_kv(10, n_ctx=100_000, per_position=200_000)  # 20 GB at the full context
    memory = memory_warnings(memory_breakdown(system(), big), system())
    assert len(memory) == 1 and "more for the KV cache" in memory[0]
    low = memory_warnings(None, system(available=GB))
    assert len(low) == 1 and "System memory is low" in low[0]


def test_bytes_read_as_people_read_them():
    assert [format_bytes(n) for n in (512, 2_500, 98_362_432, 1_450_000_000, 250 * GB)] == [
        "512 B", "2 KB", "98 MB", "1.4 GB", "250 GB"]


# -- per-answer history ---------------------------------------------------------------------------------
def test_recent_answers_keep_their_stats_and_export_as_csv(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    conv = store.create_conversation("Boats")
    store.add_message(conv.id, "user", "hi")
    stats = {"model": "M", "prompt_tokens": 40, "cached_tokens": 30, "generated_tokens": 12, "prefill_s": 0.05,
             "time_to_first_token_s": 0.07, "prefill_tps": 200.0, "decode_tps": 31.5, "finish_reason": "eos"}
    store.add_message(conv.id, "assistant", "hello", stats=stats)
    store.add_message(conv.id, "assistant", "old", stats={"prefill_s": 0.25, "finish_reason": "length"})
    store.add_message(conv.id, "assistant", "", state="streaming")  # no stats yet: not listed
    old, new = recent_generations(store)
    assert (new.conversation, new.cached_tokens, new.time_to_first_token_s) == ("Boats", 30, 0.07)
    assert old.time_to_first_token_s == 0.25  # answers from before the dashboard: the engine's prefill time
    assert new.cells()[6:9] == ["0.07 s", "200 tok/s", "31.5 tok/s"]
    assert export_csv([new, old], tmp_path / "a.csv") == 2
    rows = list(csv.DictReader((tmp_path / "a.csv").read_text(encoding="utf-8").splitlines()))
    assert rows[0]["decode_tokens_per_s"] == "31.5" and rows[0]["cached_tokens"] == "30"
    assert rows[1]["finish_reason"] == "length" and set(rows[0]) >= {"started", "prompt_tokens", "model"}
    assert write_csv([], io.StringIO()) == 0
    store.close()


def test_a_record_reads_an_error_answer():
    from app.store import Message
    record = GenerationRecord.from_message(Message(1, 1, 1, "assistant", "", "error", {"error": "boom"}, 0.0), "C")
    assert record.finish_reason == "error" and record.generated_tokens == 0


# -- the engine's KV accessor on the real model ---------------------------------------------------------
@pytest.mark.slow
def test_kv_cache_usage_grows_with_the_conversation(small_model):
    import engine.model
    model = engine.model.load(small_model, n_ctx=1024)
    try:
        empty = model.kv_cache_usage
        _, events = model.chat([{"role": "user", "content": "Say hello."}], max_tokens=8)
        last = list(events)[-1]
        usage = model.kv_cache_usage
    finally:
        model.close()
    assert (empty.used_positions, empty.allocated_bytes, empty.max_positions) == (0, 0, 1024)
    assert usage.used_positions == last.prompt_tokens + last.generated_tokens - 1  # the last token is not fed back
    assert usage.used_positions * usage.bytes_per_position <= usage.allocated_bytes <= usage.max_bytes
    assert usage.max_bytes == usage.bytes_per_position * 1024  # SmolLM2 has no sliding-window layers
