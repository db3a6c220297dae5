"""Sampling: each step on hand-made distributions, the composed sampler's statistics, seeds and saved state."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engine.sampling import (SamplingParams, apply_min_p, apply_penalties, apply_temperature, apply_top_k,
                             apply_top_p, make_sampler)

# Probabilities that are exact in binary, so boundaries can be tested just above and below.
PROBS = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
LOGITS = np.log(PROBS).astype(np.float32)
# Chi-square critical values at p = 0.001 by degrees of freedom: a correct sampler fails 1 seed in 1000.
CHI2_CRITICAL = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467}
PLAIN = dict(top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)  # every filter off


def kept(logits: np.ndarray) -> list[int]:
    return np.flatnonzero(np.isfinite(logits)).tolist()


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits.astype(np.float64) - np.max(logits))
    return z / z.sum()


def chi_square(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    expected = expected_probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# -- the steps -----------------------------------------------------------------------------------------------

def test_top_k_keeps_exactly_the_k_highest():
    shuffled = LOGITS[[3, 0, 4, 1, 2]]  # highest at positions 1 and 3
    out = apply_top_k(shuffled, 2)
    assert kept(out) == [1, 3]
    assert np.array_equal(out[[1, 3]], shuffled[[1, 3]])
    assert out.dtype == np.float32 and shuffled[0] == LOGITS[3]  # input untouched


@pytest.mark.parametrize("k", [0, 5, 9])
def test_top_k_off_or_larger_than_vocab_keeps_all(k):
    assert kept(apply_top_k(LOGITS, k)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("p, expected", [
    (0.0, [0]),
    (0.49, [0]),
    (0.51, [0, 1]),  # 0.5 < p: the second token crosses p and is included
    (0.74, [0, 1]),
    (0.76, [0, 1, 2]),
    (0.99, [0, 1, 2, 3, 4]),  # both 0.0625 tokens: the first reaches 0.9375, the second crosses 0.99
    (1.0, [0, 1, 2, 3, 4]),
])
def test_top_p_keeps_the_token_that_crosses_p(p, expected):
    assert kept(apply_top_p(LOGITS, p)) == expected


def test_top_p_ignores_tokens_already_dropped():
    masked = apply_top_k(LOGITS, 3)  # renormalised: 4/7, 2/7, 1/7
    assert kept(apply_top_p(masked, 0.56)) == [0]
    assert kept(apply_top_p(masked, 0.58)) == [0, 1]


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.97, 0.999])
def test_top_p_over_a_large_vocabulary_matches_a_full_sort(p):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(20_000) * 2.5).astype(np.float32)
    probs = softmax(logits)
    order = np.argsort(-probs, kind="stable")
    n_keep = int(np.searchsorted(np.cumsum(probs[order]), p)) + 1
    assert kept(apply_top_p(logits, p)) == sorted(order[:n_keep].tolist())


@pytest.mark.parametrize("p, expected", [(0.0, [0, 1, 2, 3, 4]), (0.2, [0, 1, 2]), (0.3, [0, 1]), (1.0, [0])])
def test_min_p_is_relative_to_the_most_likely_token(p, expected):
    assert kept(apply_min_p(LOGITS, p)) == expected
    assert kept(apply_min_p(LOGITS + 40.0, p)) == expected  # only ratios matter


def test_temperature_divides_and_refuses_zero():
    assert np.allclose(apply_temperature(LOGITS, 0.5), LOGITS * 2)
    assert apply_temperature(LOGITS, 0.5).dtype == np.float32
    with pytest.raises(ValueError, match="temperature must be positive"):
        apply_temperature(LOGITS, 0.0)


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    logits = np.array([2.0, -2.0, 1.0, 0.0], dtype=np.float32)
    out = apply_penalties(logits, [0, 1, 3, 0], repeat_penalty=2.0)
    assert out.tolist() == [1.0, -4.0, 1.0, 0.0]  # token 2 was not seen
    assert logits.tolist() == [2.0, -2.0, 1.0, 0.0]


def test_presence_and_frequency_penalties_follow_openai():
    logits = np.zeros(4, dtype=np.float32)
    out = apply_penalties(logits, [1, 1, 1, 2], presence_penalty=0.5, frequency_penalty=0.25)
    assert out.tolist() == [0.0, -1.25, -0.75, 0.0]  # count * frequency + presence for each seen token


def test_penalties_off_or_no_history_return_the_input():
    assert apply_penalties(LOGITS, [], repeat_penalty=1.3) is LOGITS
    assert apply_penalties(LOGITS, [1, 2]) is LOGITS


def test_penalties_refuse_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match="token id 5 in the history is outside the vocabulary of 5"):
        apply_penalties(LOGITS, [1, 5], repeat_penalty=1.1)


# -- the sampler -----------------------------------------------------------------------------------------

def draw_counts(params: SamplingParams, logits: np.ndarray, n: int, history=()) -> np.ndarray:
    sampler = make_sampler(params)
    counts = np.zeros(logits.size, dtype=np.int64)
    for _ in range(n):
        counts[sampler(logits, history)[0]] += 1
    return counts


def test_sampling_frequencies_match_the_distribution():
    counts = draw_counts(SamplingParams(temperature=1.0, seed=11, **PLAIN), LOGITS, 20_000)
    assert chi_square(counts, PROBS) < CHI2_CRITICAL[4]


def test_sampling_frequencies_after_top_k_and_temperature():
    params = SamplingParams(temperature=0.5, top_k=3, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=12)
    counts = draw_counts(params, LOGITS, 20_000)
    expected = PROBS[:3] ** 2 / (PROBS[:3] ** 2).sum()  # p ** (1 / T), renormalised over the three kept
    assert counts[3:].sum() == 0
    assert chi_square(counts[:3], expected) < CHI2_CRITICAL[2]


def test_sampling_frequencies_over_a_large_vocabulary():
    # Most mass on four tokens far apart, so the draw must find the right block of the cumulative sum.
    logits = np.full(16_391, -10.0, dtype=np.float32)  # many blocks of the cumulative sum, the last one partial
    heavy = [3, 5_001, 10_000, 16_390]
    logits[heavy] = np.log([0.4, 0.3, 0.2, 0.1]).astype(np.float32) + 4.0
    counts = draw_counts(SamplingParams(temperature=1.0, seed=13, **PLAIN), logits, 3_000)
    probs = softmax(logits)
    groups = np.array([*counts[heavy], counts.sum() - counts[heavy].sum()])
    expected = np.array([*probs[heavy], 1 - probs[heavy].sum()])
    assert chi_square(groups, expected) < CHI2_CRITICAL[4]


def test_logprob_is_under_the_final_distribution():
    params = SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=3)
    sampler = make_sampler(params)
    for _ in range(20):
        token, logprob = sampler(LOGITS, [])
        assert token in (0, 1)
        assert logprob == pytest.approx(math.log(PROBS[token] / 0.75), abs=1e-6)


def test_greedy_takes_the_argmax_after_penalties_and_reports_the_raw_logprob():
    logits = np.array([2.0, 1.9, -1.0], dtype=np.float32)
    greedy = SamplingParams(temperature=0.0, top_k=1, min_p=1.0, repeat_penalty=1.1)  # the filters are ignored
    token, logprob = make_sampler(greedy)(logits, [0])  # 2.0 / 1.1 < 1.9
    assert token == 1
    assert logprob == pytest.approx(math.log(softmax(logits)[1]), abs=1e-6)
    assert make_sampler(greedy)(logits, [2])[0] == 0


def test_repeat_last_n_limits_the_penalised_window():
    logits = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    greedy = dict(temperature=0.0, repeat_penalty=1.1)
    old_zero = [0] + [2] * 4
    assert make_sampler(SamplingParams(repeat_last_n=4, **greedy))(logits, old_zero)[0] == 0
    assert make_sampler(SamplingParams(repeat_last_n=5, **greedy))(logits, old_zero)[0] == 1
    assert make_sampler(SamplingParams(repeat_last_n=64, **greedy))(logits, old_zero)[0] == 1  # window > history
    assert make_sampler(SamplingParams(repeat_last_n=-1, **greedy))(logits, old_zero)[0] == 1
    assert make_sampler(SamplingParams(repeat_last_n=0, **greedy))(logits, old_zero)[0] == 0


def test_nothing_left_to_sample_is_an_error():
    sampler = make_sampler(SamplingParams(seed=1))
    with pytest.raises(ValueError, match="no token can be sampled"):
        sampler(np.full(4, -np.inf, dtype=np.float32), [])
    with pytest.raises(ValueError, match="no token can be sampled"):
        sampler(np.array([0.0, np.nan, 1.0], dtype=np.float32), [])
    with pytest.raises(ValueError, match="1-D"):
        sampler(np.zeros((2, 3), dtype=np.float32), [])


def test_a_262k_vocabulary_step_with_the_default_chain():
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(262_144) * 3).astype(np.float32)
    history = rng.integers(0, 262_144, 500).tolist()
    token, logprob = make_sampler(SamplingParams(seed=5))(logits, history)
    top40 = np.argsort(apply_penalties(logits, history[-64:], 1.1))[-40:]
    assert token in top40 and logprob <= 0.0


# -- seeds and state -------------------------------------------------------------------------------------

def run(sampler, steps: int, start: int = 0) -> list[tuple[int, float]]:
    """Varying logits and a growing history, so penalties and filters take part."""
    rng = np.random.default_rng(start)
    history, out = [], []
    for _ in range(steps):
        token, logprob = sampler((rng.standard_normal(1000) * 2).astype(np.float32), history)
        history.append(token)
        out.append((token, logprob))
    return out


def test_same_seed_same_tokens_and_different_seeds_differ():
    assert run(make_sampler(SamplingParams(seed=42)), 50) == run(make_sampler(SamplingParams(seed=42)), 50)
    assert run(make_sampler(SamplingParams(seed=42)), 50) != run(make_sampler(SamplingParams(seed=43)), 50)


def test_no_seed_draws_one_from_the_os_and_reports_it():
    first, second = make_sampler(SamplingParams()), make_sampler(SamplingParams())
    assert first.seed != second.seed
    replay = make_sampler(SamplingParams(seed=first.seed))
    assert run(first, 30) == run(replay, 30)


def test_saved_state_continues_the_exact_same_draws():
    sampler = make_sampler(SamplingParams(seed=7))
    run(sampler, 10)
    state = json.loads(json.dumps(sampler.get_state()))
    expected = run(sampler, 25, start=1)
    restored = make_sampler(SamplingParams(seed=999))
    restored.set_state(state)
    assert run(restored, 25, start=1) == expected


@pytest.mark.parametrize("state", [
    {},
    {"version": 1},
    {"version": 2, "bit_generator": {"bit_generator": "PCG64"}},
    {"version": 1, "bit_generator": {"bit_generator": "MT19937", "state": {}}},
    {"version": 1, "bit_generator": {"bit_generator": "PCG64", "state": "nope"}},
    "not a dict",
])
def test_invalid_state_is_refused(state):
    with pytest.raises(ValueError, match="sampler state"):
        make_sampler(SamplingParams(seed=1)).set_state(state)


# -- parameters ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("temperature", float("nan"), "temperature must be a finite number"),
    ("temperature", "hot", "temperature must be a finite number"),
    ("top_k", -1, "top_k must be at least 0"),
    ("top_k", 4.5, "top_k must be an integer"),
    ("top_k", True, "top_k must be an integer"),
    ("top_p", 1.5, "top_p must be between 0 and 1"),
    ("top_p", -0.1, "top_p must be between 0 and 1"),
    ("min_p", 2.0, "min_p must be between 0 and 1"),
    ("repeat_penalty", 0.0, "repeat_penalty must be greater than 0"),
    ("repeat_penalty", -1.0, "repeat_penalty must be between 0 and inf"),
    ("repeat_last_n", -2, "repeat_last_n must be at least -1"),
    ("presence_penalty", 2.5, "presence_penalty must be between -2 and 2"),
    ("frequency_penalty", float("inf"), "frequency_penalty must be a finite number"),
    ("seed", -1, "seed must be at least 0"),
    ("seed", 1.5, "seed must be an integer"),
])
def test_parameters_are_validated(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_valid_edges_are_accepted():
    params = SamplingParams(temperature=-1.0, top_k=0, top_p=0.0, min_p=1.0, repeat_penalty=1.0, repeat_last_n=-1,
                            presence_penalty=-2.0, frequency_penalty=2.0, seed=2**64 - 1)
    assert params.greedy and not SamplingParams().greedy
