"""The MLX mixture-of-experts FFN block: routed on the host (engine/moe.py), the chosen experts run on the device.

Each chosen expert runs once on the rows of a chunk that chose it; expert biases, gpt-oss's clamped SwiGLU and a
shared expert (with its sigmoid gate) are taken where ``ModelConfig`` and the layer's tensors say.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import mlx.core as mx
import numpy as np

from ...config import ModelConfig
from ...model_tensors import TensorRef
from ...moe import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, expert_groups, route


@partial(mx.compile, shapeless=True)
def swiglu_oai_gated(gate: mx.array, up: mx.array) -> mx.array:
    """gpt-oss's clamped SwiGLU (``engine.moe.swiglu_oai``) as one fused kernel, in float32."""
    x = mx.minimum(gate.astype(mx.float32), float(SWIGLU_OAI_LIMIT))
    y = mx.clip(up.astype(mx.float32), -float(SWIGLU_OAI_LIMIT), float(SWIGLU_OAI_LIMIT))
    return (x * mx.sigmoid(float(SWIGLU_OAI_ALPHA) * x) * (y + 1.0)).astype(gate.dtype)


def moe_ffn(h: mx.array, layer: Any, config: ModelConfig, gated: Callable, rows_of: Callable, dtype: mx.Dtype,
            logits: mx.array | None = None, down_scale: np.ndarray | None = None) -> mx.array:
    """The mixture-of-experts FFN of normed rows ``h`` (..., n_embd) -> (..., n_embd) float32.

    Args:
        layer: an ``mlx_backend.LayerWeights`` with the router and stacked experts (and optional biases and
            shared expert).
        gated: the gated activation ``(gate, up) -> hidden``.
        rows_of: ``(matrix, TensorRef) -> the matrix's rows`` (views).
        dtype: the backend's matmul dtype.
        logits: the router's logits (..., n_expert) where the model computes them from another input (gemma4).
        down_scale: (n_expert,) each expert's output multiplier (gemma4's ``ffn_down_exps.scale``), or None.
    """
    c = config
    shape = h.shape
    rows_in = h.reshape(-1, c.n_embd)  # (n, n_embd)
    if logits is None:
        logits = layer.w_router.matmul(rows_in)
    logits = logits.reshape(-1, c.n_expert).astype(mx.float32)  # (n, n_expert)
    if layer.b_router is not None:
        logits = logits + layer.b_router.astype(mx.float32)
    selection_bias = None if layer.exp_probs_b is None else np.array(layer.exp_probs_b.astype(mx.float32))
    experts, weights = route(np.array(logits), c, selection_bias)  # a host sync; (n, n_expert_used) each
    out = mx.zeros((rows_in.shape[0], c.n_embd), dtype=mx.float32)  # (n, n_embd)
    for expert, rows, slots in expert_groups(experts):
        ff = slice(expert * c.n_ff_exp, (expert + 1) * c.n_ff_exp)
        down = slice(expert * c.n_embd, (expert + 1) * c.n_embd)
        index = mx.array(rows)
        weight = mx.array(weights[rows, slots])[:, None]  # (rows, 1)
        x = rows_in[index]
        if c.expert_weights_before:
            x = (x.astype(mx.float32) * weight).astype(dtype)
        gate = rows_of(layer.w_gate_exps, TensorRef("", ff.start, ff.stop)).matmul(x)
        up = rows_of(layer.w_up_exps, TensorRef("", ff.start, ff.stop)).matmul(x)
        if layer.b_gate_exps is not None:
            gate, up = gate + layer.b_gate_exps[ff], up + layer.b_up_exps[ff]
        act = gated(gate, up).astype(dtype)
        y = rows_of(layer.w_down_exps, TensorRef("", down.start, down.stop)).matmul(act).astype(mx.float32)
        if down_scale is not None:
            y = y * float(down_scale[expert])
        if layer.b_down_exps is not None:
            y = y + layer.b_down_exps[down].astype(mx.float32)
        out = out.at[index].add(y if c.expert_weights_before else y * weight)
    if layer.w_gate_shexp is not None:
        out = out + shared_expert(rows_in, layer, gated, dtype)
    return out.reshape(*shape[:-1], c.n_embd)


def shared_expert(h: mx.array, layer: Any, gated: Callable, dtype: mx.Dtype) -> mx.array:
    """The shared expert of rows ``h`` (n, n_embd), times its sigmoid gate where the model has one; float32."""
    hidden = gated(layer.w_gate_shexp.matmul(h), layer.w_up_shexp.matmul(h)).astype(dtype)
    out = layer.w_down_shexp.matmul(hidden).astype(mx.float32)
    if layer.w_gate_inp_shexp is not None:
        gate = h.astype(mx.float32) @ layer.w_gate_inp_shexp.astype(mx.float32)  # (n,)
        out = out * mx.sigmoid(gate)[:, None]
    return out
