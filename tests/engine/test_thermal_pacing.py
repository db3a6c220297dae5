"""The thermal policy applied to a lone reply, which is a batch of one in the scheduler: prefill chunk, draft
length, rests between steps (``engine.thermal.pacing.rest``) and the drift detector, on a fake clock."""

from engine.scheduler import Request, Scheduler
from engine.thermal import (Mode, PolicyConfig, ScriptedProvider, ThermalMonitor, ThermalPolicy, ThermalState,
                            rest)

from .test_scheduler import FakeBackend, greedy

N, S, C = ThermalState.NOMINAL, ThermalState.SERIOUS, ThermalState.CRITICAL


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class SpySpeculator:
    """Decodes plainly and records the draft cap the scheduler passes each step."""

    def __init__(self):
        self.caps: list[int | None] = []

    def begin(self, history, n_ctx, chunk_size=512, seed=None, cancel=None, generated=0):
        pass

    def decode(self, backend, cache, sample, history, params, draft_cap=None):
        self.caps.append(draft_cap)
        return [sample(backend.forward([history[-1]], cache), history)]


def lone_reply(trace, mode=Mode.BALANCED, prompt_len=1, max_tokens=10_000, prefill_chunk=128, speculation=None):
    clock = FakeClock()
    monitor = ThermalMonitor(ScriptedProvider(trace, clock), ThermalPolicy(PolicyConfig(cooldown_s=5.0), mode),
                             clock=clock, poll_interval_s=1.0)
    backend = FakeBackend()
    scheduler = Scheduler(backend, n_ctx=100_000, monitor=monitor, clock=clock)
    request = Request(tuple(1 + i % 90 for i in range(prompt_len)), greedy, max_tokens, prefill_chunk=prefill_chunk,
                      speculation=speculation)
    return scheduler, scheduler.submit(request), backend, clock


def test_chunk_draft_length_and_pause_follow_the_thermal_state_and_recover():
    spy = SpySpeculator()
    scheduler, _, backend, clock = lone_reply([(0, N), (10, S), (20, C), (30, N)], speculation=spy)
    seen = {}
    while clock.now < 60:
        report = scheduler.step()
        clock.now += 0.01 + report.pause_s
        seen[round(clock.now)] = (report.limits.prefill_chunk, spy.caps[-1] if spy.caps else None, report.pause_s)
    assert seen[5] == (512, 16, 0.0)  # nominal (the speculator's own max_draft caps it further)
    assert seen[15] == (128, 4, 0.0)  # serious
    assert seen[26] == (64, 0, 0.5)  # critical: no drafts, a rest after every step
    assert seen[37] == (128, 4, 0.0) and seen[42] == (256, 8, 0.0)  # one level down per 5 s cool
    assert seen[59] == (512, 16, 0.0)


def test_a_lone_prompt_is_prefilled_in_the_smaller_of_the_policy_chunk_and_its_own():
    scheduler, handle, backend, clock = lone_reply([(0, N), (1, C)], prompt_len=300, max_tokens=2)
    scheduler.step()
    clock.now = 2.0
    scheduler.step()
    assert backend.calls[:2] == [("prefill", 128), ("prefill", 64)]  # its own 128 under nominal, then critical's 64


def test_a_rest_is_taken_in_slices_and_a_stop_cuts_it_short():
    clock = FakeClock()
    assert rest(0.5, sleep=clock.sleep) == 0.5 and clock.now == 0.5
    naps = []
    assert rest(0.5, lambda: len(naps) > 0 or naps.append(1), sleep=clock.sleep) < 0.5


def test_the_mode_switch_applies_at_the_next_step():
    scheduler, _, _, clock = lone_reply([(0, N)], mode=Mode.PERFORMANCE)
    assert scheduler.step().limits.prefill_chunk == 512
    scheduler.monitor.set_mode(Mode.COOL)
    assert scheduler.step().limits.prefill_chunk == 128
    assert [d.reason for d in scheduler.monitor.decisions][-1] == "mode set to cool"


def test_a_slowdown_of_a_lone_reply_is_inferred_as_throttling_and_shrinks_the_chunk():
    scheduler, _, backend, clock = lone_reply([(0, N)], prompt_len=300)  # 300..700 positions: one load bucket
    forward = backend.forward
    steps = []

    def timed_forward(tokens, cache, all_logits=False):  # each decode step takes 10 ms, then 16 ms
        clock.now += 0.010 if len(steps) < 200 else 0.016
        steps.append(1)
        return forward(tokens, cache, all_logits)

    backend.forward = timed_forward
    for _ in range(400):
        report = scheduler.step()
    assert report.decode_batch == 1
    assert scheduler.monitor.drift.throttled
    assert scheduler.step().limits.prefill_chunk == 128  # throttling counts as "serious"
