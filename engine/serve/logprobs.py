"""``top_logprobs``: the most likely tokens at each step under the model's distribution (log-softmax of its logits)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..sequence import Sampler


class TopLogprobs:
    """Wraps a request's sampler and records the ``k`` most likely tokens with their log-probabilities each step.

    ``steps[i]`` belongs to the request's i-th generated token; it is written on the scheduler's thread before
    that token's event is queued, so a reader that has the event can read its step.
    """

    def __init__(self, k: int):
        self.k = k
        self.steps: list[list[tuple[int, float]]] = []
        self.sample: Sampler | None = None

    def wrap(self, sample: Sampler) -> Sampler:
        self.sample = sample
        return self

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> tuple[int, float]:
        token, logprob = self.sample(logits, history)
        scores = np.asarray(logits, dtype=np.float64)
        top = scores.max()
        log_total = top + np.log(np.exp(scores - top).sum())
        k = min(self.k, scores.size)
        best = np.argpartition(-scores, k - 1)[:k]
        best = best[np.argsort(-scores[best], kind="stable")]
        self.steps.append([(int(i), float(scores[i] - log_total)) for i in best])
        return token, logprob
