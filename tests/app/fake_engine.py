"""A stand-in for engine.model.Model with scripted tokens, delays and failures, for fast worker and UI tests."""

from __future__ import annotations

import threading
import time

from engine.backends.base import MemoryStats
from engine.generate import GenerationEvent
from engine.model import KVCacheUsage
from engine.reasoning import ReasoningProfile, count_thinking_tokens
from engine.session import SessionError
from engine.thermal import Limits, ScriptedProvider, ThermalMonitor, ThermalState


class FakeBackend:
    """The part of a backend the worker reads: its name and its memory."""

    name = "fake"

    def memory(self) -> MemoryStats:
        return MemoryStats(weights_bytes=1_000_000, kv_cache_bytes=0)


class FakeModel:
    """Streams ``pieces`` one per token after ``prefill_s``; ``fail_with`` is raised from chat(). ``reasoning`` is
    the chat template's reasoning profile (none by default); thinking tokens are counted over the pieces."""

    def __init__(self, pieces=("Hello", " there", "!"), token_s=0.0, prefill_s=0.0, fail_with=None,
                 n_ctx=4096, dropped=0, reasoning=ReasoningProfile()):
        self.name, self.n_ctx, self.notices, self.sha256 = "Fake", n_ctx, [], "f" * 64
        self.pieces, self.token_s, self.prefill_s = list(pieces), token_s, prefill_s
        self.fail_with, self.dropped = fail_with, dropped
        self.config = type("Config", (), {"arch": "fake"})()
        self.backend = FakeBackend()
        self.positions = 0  # "KV cache" positions: the last prompt and reply
        self.calls: list[list[dict]] = []
        self.template_vars: list[dict | None] = []  # per chat() call
        self.reasoning = reasoning
        self.prefill_chunks: list[int] = []  # per chat() call
        self.closed = False
        self._cancel = threading.Event()

    def chat(self, messages, params=None, max_tokens=512, overflow="drop_oldest", prefill_chunk=128, speculation=None,
             template_vars=None):
        self.calls.append(messages)
        self.template_vars.append(template_vars)
        self.prefill_chunks.append(prefill_chunk)
        if self.fail_with is not None:
            raise self.fail_with
        return self.dropped, self._events(min(max_tokens, len(self.pieces)))

    def _events(self, n):
        self._cancel.clear()
        start = time.perf_counter()
        time.sleep(self.prefill_s)
        first = time.perf_counter()
        for i in range(n):
            if i:
                time.sleep(self.token_s)
            cancelled = self._cancel.is_set()
            finish = "cancelled" if cancelled else ("eos" if i == n - 1 else None)
            now = time.perf_counter()
            self.positions = 10 + i + 1
            yield GenerationEvent(i, self.pieces[i], -0.1, i, 10, 0, first - start, now - first, finish)
            if cancelled:
                return

    def thinking_stats(self, n_generated, sequence=None):
        if self.reasoning.syntax is None:
            return {}
        return {"thinking_tokens": count_thinking_tokens(self.pieces[:n_generated], self.reasoning.syntax,
                                                         self.reasoning.opens_on)}

    @property
    def kv_cache_usage(self) -> KVCacheUsage:
        return KVCacheUsage(self.positions, self.n_ctx, 256 * 1000, 1000, self.n_ctx * 1000)

    def cancel(self):
        self._cancel.set()

    def save_session(self, path, conversation=None):
        raise SessionError("the fake model keeps no state")

    def load_session(self, path):
        raise SessionError("the fake model keeps no state")

    def close(self):
        self.closed = True


class FakeFactory:
    """An engine factory handing out the models in ``models`` in turn (the last one repeats)."""

    def __init__(self, *models):
        self.models = list(models) or [FakeModel()]
        self.loads: list[tuple[str, int]] = []

    def __call__(self, path, n_ctx):
        self.loads.append((path, n_ctx))
        model = self.models.pop(0) if len(self.models) > 1 else self.models[0]
        if isinstance(model, BaseException):
            raise model
        return model


class SteadyMachine:
    """A drift detector that never infers throttling."""

    throttled = False

    def observe(self, seconds, load) -> None:
        pass


def make_cool(monitor: ThermalMonitor) -> ThermalMonitor:
    """Pin ``monitor`` to a cool machine: nominal sensors, no inferred throttling. For tests that run real replies
    and are not about the thermal policy, which on a shared or hot CI machine may rightly allow one sequence at a
    time. Call it before any reply: the engine thread reads the monitor."""
    monitor.provider = ScriptedProvider([(0.0, ThermalState.NOMINAL)], time.monotonic)
    monitor.drift = SteadyMachine()
    return monitor


class FixedMonitor:
    """The scheduler's view of a thermal monitor, with fixed limits and no drift detector."""

    def __init__(self, limits: Limits):
        self.fixed = limits

    def limits(self) -> Limits:
        return self.fixed

    def observe_decode(self, seconds, load) -> None:
        pass
