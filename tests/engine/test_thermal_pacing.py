"""StreamPacer: the thermal policy applied to one chat stream, on a fake clock and a scripted provider."""

from engine.speculative import prompt_lookup_speculator
from engine.thermal import Mode, PolicyConfig, ScriptedProvider, StreamPacer, ThermalMonitor, ThermalPolicy, ThermalState

N, S, C = ThermalState.NOMINAL, ThermalState.SERIOUS, ThermalState.CRITICAL


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def pacer_for(trace, mode=Mode.BALANCED):
    clock = FakeClock()
    monitor = ThermalMonitor(ScriptedProvider(trace, clock), ThermalPolicy(PolicyConfig(cooldown_s=5.0), mode),
                             clock=clock, poll_interval_s=1.0)
    return StreamPacer(monitor, sleep=clock.sleep), clock


def test_chunk_draft_length_and_pause_follow_the_thermal_state_and_recover():
    pacer, clock = pacer_for([(0, N), (10, S), (20, C), (30, N)])
    spec = prompt_lookup_speculator(12)
    assert pacer.begin(speculator=spec, preferred_chunk=128) == 128  # nominal allows 512: the caller's 128 stands
    seen = []
    while clock.now < 60:
        rested = pacer.step(0.01, load=(1, 0))
        clock.now += 0.01
        seen.append((round(clock.now), pacer.limits.prefill_chunk, spec.max_draft, rested))
    by_second = {t: (chunk, draft, rested) for t, chunk, draft, rested in seen}
    assert by_second[5] == (512, 12, 0.0)  # the user's cap of 12 under nominal's 16
    assert by_second[15] == (128, 4, 0.0)  # serious
    assert by_second[25][:2] == (64, 0) and by_second[25][2] == 0.5  # critical: no drafts, rest between tokens
    assert by_second[37] == (128, 4, 0.0) and by_second[42] == (256, 8, 0.0)  # one level down per 5 s cool
    assert by_second[59] == (512, 12, 0.0)


def test_a_pause_stops_resting_as_soon_as_the_reply_is_stopped():
    pacer, clock = pacer_for([(0, C)])
    pacer.begin()
    assert pacer.step(0.01, load=(1, 0)) == 0.5
    naps = []
    assert pacer.step(0.01, load=(1, 0), stopped=lambda: len(naps) > 0 or naps.append(1)) < 0.5


def test_cool_mode_caps_a_nominal_machine_and_the_mode_switch_applies_at_once():
    pacer, clock = pacer_for([(0, N)])
    assert pacer.begin(mode=Mode.PERFORMANCE, preferred_chunk=1024) == 512
    assert pacer.begin(mode=Mode.COOL, preferred_chunk=1024) == 128
    assert [d.reason for d in pacer.monitor.decisions][-1] == "mode set to cool"


def test_a_slowdown_under_steady_load_is_inferred_as_throttling_and_shrinks_the_chunk():
    pacer, clock = pacer_for([(0, N)])
    pacer.begin()
    for i in range(400):
        pacer.step(0.010 if i < 200 else 0.016, load=(1, 0))
        clock.now += 0.01
    assert pacer.monitor.drift.throttled
    assert pacer.limits.prefill_chunk == 128  # throttling counts as "serious"
