"""The host-side vector arithmetic the sampler reaches through ``engine.backends.vector_math``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.backends.vector_math import log_sum_exp


def test_log_sum_exp_over_a_large_vocabulary_matches_float64():
    logits = np.random.default_rng(3).normal(0, 4, 151_936).astype(np.float32)
    top = float(logits.max())
    want = math.log(np.exp(logits.astype(np.float64) - top).sum())
    assert abs(log_sum_exp(logits, top) - want) < 1e-5 * max(1.0, abs(want))


def test_a_single_logit_at_the_shift_sums_to_one():
    assert log_sum_exp(np.array([2.5], np.float32), 2.5) == 0.0


@pytest.mark.parametrize("use_c", [True, False])
def test_log_sum_exp_in_c_and_in_numpy_matches_float64_with_masked_tokens(monkeypatch, use_c):
    from engine.backends.cpu import kernels

    assert kernels.AVAILABLE, "the C extension must be built for this comparison"
    if not use_c:
        monkeypatch.setattr(kernels, "_ext", None)
    rng = np.random.default_rng(7)
    for n in (1, 15, 16, 4095, 4097, 49152, 262144):
        x = (rng.standard_normal(n) * 6).astype(np.float32)
        if n > 20:
            x[rng.choice(n, 10, replace=False)] = -np.inf  # a masked token counts for nothing
        top = float(x.max())
        want = np.log(np.exp(x.astype(np.float64) - top).sum())
        assert abs(log_sum_exp(x, top) - want) <= 1e-5 * max(1.0, abs(want)), n  # float sums of 1024
    with pytest.raises(ValueError):
        log_sum_exp(np.zeros((2, 3), np.float32), 0.0)


# -- top-k over a vocabulary: the C extension and the NumPy fallback give the same arrays -------------------

def _reference_top_k(logits: np.ndarray, k: int, ids=(), values=()) -> tuple[np.ndarray, np.ndarray]:
    """A full sort: higher logit first, then lower id."""
    x = logits.copy()
    x[np.asarray(ids, np.int64)] = np.asarray(values, np.float32)
    order = np.lexsort((np.arange(x.size), -x.astype(np.float64)))[:k]
    return order, x[order]


def _cases():
    rng = np.random.default_rng(21)
    for case in range(120):
        n = int(rng.choice([1, 2, 7, 15, 16, 17, 33, 1000, 4099]))
        kind = case % 4
        if kind == 0:
            logits = rng.normal(0, 3, n)
        elif kind == 1:  # many ties: a handful of distinct values
            logits = rng.integers(-2, 3, n).astype(np.float64)
        elif kind == 2:  # masked tokens
            logits = np.where(rng.random(n) < 0.7, -np.inf, rng.normal(0, 1, n))
        else:  # everything equal, or everything masked
            logits = np.full(n, -np.inf if case % 8 == 3 else 0.5)
        k = int(rng.integers(1, n + 1)) if case % 5 else int(rng.choice([1, n]))
        m = int(rng.integers(0, min(n, 70) + 1))
        ids = rng.choice(n, m, replace=False)
        values = np.where(rng.random(m) < 0.5, rng.normal(0, 3, m), logits[ids] / 1.1)
        yield logits.astype(np.float32), k, ids.astype(np.int64), values.astype(np.float32)


def test_top_k_sorted_keeps_the_highest_best_first_lowest_id_among_ties_in_c_and_in_numpy(monkeypatch):
    from engine.backends import vector_math
    from engine.backends.cpu import kernels

    assert kernels.AVAILABLE, "the C extension must be built for this comparison"
    for logits, k, ids, values in _cases():
        want_ids, want_scores = _reference_top_k(logits, k, ids, values)
        got_c = vector_math.top_k_sorted(logits, k, ids, values)
        got_np = vector_math._top_k_sorted_numpy(logits, k, ids, values)
        for got in (got_c, got_np):
            assert got[0].dtype == np.int64 and got[1].dtype == np.float32
            np.testing.assert_array_equal(got[0], want_ids)
            np.testing.assert_array_equal(got[1], want_scores)


def test_top_k_sorted_over_a_152k_vocabulary_with_penalised_ids():
    from engine.backends.vector_math import top_k_sorted

    rng = np.random.default_rng(4)
    logits = rng.normal(0, 3, 151_936).astype(np.float32)
    best = np.argsort(-logits, kind="stable")[:40]
    ids = best[:10]  # the penalty pushes the current favourites down
    values = (logits[ids] - 20).astype(np.float32)
    got_ids, got_scores = top_k_sorted(logits, 40, ids, values)
    want_ids, want_scores = _reference_top_k(logits, 40, ids, values)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_scores, want_scores)
    assert not set(ids.tolist()) & set(got_ids.tolist())
    assert logits[best[0]] == logits.max() and top_k_sorted(logits, 1)[0][0] == best[0]


@pytest.mark.parametrize("use_c", [True, False])
@pytest.mark.parametrize("k, ids, values, message", [
    (0, None, None, "k must be in"),
    (6, None, None, "k must be in"),
    (2, [1, 1], [0.0, 0.0], "distinct"),
    (2, [5], [0.0], "distinct and in"),
    (2, [-1], [0.0], "distinct and in"),
    (2, [1, 2], [0.0], "differ in length"),
])
def test_top_k_sorted_refuses_bad_arguments(monkeypatch, use_c, k, ids, values, message):
    from engine.backends import vector_math
    from engine.backends.cpu import kernels

    if not use_c:
        monkeypatch.setattr(kernels, "_ext", None)
    with pytest.raises(ValueError, match=message):
        vector_math.top_k_sorted(np.zeros(5, np.float32), k, ids, values)
