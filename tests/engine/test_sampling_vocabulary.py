"""Sampling with top-k off (``vector_math.sample_vocabulary``): the C extension's passes over the whole vocabulary
against its NumPy twin and against the sampler's small steps composed by hand; the same token for the same
uniform, ties at the nucleus boundary, the distribution, and the edges (top-p 1, min-p 0, a vanishing
temperature, masked and non-finite logits, bad arguments)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.backends import vector_math
from engine.backends.cpu import kernels
from engine.backends.vector_math import NonFiniteLogitsError, sample_vocabulary
from engine.sampling import SamplingParams, final_scores, make_sampler, penalised_logits

NO_IDS = np.empty(0, np.int64)
NO_VALUES = np.empty(0, np.float32)


def _logits(rng: np.random.Generator, kind: int, n: int) -> np.ndarray:
    if kind == 0:  # flat: the nucleus holds most of the vocabulary
        x = rng.normal(0, 1, n)
    elif kind == 1:  # peaked: a few favourites
        x = rng.normal(0, 3, n)
        x[rng.integers(0, n, 3)] += 20
    elif kind == 2:  # ties everywhere, the nucleus boundary among them
        x = rng.integers(-3, 4, n).astype(np.float64)
    elif kind == 3:  # most tokens masked
        x = np.where(rng.random(n) < 0.9, -np.inf, rng.normal(0, 2, n))
        x[rng.integers(0, n)] = 1.0
    else:  # everything equal
        x = np.full(n, 0.25)
    return x.astype(np.float32)


def _case(rng: np.random.Generator, case: int):
    n = int(rng.choice([1, 2, 7, 511, 512, 513, 5000])) if case % 8 else int(rng.choice([151_936, 262_144]))
    logits = _logits(rng, case % 5, n)
    m = int(rng.integers(0, min(n, 64) + 1))
    ids = rng.choice(n, m, replace=False).astype(np.int64)
    values = (logits[ids] - rng.random(m) * 2).astype(np.float32)
    settings = dict(top_p=float(rng.choice([0.0, 0.3, 0.9, 0.95, 1 - 1e-9, 1.0])),
                    min_p=float(rng.choice([0.0, 0.05, 0.5, 1.0])),
                    temperature=float(rng.choice([1e-3, 0.8, 1.0, 1.7, 50.0])))
    return logits, ids, values, settings


def test_c_and_numpy_draw_the_same_token_for_the_same_uniform():
    ext = kernels._ext
    assert ext is not None, "the C extension must be built for this comparison"
    rng = np.random.default_rng(31)
    for case in range(400):
        logits, ids, values, s = _case(rng, case)
        u = float(rng.random())
        got = ext.sample_vocabulary(logits, ids, values, s["top_p"], s["min_p"], s["temperature"], u)
        want = vector_math._sample_vocabulary_numpy(logits, ids, values, s["top_p"], s["min_p"], s["temperature"], u)
        assert got[0] == want[0], (case, logits.size, s, u)
        assert got[1] == pytest.approx(want[1], abs=1e-6), (case, s)


def test_the_sampler_with_top_k_off_draws_what_its_steps_composed_by_hand_draw(implementation):
    rng = np.random.default_rng(32)
    for case in range(48):
        logits, _, _, s = _case(rng, case)
        params = SamplingParams(top_k=0, seed=case, repeat_penalty=float(rng.choice([1.0, 1.3])),
                                presence_penalty=float(rng.choice([0.0, 0.5])), **s)
        history = rng.integers(0, logits.size, int(rng.integers(0, 80))).tolist()
        sampler, uniforms = make_sampler(params), np.random.Generator(np.random.PCG64(np.random.SeedSequence(case)))
        for _ in range(3):
            token, logprob = sampler(logits, history)
            weights = vector_math.exp_shifted(final_scores(penalised_logits(logits, history, params), params))
            want, total = vector_math.inverse_cdf(weights, uniforms.random())
            assert token == want, (case, params)
            assert logprob == pytest.approx(math.log(weights[want]) - math.log(total), abs=1e-6)
            history.append(token)


def test_ties_at_the_nucleus_boundary_keep_the_lowest_ids(implementation):
    rng = np.random.default_rng(33)
    logits = rng.normal(-12, 1, 20_000).astype(np.float32)
    tied = np.sort(rng.choice(20_000, 3000, replace=False))
    logits[tied] = 2.0  # 3000 tokens of weight 1, the rest about e^-13.5 each
    total = float(vector_math.exp_shifted(logits).sum(dtype=np.float64))
    p = 900.5 / total  # the 901st tied token crosses p
    kept = tied[:901]
    mask = vector_math.nucleus_mask(vector_math.exp_shifted(logits), p)
    assert np.flatnonzero(mask).tolist() == kept.tolist()
    drawn = {sample_vocabulary(logits, (j + 0.5) / 3000, top_p=p)[0] for j in range(3000)}
    assert drawn == set(kept.tolist())  # evenly spread uniforms reach every kept token and nothing else


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_min_p_is_relative_to_the_best_token_top_p_kept(implementation, temperature):
    logits = np.full(5000, -3.0, np.float32)
    best = np.float32(1e-3)
    logits[[7, 9]] = [np.nextafter(best, np.float32(0)), best]  # both weigh exactly 1: top-p 0 keeps id 7 alone
    assert vector_math.exp_shifted(logits)[7] == 1.0
    assert sample_vocabulary(logits, 0.9, top_p=0.0, min_p=1.0, temperature=temperature) == (7, 0.0)


def test_top_p_and_min_p_off_sample_the_tempered_softmax(implementation):
    rng = np.random.default_rng(34)
    logits = np.full(151_936, -np.inf, np.float32)
    ids = rng.choice(151_936, 6, replace=False)
    logits[ids] = [3.0, 2.5, 2.0, 1.0, 0.0, -1.0]
    probs = np.exp(logits[ids].astype(np.float64) / 0.8)
    probs /= probs.sum()
    draws = [sample_vocabulary(logits, u, temperature=0.8)[0] for u in rng.random(3000)]
    observed = np.array([draws.count(int(i)) for i in ids])
    assert observed.sum() == 3000  # nothing masked was drawn
    assert float(((observed - probs * 3000) ** 2 / (probs * 3000)).sum()) < 20.515  # chi-square, 5 dof, p = 0.001


def test_top_p_min_p_and_temperature_sample_the_filtered_distribution(implementation):
    rng = np.random.default_rng(35)
    logits = rng.normal(-20, 1, 151_936).astype(np.float32)
    ids = rng.choice(151_936, 8, replace=False)
    logits[ids] = [3.0, 2.6, 2.2, 1.9, 1.0, 0.0, -1.0, -3.0]
    params = SamplingParams(top_k=0, top_p=0.9, min_p=0.05, temperature=0.8, repeat_penalty=1.0)
    scores = final_scores(logits, params).astype(np.float64)
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    kept = np.flatnonzero(probs > 0)
    assert 2 < kept.size < 8  # top-p and min-p both cut something
    draws = np.array([sample_vocabulary(logits, u, 0.9, 0.05, 0.8)[0] for u in rng.random(3000)])
    assert set(draws.tolist()) <= set(kept.tolist())
    observed = np.array([np.count_nonzero(draws == i) for i in kept])
    want = probs[kept] * 3000
    assert float(((observed - want) ** 2 / want).sum()) < 18.467  # chi-square, <= 4 dof, p = 0.001


def test_a_vanishing_temperature_takes_the_best_and_an_overflowing_one_is_refused(implementation):
    logits = np.random.default_rng(36).normal(0, 2, 151_936).astype(np.float32)
    best = int(np.argmax(logits))
    for u in (0.0, 0.5, 1 - 1e-12):
        assert sample_vocabulary(logits, u, 0.95, 0.05, 1e-6)[0] == best
        assert sample_vocabulary(logits, u, temperature=1e-6)[0] == best
    with pytest.raises(NonFiniteLogitsError):  # the logits divided by it overflow float32
        sample_vocabulary(logits, 0.5, temperature=1e-45)


@pytest.mark.parametrize("bad", ["nan", "inf", "all -inf", "penalised nan"])
def test_logits_without_a_finite_choice_are_refused(implementation, bad):
    logits = np.zeros(1000, np.float32)
    ids, values = None, None
    if bad == "nan":
        logits[517] = np.nan
    elif bad == "inf":
        logits[3] = np.inf
    elif bad == "all -inf":
        logits[:] = -np.inf
    else:
        ids, values = np.array([9], np.int64), np.array([np.nan], np.float32)
    with pytest.raises(NonFiniteLogitsError, match="NaN or infinite"):
        sample_vocabulary(logits, 0.3, 0.9, 0.05, 0.8, ids, values)


def test_a_single_finite_logit_is_drawn_with_logprob_zero(implementation):
    logits = np.full(262_144, -np.inf, np.float32)
    logits[200_001] = -5.0
    for u in (0.0, 0.999):
        for top_p, min_p in ((1.0, 0.0), (0.5, 0.5)):
            assert sample_vocabulary(logits, u, top_p, min_p, 0.7) == (200_001, 0.0)


def test_penalised_values_replace_the_models_logits(implementation):
    logits = np.zeros(5000, np.float32)
    logits[7] = 30.0
    ids, values = np.array([7, 4000], np.int64), np.array([-30.0, 40.0], np.float32)
    assert sample_vocabulary(logits, 0.5, 0.95, 0.05, 1.0, ids, values)[0] == 4000
    assert sample_vocabulary(logits, 0.5, 0.95, 0.05, 1.0)[0] == 7


@pytest.mark.parametrize("kwargs, message", [
    (dict(u=1.0), "0 <= u < 1"),
    (dict(temperature=0.0), "temperature > 0"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(ids=[1, 1], values=[0.0, 0.0]), "distinct"),
    (dict(ids=[5000], values=[0.0]), "distinct and in"),
    (dict(ids=[1, 2], values=[0.0]), "differ in length"),
    (dict(logits=np.zeros(10, np.float64)), "float32"),
])
def test_bad_arguments_are_refused(implementation, kwargs, message):
    args = dict(logits=np.zeros(5000, np.float32), u=0.5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sample_vocabulary(**args)
