"""Mixture-of-experts routing (llama.cpp's ``build_moe_ffn``): which experts each token uses, with what weight.

The router's logits become probabilities (softmax or sigmoid, as ``ModelConfig.expert_gating`` says); each
token takes its ``n_expert_used`` most probable experts (with the selection bias added, where a model has
one, for the choice only); their probabilities, renormalised and scaled as the config asks, weight the
experts' outputs. Backends call ``route`` and then run only the chosen experts, grouped by ``expert_groups``
so that a chunk's tokens that share an expert share one product.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .config import ModelConfig

MIN_WEIGHT_SUM = 6.103515625e-5  # llama.cpp clamps the renormalising sum here (the smallest normal float16)


def expert_probabilities(logits: np.ndarray, gating: str) -> np.ndarray:
    """Router logits (n, n_expert) -> probabilities (n, n_expert) float32."""
    logits = logits.astype(np.float32, copy=False)
    if gating == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)
    if gating == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    raise ValueError(f"unknown expert gating {gating!r}")


def route(logits: np.ndarray, config: ModelConfig, selection_bias: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray]:
    """The chosen experts and their weights for router logits (n, n_expert).

    Args:
        logits: float32 (n, n_expert), the router's output (its bias, if any, already added).
        config: gives ``n_expert_used``, ``expert_gating``, ``expert_norm_weights``, ``expert_weights_scale``.
        selection_bias: (n_expert,) added to the probabilities for the choice only (not to the weights), or None.

    Returns:
        experts (n, n_expert_used) int64, most probable first, and weights (n, n_expert_used) float32.
    """
    probs = expert_probabilities(logits, config.expert_gating)
    choice = probs if selection_bias is None else probs + selection_bias
    k = config.n_expert_used
    experts = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, experts, axis=-1)
    if config.expert_norm_weights:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(MIN_WEIGHT_SUM))
    if config.expert_weights_scale not in (0.0, 1.0):
        weights = weights * np.float32(config.expert_weights_scale)
    return experts, weights.astype(np.float32, copy=False)


def expert_groups(experts: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Per expert some token chose: (expert, the rows that chose it, the slot of the choice in each row)."""
    for expert in np.unique(experts):
        rows, slots = np.nonzero(experts == expert)
        yield int(expert), rows, slots
