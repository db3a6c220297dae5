"""Mixture-of-experts routing (llama.cpp's ``build_moe_ffn``): which experts each token uses, with what weight.

The router's logits (plus its bias, where a model has one) become probabilities as ``ModelConfig.expert_gating``
says: a softmax or a sigmoid over all experts, or (``softmax_weight``, gpt-oss) the raw logits, of which only
the chosen ones go through a softmax afterwards. Each token takes its ``n_expert_used`` most probable experts
(with the selection bias ``exp_probs_b`` added, where a model has one, for the choice only); their weights,
renormalised and scaled as the config asks, multiply the experts' outputs (or inputs, with
``expert_weights_before``). Backends call ``route`` and then run only the chosen experts, grouped by
``expert_groups`` so that a chunk's tokens that share an expert share one product. ``swiglu_oai`` is gpt-oss's
clamped gated activation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .config import ModelConfig

MIN_WEIGHT_SUM = 6.103515625e-5  # llama.cpp clamps the renormalising sum here (the smallest normal float16)
SWIGLU_OAI_ALPHA = np.float32(1.702)  # llama.cpp LLM_FFN_SWIGLU_OAI_MOE's constants (build_moe_ffn)
SWIGLU_OAI_LIMIT = np.float32(7.0)


def expert_probabilities(logits: np.ndarray, gating: str) -> np.ndarray:
    """Router logits (n, n_expert) -> probabilities (n, n_expert) float32."""
    logits = logits.astype(np.float32, copy=False)
    if gating == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)
    if gating == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    if gating == "softmax_weight":  # chosen on the logits; the softmax comes after the choice (route)
        return logits
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
    if config.expert_gating == "softmax_weight":
        weights = expert_probabilities(weights, "softmax")
    if config.expert_norm_weights:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(MIN_WEIGHT_SUM))
    if config.expert_weights_scale not in (0.0, 1.0):
        weights = weights * np.float32(config.expert_weights_scale)
    return experts, weights.astype(np.float32, copy=False)


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gpt-oss's gated activation (ggml_swiglu_oai): x = min(gate, 7), y = clip(up, -7, 7),
    x * sigmoid(1.702 x) * (y + 1)."""
    x = np.minimum(gate, SWIGLU_OAI_LIMIT)
    y = np.clip(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return x / (np.float32(1.0) + np.exp(-SWIGLU_OAI_ALPHA * x)) * (y + np.float32(1.0))


def expert_groups(experts: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Per expert some token chose: (expert, the rows that chose it, the slot of the choice in each row)."""
    for expert in np.unique(experts):
        rows, slots = np.nonzero(experts == expert)
        yield int(expert), rows, slots


def moe_ffn(h: np.ndarray, layer: Any, config: ModelConfig, matmul: Callable, matrix_rows: Callable,
            gated: Callable[[np.ndarray, np.ndarray], np.ndarray], logits: np.ndarray | None = None,
            down_scale: np.ndarray | None = None) -> np.ndarray:
    """The mixture-of-experts FFN of normed rows ``h`` (n, n_embd) on the NumPy and C backends.

    Only the chosen experts run, each once for all the rows that chose it (one product per expert and matrix);
    their outputs, biased where the model has expert biases, are summed with the router's weights; a shared
    expert, where the model has one, runs on every row (times its sigmoid gate).

    Args:
        layer: a ``numpy_backend.Layer`` with the router, the stacked expert matrices and the optional biases
            and shared expert.
        matmul: ``(x, w) -> x @ w.T`` on the backend's matrices; matrix_rows: ``(w, slice) -> rows of w``.
        gated: the gated activation ``(gate, up) -> hidden``.
        logits: the router's logits (n, n_expert) where the model computes them from another input (gemma4);
            None: ``h`` times the router.
        down_scale: (n_expert,) each expert's output multiplier (gemma4's ``ffn_down_exps.scale``), or None.

    Returns:
        (n, n_embd) float32.
    """
    c = config
    if logits is None:
        logits = matmul(h, layer.w_router)  # (n, n_expert)
    if layer.b_router is not None:
        logits = logits + layer.b_router
    experts, weights = route(logits, c, layer.exp_probs_b)  # (n, n_expert_used) each
    out = np.zeros((h.shape[0], c.n_embd), dtype=np.float32)  # (n, n_embd)
    for expert, rows, slots in expert_groups(experts):
        ff = slice(expert * c.n_ff_exp, (expert + 1) * c.n_ff_exp)
        down = slice(expert * c.n_embd, (expert + 1) * c.n_embd)
        weight = weights[rows, slots][:, None]  # (rows, 1)
        x = np.ascontiguousarray(h[rows] * weight if c.expert_weights_before else h[rows], dtype=np.float32)
        gate = matmul(x, matrix_rows(layer.w_gate_exps, ff))
        up = matmul(x, matrix_rows(layer.w_up_exps, ff))
        if layer.b_gate_exps is not None:
            gate, up = gate + layer.b_gate_exps[ff], up + layer.b_up_exps[ff]
        y = matmul(np.ascontiguousarray(gated(gate, up), dtype=np.float32), matrix_rows(layer.w_down_exps, down))
        if down_scale is not None:
            y = y * down_scale[expert]
        if layer.b_down_exps is not None:
            y = y + layer.b_down_exps[down]
        np.add.at(out, rows, y if c.expert_weights_before else y * weight)
    if layer.w_gate_shexp is not None:
        out += shared_expert(h, layer, matmul, gated)
    return out


def shared_expert(h: np.ndarray, layer: Any, matmul: Callable, gated: Callable) -> np.ndarray:
    """The shared expert's output for rows ``h`` (n, n_embd), times ``sigmoid(h . w_gate_inp_shexp)`` where the
    model has that gate (qwen2moe)."""
    hidden = gated(matmul(h, layer.w_gate_shexp), matmul(h, layer.w_up_shexp))
    out = matmul(np.ascontiguousarray(hidden, dtype=np.float32), layer.w_down_shexp)
    if layer.w_gate_inp_shexp is not None:
        out = out / (np.float32(1.0) + np.exp(-(h @ layer.w_gate_inp_shexp)))[:, None]
    return out
