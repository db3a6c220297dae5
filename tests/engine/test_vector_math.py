"""The host-side vector arithmetic the sampler reaches through ``engine.backends.vector_math``."""

from __future__ import annotations

import math

import numpy as np

from engine.backends.vector_math import log_sum_exp


def test_log_sum_exp_over_a_large_vocabulary_matches_float64():
    logits = np.random.default_rng(3).normal(0, 4, 151_936).astype(np.float32)
    top = float(logits.max())
    want = math.log(np.exp(logits.astype(np.float64) - top).sum())
    assert abs(log_sum_exp(logits, top) - want) < 1e-5 * max(1.0, abs(want))


def test_a_single_logit_at_the_shift_sums_to_one():
    assert log_sum_exp(np.array([2.5], np.float32), 2.5) == 0.0
