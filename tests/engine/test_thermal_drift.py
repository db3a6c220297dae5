"""The throughput-drift detector on synthetic decode-step times: fires on a sustained slowdown, not on noise."""

from __future__ import annotations

import numpy as np

from engine.thermal import DriftConfig, DriftDetector

STEP_S = 0.05


def noisy(rng: np.random.Generator, n: int, base: float, spikes: float = 0.05) -> np.ndarray:
    """Step times with 15% log-normal jitter and occasional 3-6x spikes (a GC pause, another app)."""
    times = base * rng.lognormal(0.0, 0.15, n)
    hit = rng.random(n) < spikes
    times[hit] *= rng.uniform(3, 6, hit.sum())
    return times


def feed(detector: DriftDetector, times, load=(1, 0)) -> list[bool]:
    flags = []
    for t in times:
        detector.observe(float(t), load)
        flags.append(detector.throttled)
    return flags


def test_a_sustained_slowdown_fires_and_recovery_clears_it():
    rng = np.random.default_rng(1)
    detector = DriftDetector()
    assert not any(feed(detector, noisy(rng, 200, STEP_S)))
    slow = feed(detector, noisy(rng, 200, STEP_S * 1.6))
    assert any(slow)
    fired_after = slow.index(True)
    config = detector.config
    assert fired_after <= (config.sustain_blocks + 2) * config.block_steps  # within a few blocks
    assert detector.status.ratio > config.rise_ratio and "slower" in detector.status.reason
    cool = feed(detector, noisy(rng, 200, STEP_S))
    assert cool[-1] is False and "back" in detector.status.reason


def test_noise_and_spikes_alone_never_fire():
    for seed in range(5):
        detector = DriftDetector()
        assert not any(feed(detector, noisy(np.random.default_rng(seed), 3000, STEP_S, spikes=0.1)))


def test_a_short_burst_of_slow_steps_does_not_fire():
    rng = np.random.default_rng(2)
    detector = DriftDetector()
    feed(detector, noisy(rng, 200, STEP_S))
    times = noisy(rng, 200, STEP_S)
    times[50:66] *= 2.0  # two blocks' worth, fewer than sustain_blocks
    assert not any(feed(detector, times))


def test_a_bigger_batch_is_a_new_load_not_a_slowdown():
    rng = np.random.default_rng(3)
    detector = DriftDetector()
    for _ in range(3):
        assert not any(feed(detector, noisy(rng, 150, STEP_S), load=(1, 0)))
        assert not any(feed(detector, noisy(rng, 150, STEP_S * 2.5), load=(4, 0)))
        assert not any(feed(detector, noisy(rng, 150, STEP_S * 1.8), load=(4, 1)))


def test_a_slowdown_under_a_known_load_fires_after_a_load_change():
    rng = np.random.default_rng(4)
    detector = DriftDetector()
    feed(detector, noisy(rng, 150, STEP_S), load=(1, 0))
    feed(detector, noisy(rng, 150, STEP_S * 2.5), load=(4, 0))
    assert any(feed(detector, noisy(rng, 150, STEP_S * 1.6), load=(1, 0)))


def test_while_throttled_a_new_load_learns_nothing_and_the_flag_is_released_when_stale():
    rng = np.random.default_rng(5)
    config = DriftConfig()
    detector = DriftDetector(config)
    feed(detector, noisy(rng, 100, STEP_S))
    assert any(feed(detector, noisy(rng, 100, STEP_S * 1.7)))
    steps_to_release = (config.stale_blocks + 1) * config.block_steps + config.warmup_steps
    flags = feed(detector, noisy(rng, steps_to_release, STEP_S * 3), load=(2, 0))
    assert flags[0] and not flags[-1] and "no cool baseline" in detector.status.reason
    assert detector.baseline((2, 0)) is None  # the hot speed was not taken as the new load's baseline


def test_no_data_means_no_baseline():
    detector = DriftDetector()
    assert detector.baseline((1, 0)) is None and not detector.throttled
    feed(detector, [STEP_S] * (detector.config.warmup_steps + detector.config.block_steps * 3))
    assert detector.baseline((1, 0)) == STEP_S


def test_steps_that_took_no_measurable_time_are_ignored():
    detector = DriftDetector()
    feed(detector, [0.0] * 100 + [float("nan")] * 10)
    assert detector.baseline((1, 0)) is None and detector.status.ratio is None
