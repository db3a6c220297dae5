"""A stand-in for engine.model.Model with scripted tokens, delays and failures, for fast worker and UI tests."""

from __future__ import annotations

import time

import numpy as np

from engine.backends.base import Backend, KVCache, KVState, MemoryStats
from engine.model import KVCacheUsage
from engine.reasoning import ReasoningProfile, count_thinking_tokens
from engine.scheduler import Request, Scheduler
from engine.session import SessionError
from engine.thermal import Limits, ScriptedProvider, ThermalMonitor, ThermalState


class FakeCache(KVCache):
    """A cache that only counts positions."""

    def __init__(self, n_ctx: int):
        self.n_ctx, self.positions = n_ctx, 0

    @property
    def n_past(self) -> int:
        return self.positions

    def reserve(self, n_new: int) -> None:
        if self.positions + n_new > self.n_ctx:
            raise ValueError("the context is full")

    def truncate(self, n_past: int) -> None:
        self.positions = min(self.positions, n_past)

    def export_state(self) -> KVState:
        raise NotImplementedError

    def import_state(self, state: KVState) -> None:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        return 0


class FakeBackend(Backend):
    """Sleeps ``prefill_s`` for a prompt and ``token_s`` per decode step; the scripted sampler picks the tokens."""

    name = "fake"

    def __init__(self, model: FakeModel):
        self.model = model

    def new_cache(self, n_ctx: int) -> FakeCache:
        return FakeCache(n_ctx)

    def forward(self, tokens, cache, all_logits=False):
        time.sleep(self.model.prefill_s if cache.n_past == 0 else self.model.step_s(cache.n_past))
        cache.reserve(len(tokens))
        cache.positions += len(tokens)
        self.model.positions = cache.n_past + 1  # the fake counts the token the logits choose, as it always did
        return np.zeros(1, np.float32)

    def memory(self) -> MemoryStats:
        return MemoryStats(weights_bytes=1_000_000, kv_cache_bytes=0)


class PieceDecoder:
    """Token i is ``pieces[i]``. The fake's end-of-generation token carries text (a real one does not), so the
    flush at the end of generation hands it out."""

    def __init__(self, pieces: list[str], n: int):
        self.pieces, self.n, self.added = pieces, n, 0

    def add(self, token: int) -> str:
        self.added += 1
        return self.pieces[token]

    def flush(self) -> str:
        last, self.added = (self.pieces[self.n - 1] if self.added == self.n - 1 else ""), self.n
        return last


class FakeModel:
    """Streams ``pieces`` one per token after ``prefill_s`` (then ``token_s`` per step, or a list of per-step
    times), through the engine's real scheduler on a fake backend; the last piece is an end-of-generation token. ``fail_with`` is raised from start_chat(). ``reasoning`` is the
    chat template's reasoning profile (none by default); thinking tokens are counted over the pieces."""

    PROMPT_TOKENS = 10

    def __init__(self, pieces=("Hello", " there", "!"), token_s=0.0, prefill_s=0.0, fail_with=None,
                 n_ctx=4096, dropped=0, reasoning=ReasoningProfile()):
        self.name, self.n_ctx, self.notices, self.sha256 = "Fake", n_ctx, [], "f" * 64
        self.pieces, self.token_s, self.prefill_s = list(pieces), token_s, prefill_s
        self.fail_with, self.dropped = fail_with, dropped
        self.config = type("Config", (), {"arch": "fake"})()
        self.backend = FakeBackend(self)
        self.scheduler = Scheduler(self.backend, n_ctx)
        self.positions = 0  # "KV cache" positions: the last prompt and reply
        self.calls: list[list[dict]] = []
        self.template_vars: list[dict | None] = []  # per start_chat() call
        self.reasoning = reasoning
        self.prefill_chunks: list[int] = []  # per start_chat() call
        self.closed = False

    def start_chat(self, messages, params, max_tokens, *, priority=0, overflow="drop_oldest", stop=(),
                   prefill_chunk=128, speculation=None, cancel=None, template_vars=None):
        self.calls.append(messages)
        self.template_vars.append(template_vars)
        self.prefill_chunks.append(prefill_chunk)
        if self.fail_with is not None:
            raise self.fail_with
        n = min(max_tokens, len(self.pieces))
        request = Request((1,) * self.PROMPT_TOKENS, self._sample, n, priority, frozenset({n - 1}), tuple(stop),
                          PieceDecoder(self.pieces, n), prefill_chunk=prefill_chunk, cancel=cancel)
        return self.dropped, self.scheduler.submit(request)

    def step_s(self, n_past: int) -> float:
        """How long the decode step after ``n_past`` positions sleeps: ``token_s``, or its entry per step."""
        if isinstance(self.token_s, (int, float)):
            return self.token_s
        step = n_past - self.PROMPT_TOKENS
        return self.token_s[step] if step < len(self.token_s) else self.token_s[-1]

    def _sample(self, logits, history):
        return len(history) - self.PROMPT_TOKENS, -0.1  # token i is the i-th piece

    def set_monitor(self, monitor) -> None:
        self.scheduler.monitor = monitor

    def thinking_stats(self, n_generated, sequence=None):
        if self.reasoning.syntax is None:
            return {}
        return {"thinking_tokens": count_thinking_tokens(self.pieces[:n_generated], self.reasoning.syntax,
                                                         self.reasoning.opens_on)}

    @property
    def kv_cache_usage(self) -> KVCacheUsage:
        return KVCacheUsage(self.positions, self.n_ctx, 256 * 1000, 1000, self.n_ctx * 1000)

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
