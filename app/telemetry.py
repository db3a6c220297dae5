"""Live telemetry for the dashboard and the status strip: engine samples from the worker, system samples here.

Two sources, neither of which calls the engine from the GUI thread:

* ``EngineProbe`` runs on the engine thread, inside the worker: it turns the generation's events into
  ``EngineSample``s (throughput, KV cache, backend memory) at most every ``ENGINE_INTERVAL_S`` and on every
  change of phase; the worker emits them through a queued signal.
* ``SystemSampler`` reads psutil (process and system memory, CPU) and the thermal provider. These are cheap
  calls (well under a millisecond), made on the GUI thread by ``Telemetry``'s timer: once a second while the
  dashboard is shown, every ``STRIP_INTERVAL_S`` while only the status strip is, and not at all while neither is.

``TelemetryHistory`` keeps the last minutes of every series for the charts. No widgets here.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from collections.abc import Callable, Iterable

import psutil
from PySide6.QtCore import QObject, QTimer, Signal, Slot

from engine.model import CHAT_PREFILL_CHUNK, KVCacheUsage
from engine.remote import RemoteModel
from engine.remote.model import RemoteStats
from engine.thermal import Limits, PolicyDecision, ThermalPolicy, ThermalProvider, ThermalState, default_provider
from engine.thermal.monitor import POLL_INTERVAL_S

from .qt_compat import emit
from .speculation import estimated_speedup

ENGINE_INTERVAL_S = 0.5  # engine samples while generating, so the decode rate is measured over half a second
DASHBOARD_INTERVAL_S = 1.0
STRIP_INTERVAL_S = 5.0
HISTORY_S = 600.0  # the longest chart window is 5 minutes; keep twice that
THERMAL_LEVELS = (ThermalState.UNKNOWN, ThermalState.NOMINAL, ThermalState.FAIR, ThermalState.SERIOUS,
                  ThermalState.CRITICAL)  # the thermal chart's rows, bottom to top
CONTEXT_WARN_FRACTION = 0.8
LOW_MEMORY_FRACTION = 0.1

PHASES = ("none", "idle", "prefill", "decode")  # none: no model loaded


@dataclasses.dataclass(frozen=True)
class EngineSample:
    """What the engine is doing and holding, as the worker saw it at ``time`` (time.monotonic())."""

    time: float
    phase: str  # one of PHASES
    model: str = ""
    backend: str = ""
    request_id: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_tps_now: float = 0.0  # over the interval since the previous sample of this request
    prefill_chunk: int = 0  # tokens per prefill step the worker asks for
    batch: int = 0  # sequences in flight
    weights_bytes: int = 0
    active_weights_bytes: int | None = None  # weight bytes one decode step reads (a sparse model); None: all
    scratch_bytes: int = 0
    device_active_bytes: int | None = None  # MLX only
    device_peak_bytes: int | None = None
    device_cache_bytes: int | None = None
    kv: KVCacheUsage | None = None
    speculation: str = ""  # the reply's speculative decoding ("prompt lookup", "draft <name>"); "" for none
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    speedup_estimate: float | None = None  # decode tok/s so far over a plain step's, as speculation measured it
    remote: RemoteStats | None = None  # a remote model's endpoint: requests in flight, errors, latency

    @property
    def prefill_tps(self) -> float:
        computed = self.prompt_tokens - self.cached_tokens
        return computed / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def generating(self) -> bool:
        return self.phase in ("prefill", "decode")


def read_engine(model, phase: str, now: float, request_id: int = 0, event=None, decode_tps_now: float = 0.0,
                batch: int = 0, speculation=None, prefill_chunk: int = CHAT_PREFILL_CHUNK) -> EngineSample:
    """An EngineSample of ``model`` (an engine.model.Model, or None); call it on the thread that runs the model.

    ``speculation`` is the reply's ``(engine.speculative.Speculator, method)``, or None."""
    if model is None:
        return EngineSample(now, "none")
    memory = model.backend.memory()
    timings = {}
    if event is not None:
        timings = {"prompt_tokens": event.prompt_tokens, "cached_tokens": event.cached_tokens,
                   "generated_tokens": event.generated_tokens, "prefill_s": event.prefill_s,
                   "decode_s": event.decode_s}
    if speculation is not None and event is not None:  # (before the first token the stats are the last reply's)
        speculator, method = speculation
        s = speculator.stats
        timings.update(speculation=method, drafted_tokens=s.proposed, accepted_tokens=s.accepted,
                       speedup_estimate=estimated_speedup(event.decode_tps, speculator.controller.costs.step_s))
    return EngineSample(now, phase, model.name, model.backend.name, request_id, **timings,
                        decode_tps_now=decode_tps_now, prefill_chunk=prefill_chunk, batch=batch,
                        weights_bytes=memory.weights_bytes, active_weights_bytes=memory.active_weights_bytes,
                        scratch_bytes=memory.scratch_bytes,
                        device_active_bytes=memory.device_active_bytes, device_peak_bytes=memory.device_peak_bytes,
                        device_cache_bytes=memory.device_cache_bytes, kv=model.kv_cache_usage,
                        remote=model.scheduler.stats() if isinstance(model, RemoteModel) else None)


class EngineProbe:
    """Makes EngineSamples on the engine thread: on load, at the start and first token of a reply, every
    ``interval_s`` while it streams, and when it ends. ``send`` is called with each (the worker emits it)."""

    def __init__(self, send: Callable[[EngineSample], None], interval_s: float = ENGINE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.send, self.interval_s, self.clock = send, interval_s, clock
        self._speculation = None  # the running reply's (Speculator, method)
        self._prefill_chunk = CHAT_PREFILL_CHUNK  # the running reply's, as the thermal policy allowed it
        self._request_id = 0
        self._started_at = self._first_at = self._sent_at = None
        self._last_event = None

    def model_changed(self, model) -> None:
        """A model was loaded (or closed, ``model`` None)."""
        self.send(read_engine(model, "idle" if model is not None else "none", self.clock()))

    def started(self, model, request_id: int, speculator=None, method: str = "",
                prefill_chunk: int = CHAT_PREFILL_CHUNK) -> None:
        """A reply starts: the prompt is rendered, tokenized and prefilled next, ``prefill_chunk`` tokens a step;
        ``speculator`` (an engine.speculative.Speculator, ``method`` naming it) drafts for it, if any."""
        self._request_id, self._started_at, self._first_at, self._last_event = request_id, self.clock(), None, None
        self._speculation = (speculator, method) if speculator is not None else None
        self._prefill_chunk = prefill_chunk
        self.send(read_engine(model, "prefill", self._started_at, request_id, batch=1,
                              prefill_chunk=prefill_chunk))

    def event(self, model, event) -> None:
        """A generated token; samples the first one at once (it ends prefill), later ones every interval."""
        now = self.clock()
        first = self._first_at is None
        if first:
            self._first_at = now
        elif now - self._sent_at < self.interval_s:
            return
        rate = 0.0 if first else _decode_rate(self._last_event, event)
        self.send(read_engine(model, "decode", now, self._request_id, event, rate, batch=1,
                              speculation=self._speculation, prefill_chunk=self._prefill_chunk))
        self._sent_at, self._last_event = now, event

    def batched(self, model, request_id: int, decode_tps: float, batch: int) -> None:
        """Replies decode together (app/reply_stream.py): ``decode_tps`` is their aggregate rate over the last interval,
        ``batch`` how many sequences the last step decoded; ``request_id`` the reply on screen (0: none)."""
        self.send(read_engine(model, "decode", self.clock(), request_id, decode_tps_now=decode_tps, batch=batch))

    def finished(self, model, last_event) -> dict:
        """The reply ended; returns the stats it adds: ``time_to_first_token_s`` (from the start of the request)."""
        self.send(read_engine(model, "idle", self.clock(), self._request_id, last_event, speculation=self._speculation,
                              prefill_chunk=self._prefill_chunk))
        if self._first_at is None or self._started_at is None:
            return {}
        return {"time_to_first_token_s": round(self._first_at - self._started_at, 4)}


def _decode_rate(before, after) -> float:
    tokens, seconds = after.index - before.index, after.decode_s - before.decode_s
    return tokens / seconds if seconds > 0 and tokens > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class SystemSample:
    """The process and the machine at ``time`` (time.monotonic())."""

    time: float
    rss_bytes: int  # this process's resident memory
    process_cpu_percent: float  # of the whole machine (all cores = 100)
    system_cpu_percent: float
    total_bytes: int
    available_bytes: int
    thermal: ThermalState
    thermal_source: str  # the provider's name, or why it can only say "unknown"
    allowed_prefill_chunk: int  # what the thermal policy allows
    allowed_batch: int

    @property
    def used_bytes(self) -> int:
        return self.total_bytes - self.available_bytes


class SystemSampler:
    """Reads psutil and the thermal provider (the provider at most every ``thermal_interval_s``); no Qt."""

    def __init__(self, process: psutil.Process | None = None, provider: ThermalProvider | None = None,
                 policy: ThermalPolicy | None = None, clock: Callable[[], float] = time.monotonic,
                 thermal_interval_s: float = POLL_INTERVAL_S, applied: Callable[[], Limits] | None = None):
        self.process = process or psutil.Process()
        self.provider = provider or default_provider()
        self.policy = policy or ThermalPolicy()
        self.applied = applied  # the limits the engine applies (its thread runs the policy); None: run our own
        self.clock, self.thermal_interval_s = clock, thermal_interval_s
        self.cpu_count = psutil.cpu_count() or os.cpu_count() or 1
        self._thermal, self._thermal_at = ThermalState.UNKNOWN, None
        self.process.cpu_percent(None)  # the first call only sets the reference point
        psutil.cpu_percent(None)

    def sample(self) -> SystemSample:
        now = self.clock()
        if self._thermal_at is None or now - self._thermal_at >= self.thermal_interval_s:
            self._thermal, self._thermal_at = self.provider.read(), now
        if self.applied is None:
            self.policy.update(now, self._thermal)
        limits, vm = self.policy.limits if self.applied is None else self.applied(), psutil.virtual_memory()
        # psutil divides by the time since the previous call; right after it that is noise, so clamp
        process_cpu = min(100.0, self.process.cpu_percent(None) / self.cpu_count)
        return SystemSample(now, self.process.memory_info().rss, process_cpu,
                            min(100.0, psutil.cpu_percent(None)), int(vm.total), int(vm.available), self._thermal,
                            self.provider.reason or self.provider.name, limits.prefill_chunk, limits.max_batch)


class TelemetryHistory:
    """Time series by name: ``(time, value)`` points, the oldest dropped after ``keep_s``; no Qt."""

    def __init__(self, keep_s: float = HISTORY_S):
        self.keep_s = keep_s
        self._series: dict[str, collections.deque] = collections.defaultdict(collections.deque)

    def record(self, name: str, t: float, value: float) -> None:
        points = self._series[name]
        points.append((t, float(value)))
        while points and points[0][0] < t - self.keep_s:
            points.popleft()

    def points(self, name: str, since: float = float("-inf")) -> list[tuple[float, float]]:
        """The points at or after ``since``, plus the one just before it (so a line enters the window)."""
        points = self._series.get(name)
        if not points:
            return []
        start = len(points)
        while start > 0 and points[start - 1][0] >= since:
            start -= 1
        return list(points)[max(0, start - 1):]

    def last(self, name: str, default: float | None = None) -> float | None:
        points = self._series.get(name)
        return points[-1][1] if points else default

    def names(self) -> list[str]:
        return [name for name, points in self._series.items() if points]


def record_system(history: TelemetryHistory, s: SystemSample) -> None:
    """Add a system sample's values to the chart series."""
    for name, value in (("rss", s.rss_bytes), ("cpu_process", s.process_cpu_percent),
                        ("cpu_system", s.system_cpu_percent), ("system_used", s.used_bytes),
                        ("system_available", s.available_bytes), ("thermal", THERMAL_LEVELS.index(s.thermal)),
                        ("allowed_chunk", s.allowed_prefill_chunk), ("allowed_batch", s.allowed_batch)):
        history.record(name, s.time, value)


def record_engine(history: TelemetryHistory, s: EngineSample, previous: EngineSample | None) -> None:
    """Add an engine sample's values to the chart series; a reply's prefill becomes one step at its own times."""
    history.record("decode_tps", s.time, s.decode_tps_now if s.phase == "decode" else 0.0)
    history.record("prefill_chunk", s.time, s.prefill_chunk)
    history.record("batch", s.time, s.batch)
    history.record("kv_allocated", s.time, s.kv.allocated_bytes if s.kv else 0)
    for name in ("device_active_bytes", "device_peak_bytes", "device_cache_bytes"):
        value = getattr(s, name)
        if value is not None:
            history.record(name, s.time, value)
    first_token = (s.phase == "decode" and s.prefill_s > 0
                   and (previous is None or previous.request_id != s.request_id or previous.phase != "decode"))
    if first_token:  # the prefill ran from (now - prefill_s) until now at prefill_tps
        history.record("prefill_tps", s.time - s.prefill_s, s.prefill_tps)
        history.record("prefill_tps", s.time, 0.0)


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """The process's resident memory split by what holds it, with the KV cache's use and limits."""

    rss_bytes: int
    weights_bytes: int
    kv_allocated_bytes: int
    kv_used_bytes: int
    kv_max_bytes: int
    scratch_bytes: int
    kv_used_positions: int
    n_ctx: int
    active_weights_bytes: int | None = None  # of weights_bytes, what one decode step reads (a sparse model)

    @property
    def sparse(self) -> bool:
        """A mixture of experts: every expert resident, only the chosen ones read per token."""
        return self.active_weights_bytes is not None and self.active_weights_bytes < self.weights_bytes

    @property
    def other_bytes(self) -> int:
        """Resident memory not held by the model: Python, Qt, the app (never negative)."""
        return max(0, self.rss_bytes - self.weights_bytes - self.kv_allocated_bytes - self.scratch_bytes)

    @property
    def context_fraction(self) -> float:
        return self.kv_used_positions / self.n_ctx if self.n_ctx else 0.0


def memory_breakdown(system: SystemSample, engine: EngineSample) -> MemoryBreakdown | None:
    """The breakdown for the loaded model; None when no model is loaded."""
    if engine.phase == "none":
        return None
    kv = engine.kv or KVCacheUsage(0, 0, 0, 0, 0)
    return MemoryBreakdown(system.rss_bytes, engine.weights_bytes, kv.allocated_bytes,
                           kv.used_positions * kv.bytes_per_position, kv.max_bytes, engine.scratch_bytes,
                           kv.used_positions, kv.max_positions, engine.active_weights_bytes)


def memory_warnings(breakdown: MemoryBreakdown | None, system: SystemSample) -> list[str]:
    """Warnings to show before the context or the memory runs out."""
    warnings = []
    if breakdown is not None and breakdown.context_fraction >= CONTEXT_WARN_FRACTION:
        warnings.append(f"The conversation fills {breakdown.context_fraction:.0%} of the {breakdown.n_ctx:,}-token "
                        f"context; older messages will soon be left out of answers.")
    if breakdown is not None:
        growth = breakdown.kv_max_bytes - breakdown.kv_allocated_bytes
        if growth > system.available_bytes:
            warnings.append(f"Filling the context needs {format_bytes(growth)} more for the KV cache, but only "
                            f"{format_bytes(system.available_bytes)} is available.")
    if system.available_bytes < LOW_MEMORY_FRACTION * system.total_bytes:
        warnings.append(f"System memory is low: {format_bytes(system.available_bytes)} of "
                        f"{format_bytes(system.total_bytes)} available.")
    return warnings


def format_bytes(n: float) -> str:
    """Bytes in the unit people read: 812 MB, 1.4 GB (decimal units, as OS memory monitors show them)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 100 and unit == "GB" else f"{value:.0f} {unit}"
    return f"{n:.0f} B"


class Telemetry(QObject):
    """Collects engine samples (pushed by the worker) and system samples (its own timer) into a history.

    The timer runs once a second while a dashboard watches, every STRIP_INTERVAL_S while only the status
    strip does, and stops when nobody watches. Views read ``history``, ``system`` and ``engine``.

    Signals:
        system_sampled(object): a new SystemSample.
        engine_sampled(object): a new EngineSample.
    """

    system_sampled = Signal(object)
    engine_sampled = Signal(object)

    def __init__(self, sampler: SystemSampler | None = None, history: TelemetryHistory | None = None,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.sampler = sampler or SystemSampler()
        self.history = history or TelemetryHistory()
        self.engine = EngineSample(self.sampler.clock(), "none")
        self.system: SystemSample | None = None
        self.decision: PolicyDecision | None = None  # the engine's last thermal policy decision
        self.samples_taken = 0
        self._watchers: dict[str, bool] = {}  # name -> wants detail (1 Hz)
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.sample_now)

    def watch(self, name: str, active: bool, detailed: bool = False) -> None:
        """``name`` starts (``active``) or stops watching; detailed watchers get one sample a second."""
        before = self.interval_s
        if active:
            self._watchers[name] = detailed
        else:
            self._watchers.pop(name, None)
        interval = self.interval_s
        if interval is None:
            self._timer.stop()
        elif interval != before or not self._timer.isActive():
            self._timer.start(round(interval * 1000))
            if before is None or interval < before:
                self.sample_now()  # a new watcher sees fresh numbers at once

    @Slot(object)
    def add_thermal_decision(self, decision: PolicyDecision) -> None:
        """The engine's thermal policy changed its limits; views show it at their next redraw."""
        self.decision = decision

    @property
    def interval_s(self) -> float | None:
        """Seconds between system samples now; None while nobody watches."""
        if not self._watchers:
            return None
        return DASHBOARD_INTERVAL_S if any(self._watchers.values()) else STRIP_INTERVAL_S

    @Slot()
    def sample_now(self) -> None:
        sample = self.sampler.sample()
        self.system = sample
        self.samples_taken += 1
        record_system(self.history, sample)
        emit(self.system_sampled, sample)

    @Slot(object)
    def add_engine_sample(self, sample: EngineSample) -> None:
        record_engine(self.history, sample, self.engine)
        self.engine = sample
        emit(self.engine_sampled, sample)

    def decode_tps(self) -> float:
        """The decode rate now: the last interval's while a reply streams, else 0."""
        return self.engine.decode_tps_now if self.engine.phase == "decode" else 0.0

    def breakdown(self) -> MemoryBreakdown | None:
        return memory_breakdown(self.system, self.engine) if self.system is not None else None

    def warnings(self) -> list[str]:
        return memory_warnings(self.breakdown(), self.system) if self.system is not None else []


def series_max(history: TelemetryHistory, names: Iterable[str]) -> float:
    """The largest value kept in any of ``names`` (0 when empty); charts scale their y axis from it."""
    return max((v for name in names for _, v in history.points(name)), default=0.0)
