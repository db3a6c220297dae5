"""The sampler's C path (a top-k step in one call of the extension, penalties read beside the logits) against
its NumPy fallback and against its small steps composed by hand: the same tokens and log-probabilities for the
same seed, and the distribution kept."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.backends import vector_math
from engine.backends.cpu import kernels
from engine.sampling import (NonFiniteLogitsError, SamplingParams, apply_top_p, filtered_scores, make_sampler,
                             penalised_logits)

SETTINGS = [
    dict(),  # the defaults: repeat penalty, top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
    dict(top_k=1),
    dict(top_k=0),
    dict(top_k=0, top_p=1.0, min_p=0.0),
    dict(top_p=1.0),
    dict(min_p=0.0),
    dict(temperature=0.0),
    dict(temperature=0.0, repeat_penalty=1.0),
    dict(temperature=1.7, top_k=200, top_p=0.5, min_p=0.2),
    dict(presence_penalty=0.7, frequency_penalty=0.4, repeat_last_n=-1),
    dict(frequency_penalty=-1.5, repeat_penalty=1.0),
    dict(top_k=5, repeat_last_n=0),
]


def _logits(rng: np.random.Generator, case: int, n: int) -> np.ndarray:
    kind = case % 3
    if kind == 0:
        logits = rng.normal(0, 3, n)
    elif kind == 1:  # ties everywhere, the top-k boundary among them
        logits = rng.integers(-3, 4, n).astype(np.float64)
    else:  # most tokens masked
        logits = np.where(rng.random(n) < 0.9, -np.inf, rng.normal(0, 2, n))
        logits[rng.integers(0, n)] = 1.0  # at least one token can be drawn
    return logits.astype(np.float32)


def _tokens(params: SamplingParams, steps) -> list[tuple[int, float]]:
    sampler = make_sampler(params)
    return [sampler(logits, history) for logits, history in steps]


def test_the_c_path_and_the_numpy_fallback_draw_the_same_tokens(monkeypatch):
    assert kernels.AVAILABLE, "the C extension must be built for this comparison"
    rng = np.random.default_rng(8)
    for case in range(60):
        n = int(rng.choice([3, 64, 1000, 151_936])) if case % 6 else 151_936
        steps = [(_logits(rng, case + i, n), rng.integers(0, n, int(rng.integers(0, 90))).tolist()) for i in range(4)]
        params = SamplingParams(seed=case, **SETTINGS[case % len(SETTINGS)])
        with_c = _tokens(params, steps)
        with monkeypatch.context() as m:
            m.setattr(kernels, "_ext", None)
            fallback = _tokens(params, steps)
        assert [t for t, _ in with_c] == [t for t, _ in fallback], (case, params)
        np.testing.assert_allclose([lp for _, lp in with_c], [lp for _, lp in fallback], rtol=1e-5, atol=1e-5)


def test_a_top_k_step_draws_what_its_steps_composed_by_hand_draw(implementation):
    rng = np.random.default_rng(9)
    for case in range(60):
        n = int(rng.choice([3, 64, 5000, 151_936]))
        logits = _logits(rng, case, n)
        history = rng.integers(0, n, int(rng.integers(0, 100))).tolist()
        top_k = int(rng.integers(1, min(n - 1, 300) + 1)) if case % 10 else int(min(n - 1, 6000))  # > 4096: no fast path
        params = SamplingParams(top_k=top_k, seed=case, repeat_penalty=float(rng.choice([1.0, 1.1, 1.5])),
                                presence_penalty=float(rng.choice([0.0, 0.5])),
                                frequency_penalty=float(rng.choice([0.0, 0.3, -1.5])),
                                repeat_last_n=int(rng.choice([64, -1, 0])), top_p=float(rng.choice([0.0, 0.5, 0.95, 1.0])),
                                min_p=float(rng.choice([0.0, 0.05, 0.5])), temperature=float(rng.choice([0.3, 0.8, 1.0, 1.7])))
        sampler, uniforms = make_sampler(params), np.random.Generator(np.random.PCG64(np.random.SeedSequence(case)))
        for _ in range(3):
            token, logprob = sampler(logits, history)
            candidates, scores = filtered_scores(penalised_logits(logits, history, params), params)
            weights = vector_math.exp_shifted(scores)
            index, total = vector_math.inverse_cdf(weights, uniforms.random())
            assert token == candidates[index], (case, params)
            assert logprob == pytest.approx(math.log(weights[index]) - math.log(total), abs=1e-6), (case, params)
            history.append(token)


@pytest.mark.parametrize("bad", [[0.0, np.nan, 1.0, 2.0], [0.0, np.inf, 1.0, 2.0], [-np.inf] * 4])
def test_a_top_k_step_refuses_logits_that_are_not_finite_anywhere(implementation, bad):
    sampler = make_sampler(SamplingParams(top_k=2, seed=1))  # the NaN or inf is outside the two best in one case
    with pytest.raises(NonFiniteLogitsError):
        sampler(np.array(bad, np.float32), [0])


def test_a_top_k_step_refuses_a_history_outside_the_vocabulary(implementation):
    sampler = make_sampler(SamplingParams(top_k=2, seed=1))
    with pytest.raises(ValueError, match="token id 9 in the history is outside the vocabulary of 4"):
        sampler(np.zeros(4, np.float32), [1, 9, 2])
    assert make_sampler(SamplingParams(top_k=2, repeat_penalty=1.0, seed=1))(np.zeros(4, np.float32), [9])[0] in (0, 1)


def test_top_k_ties_at_the_boundary_keep_the_lowest_ids_and_sample_them_evenly():
    logits = np.array([0.0, 1.0, 1.0, 1.0, 1.0, -1.0], np.float32)
    sampler = make_sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=4))
    counts = np.bincount([sampler(logits, [])[0] for _ in range(4000)], minlength=6)
    assert counts[[0, 3, 4, 5]].sum() == 0
    assert abs(counts[1] - 2000) < 3.3 * np.sqrt(1000)  # binomial(4000, 1/2): 3.3 sigma


def test_top_p_on_sorted_scores_keeps_what_a_full_sort_keeps():
    rng = np.random.default_rng(10)
    for case in range(200):
        scores = np.sort(_logits(rng, case, int(rng.integers(1, 300))))[::-1].copy()
        p = float(rng.choice([0.0, 0.3, 0.9, 0.95, 1.0 - 1e-9]))
        weights = np.exp(scores.astype(np.float64) - scores.max())
        cumulative = np.cumsum(weights) / weights.sum()
        n_keep = min(int(np.searchsorted(cumulative, p, side="left")) + 1, int(np.count_nonzero(weights)))
        kept = np.flatnonzero(np.isfinite(apply_top_p(scores, p)))
        assert kept.tolist() == list(range(n_keep)), (case, p)


@pytest.mark.parametrize("top_k", [40, 0])
def test_a_chat_default_step_over_a_152k_vocabulary_samples_the_distribution(top_k):
    rng = np.random.default_rng(12)
    logits = rng.normal(0, 1, 151_936).astype(np.float32)
    favourites = rng.choice(151_936, 4, replace=False)
    logits[favourites] = [15.0, 14.5, 14.0, 13.0]  # 96 % of the mass: top-p 0.95 keeps all four (90 % without the last)
    params = SamplingParams(top_k=top_k, seed=13)
    counts = {}
    sampler = make_sampler(params)
    for _ in range(2000):
        token = sampler(logits, [])[0]
        counts[token] = counts.get(token, 0) + 1
    candidates, scores = filtered_scores(logits, params)
    probs = np.exp(scores.astype(np.float64) - scores.max())
    probs /= probs.sum()
    ids = candidates if candidates is not None else np.arange(logits.size)
    expected = dict(zip(ids[probs > 0].tolist(), probs[probs > 0].tolist()))
    assert set(counts) <= set(expected)
    observed = np.array([counts.get(t, 0) for t in expected])
    want = np.array(list(expected.values())) * 2000
    assert float(((observed - want) ** 2 / want).sum()) < 16.266  # chi-square, 3 degrees of freedom, p = 0.001
    assert len(expected) == 4


@pytest.mark.parametrize("repeat_penalty", [1.0, 1.3])
@pytest.mark.parametrize("bad", [[0.0, np.nan, 1.0], [0.0, np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
def test_greedy_refuses_logits_that_are_not_finite(bad, repeat_penalty):
    from engine.sampling import NonFiniteLogitsError

    sampler = make_sampler(SamplingParams(temperature=0.0, repeat_penalty=repeat_penalty))
    with pytest.raises(NonFiniteLogitsError):
        sampler(np.array(bad, np.float32), [0])


def test_greedy_takes_the_lowest_id_among_equal_maxima_with_its_logprob():
    token, logprob = make_sampler(SamplingParams(temperature=0.0, repeat_penalty=1.0))(
        np.array([0.0, 2.0, 2.0, -np.inf], np.float32), [])
    assert token == 1 and logprob == pytest.approx(np.log(np.exp(2.0) / (1 + 2 * np.exp(2.0))), abs=1e-6)
