"""The Gated DeltaNet layer of hybrid models (qwen35, qwen35moe), in NumPy: weights, per-sequence state, math.

As llama.cpp computes it (src/models/qwen35.cpp, delta-net-base.cpp, ggml's ``ssm_conv`` and
``gated_delta_net``): the normed input is projected to ``qkv`` (conv_dim), the output gate ``z``, ``beta``
and ``alpha`` (one per value head). ``qkv`` goes through a short causal depthwise convolution (kernel
``ssm_d_conv``, whose last ``d_conv - 1`` inputs are the conv state) and SiLU, then splits into q, k (L2-normed,
``n_k_heads`` heads, value head ``h`` reading key head ``h % n_k_heads``) and v. Per value head, the state
``S`` (head_k_dim x head_v_dim) decays by ``exp(g)``, with ``g = softplus(alpha + dt_bias) * ssm_a``; then
``S += k (x) beta * (v - S^T k)`` (the delta rule), and the output is ``S^T q / sqrt(head_v_dim)``. The output is
RMS-normed per head, multiplied by ``silu(z)`` and projected by ``ssm_out``.

Backends pass their own ``matmul`` (the C backend its packed-block products); the recurrence itself runs
token by token in float32, so a token gives the same state whether it came alone or inside a chunk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from .config import ModelConfig
from .gguf_file import GGUFFile, ModelFormatError

# field -> tensor suffix in blk.N.; all are required in a recurrent layer
DELTANET_TENSORS = {
    "w_qkv": "attn_qkv.weight",
    "w_z": "attn_gate.weight",
    "w_beta": "ssm_beta.weight",
    "w_alpha": "ssm_alpha.weight",
    "conv": "ssm_conv1d.weight",
    "dt_bias": "ssm_dt.bias",
    "a": "ssm_a",
    "norm": "ssm_norm.weight",
    "w_out": "ssm_out.weight",
}
DELTANET_MATRICES = ("w_qkv", "w_z", "w_beta", "w_alpha", "w_out")
SOFTPLUS_LINEAR_ABOVE = 20.0  # ggml's softplus returns x itself above this


@dataclasses.dataclass
class DeltaNetWeights:
    """One recurrent layer's weights; matrices are whatever the backend's ``matmul`` takes."""

    w_qkv: Any  # (conv_dim, n_embd): q (key_dim), k (key_dim), v (value_dim)
    w_z: Any  # (value_dim, n_embd): the output gate
    w_beta: Any  # (n_v_heads, n_embd)
    w_alpha: Any  # (n_v_heads, n_embd)
    conv: np.ndarray  # (conv_dim, d_conv) float32: the depthwise kernel, oldest input first
    dt_bias: np.ndarray  # (n_v_heads,)
    a: np.ndarray  # (n_v_heads,): -exp(A_log), negative
    norm: np.ndarray  # (head_v_dim,)
    w_out: Any  # (n_embd, value_dim)

    @property
    def nbytes(self) -> int:
        return sum(getattr(w, "nbytes", 0) for w in vars(self).values())


@dataclasses.dataclass
class RecurrentState:
    """One recurrent layer's state for one sequence: what replaces its KV cache."""

    conv: np.ndarray  # (d_conv - 1, conv_dim) float32: the last inputs of the convolution
    ssm: np.ndarray  # (n_v_heads, head_k_dim, head_v_dim) float32: S, mapping keys to values

    @classmethod
    def zeros(cls, config: ModelConfig) -> RecurrentState:
        conv_shape, ssm_shape = recurrent_state_shapes(config)
        return cls(np.zeros(conv_shape, np.float32), np.zeros(ssm_shape, np.float32))

    def copy(self) -> RecurrentState:
        return RecurrentState(self.conv.copy(), self.ssm.copy())

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


def recurrent_state_shapes(config: ModelConfig) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """Shapes of a recurrent layer's (conv, ssm) state."""
    c = config
    return (c.ssm_d_conv - 1, c.ssm_conv_dim), (c.ssm_n_v_heads, c.ssm_d_state, c.ssm_head_v_dim)


def recurrent_state_bytes(config: ModelConfig, copies: int = 1) -> int:
    """Bytes of ``copies`` float32 copies of every recurrent layer's state (0 for a model without such layers)."""
    conv, ssm = recurrent_state_shapes(config) if config.is_hybrid else ((0, 0), (0, 0, 0))
    return 4 * copies * len(config.recurrent_layers) * (int(np.prod(conv)) + int(np.prod(ssm)))


def deltanet_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GGML shapes (row length first) of a recurrent layer's tensors, by field."""
    c = config
    return {"w_qkv": (c.n_embd, c.ssm_conv_dim), "w_z": (c.n_embd, c.ssm_value_dim),
            "w_beta": (c.n_embd, c.ssm_n_v_heads), "w_alpha": (c.n_embd, c.ssm_n_v_heads),
            "conv": (c.ssm_d_conv, c.ssm_conv_dim), "dt_bias": (c.ssm_n_v_heads,), "a": (c.ssm_n_v_heads,),
            "norm": (c.ssm_head_v_dim,), "w_out": (c.ssm_value_dim, c.n_embd)}


def deltanet_tensor_names(gguf: GGUFFile, config: ModelConfig, layer: int) -> dict[str, str]:
    """Layer ``layer``'s recurrent tensors by field; ModelFormatError names a missing or misshapen one."""
    shapes = deltanet_tensor_shapes(config)
    names = {}
    for field, suffix in DELTANET_TENSORS.items():
        name = f"blk.{layer}.{suffix}"
        if name not in gguf.tensors:
            raise ModelFormatError(f"the model has no tensor {name!r}, which {config.arch}'s recurrent layer {layer} needs")
        if gguf.tensors[name].shape != shapes[field]:
            raise ModelFormatError(f"tensor {name!r} has shape {gguf.tensors[name].shape}, expected {shapes[field]}")
        names[field] = name
    return names


def load_deltanet(gguf: GGUFFile, config: ModelConfig, layer: int, load_matrix: Callable[[str], Any],
                  load_vector: Callable[[str], np.ndarray]) -> DeltaNetWeights:
    """Layer ``layer``'s recurrent weights, matrices through ``load_matrix``, the rest as float32.

    Raises ModelFormatError naming a missing tensor or one of the wrong shape.
    """
    fields = {}
    for field, name in deltanet_tensor_names(gguf, config, layer).items():
        if field in DELTANET_MATRICES:
            fields[field] = load_matrix(name)
        else:
            vector = load_vector(name)
            fields[field] = vector.reshape(config.ssm_conv_dim, config.ssm_d_conv) if field == "conv" else vector
    return DeltaNetWeights(**fields)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > SOFTPLUS_LINEAR_ABOVE, x, np.log1p(np.exp(np.minimum(x, SOFTPLUS_LINEAR_ABOVE))))


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(sum(x^2) + eps)`` over the last axis (llama.cpp's build_gdn_l2_norm)."""
    return x / np.sqrt(np.sum(np.square(x), axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@dataclasses.dataclass
class DeltaNetInputs:
    """The projections of a chunk's rows: what the convolution and the recurrence read."""

    qkv: np.ndarray  # (n, conv_dim)
    z: np.ndarray  # (n, value_dim): the output gate before SiLU
    beta: np.ndarray  # (n, n_v_heads): sigmoid of the beta projection, the delta rule's step
    decay: np.ndarray  # (n, n_v_heads): exp(g), the state's decay per token

    def rows(self, rows: slice) -> DeltaNetInputs:
        return DeltaNetInputs(self.qkv[rows], self.z[rows], self.beta[rows], self.decay[rows])


def deltanet_project(h: np.ndarray, w: DeltaNetWeights, matmul: Callable[[np.ndarray, Any], np.ndarray]
                     ) -> DeltaNetInputs:
    """The input projections of normed rows ``h`` (n, n_embd); rows may come from different sequences."""
    gate = softplus(matmul(h, w.w_alpha) + w.dt_bias) * w.a  # (n, n_v_heads), <= 0: log of the decay
    return DeltaNetInputs(qkv=matmul(h, w.w_qkv), z=matmul(h, w.w_z),
                          beta=(1.0 / (1.0 + np.exp(-matmul(h, w.w_beta)))).astype(np.float32),
                          decay=np.exp(gate).astype(np.float32))


def deltanet_mix(inputs: DeltaNetInputs, w: DeltaNetWeights, state: RecurrentState, config: ModelConfig,
                 snapshots: list[tuple[int, RecurrentState]] | None = None) -> np.ndarray:
    """Conv, delta-rule recurrence and gated norm of one sequence's consecutive rows; updates ``state``.

    Args:
        inputs: ``deltanet_project`` of the rows (n of them).
        w: the layer's weights.
        state: the sequence's state for this layer, advanced by the n tokens in place.
        config: gives the DeltaNet dimensions and ``rms_eps``.
        snapshots: if given, ``(t, state after row t)`` is appended for every row but the last (roll-back
            points of a speculative verify pass; the last row's state is ``state`` itself).

    Returns:
        float32 (n, value_dim): the input of the ``ssm_out`` projection.
    """
    c = config
    n = inputs.qkv.shape[0]
    conv_in = np.concatenate([state.conv, inputs.qkv])  # (d_conv - 1 + n, conv_dim)
    conv_out = conv_in[0:n] * w.conv[:, 0]
    for i in range(1, c.ssm_d_conv):
        conv_out = conv_out + conv_in[i:i + n] * w.conv[:, i]
    conv_out = _silu(conv_out).astype(np.float32, copy=False)
    key_dim = c.ssm_n_k_heads * c.ssm_d_state
    repeat = c.ssm_n_v_heads // c.ssm_n_k_heads  # value head h reads key head h % n_k_heads (ggml's repeat)
    q = np.tile(l2_norm(conv_out[:, :key_dim].reshape(n, c.ssm_n_k_heads, c.ssm_d_state), c.rms_eps), (1, repeat, 1))
    k = np.tile(l2_norm(conv_out[:, key_dim:2 * key_dim].reshape(n, c.ssm_n_k_heads, c.ssm_d_state), c.rms_eps),
                (1, repeat, 1))
    v = conv_out[:, 2 * key_dim:].reshape(n, c.ssm_n_v_heads, c.ssm_head_v_dim)
    out = np.empty((n, c.ssm_n_v_heads, c.ssm_head_v_dim), np.float32)  # (n, n_v_heads, head_v_dim)
    scale = np.float32(1.0 / np.sqrt(c.ssm_head_v_dim))
    s = state.ssm
    for t in range(n):
        s *= inputs.decay[t][:, None, None]
        remembered = (k[t][:, None, :] @ s)[:, 0, :]  # (n_v_heads, head_v_dim): S^T k
        delta = (v[t] - remembered) * inputs.beta[t][:, None]
        s += k[t][:, :, None] * delta[:, None, :]
        out[t] = (q[t][:, None, :] @ s)[:, 0, :] * scale
        if snapshots is not None and t < n - 1:
            snapshots.append((t, RecurrentState(conv_in[t + 1:t + c.ssm_d_conv].copy(), s.copy())))
    state.conv = conv_in[n:].copy()
    normed = out * (1.0 / np.sqrt(np.mean(np.square(out), axis=-1, keepdims=True) + np.float32(c.rms_eps))) * w.norm
    z = inputs.z.reshape(n, c.ssm_n_v_heads, c.ssm_head_v_dim)
    return (normed * _silu(z)).reshape(n, c.ssm_value_dim).astype(np.float32, copy=False)
