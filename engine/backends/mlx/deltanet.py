"""The Gated DeltaNet layer on MLX: the twin of engine/deltanet.py (same math, llama.cpp's), and its cache.

The projections are quantized MLX products; the convolution, the delta-rule recurrence (token by token, one
compiled step) and the gated norm run in float32. MLX arrays are immutable, so a state "copy" shares its
arrays and roll-back checkpoints cost nothing until the next token replaces them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np

from ...config import ModelConfig
from ...deltanet import DELTANET_MATRICES, SOFTPLUS_LINEAR_ABOVE, deltanet_tensor_names, recurrent_state_shapes
from ...hybrid_cache import RecurrentStates, recurrent_from_arrays
from ..base import KVState
from .kv_cache import LayerKV, MlxKVCache
from .weights import Matrix, TensorReader, load_matrix, load_vector


@dataclasses.dataclass
class MlxDeltaNet:
    """One recurrent layer's weights (see engine.deltanet.DeltaNetWeights)."""

    w_qkv: Matrix  # (conv_dim, n_embd)
    w_z: Matrix  # (value_dim, n_embd)
    w_beta: Matrix  # (n_v_heads, n_embd)
    w_alpha: Matrix  # (n_v_heads, n_embd)
    conv: mx.array  # (conv_dim, d_conv) float32
    dt_bias: mx.array  # (n_v_heads,) float32
    a: mx.array  # (n_v_heads,) float32
    norm: mx.array  # (head_v_dim,) float32
    w_out: Matrix  # (n_embd, value_dim)

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in vars(self).values())


@dataclasses.dataclass
class MlxRecurrentState:
    """One recurrent layer's state for one sequence, float32 MLX arrays."""

    conv: mx.array  # (d_conv - 1, conv_dim)
    ssm: mx.array  # (n_v_heads, head_k_dim, head_v_dim)

    def copy(self) -> MlxRecurrentState:
        return MlxRecurrentState(self.conv, self.ssm)  # immutable arrays: sharing is a copy

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


def load_mlx_deltanet(reader: TensorReader, config: ModelConfig, layer: int) -> MlxDeltaNet:
    """Layer ``layer``'s recurrent weights; ModelFormatError names a missing or misshapen tensor."""
    fields = {}
    for field, name in deltanet_tensor_names(reader.gguf, config, layer).items():
        if field in DELTANET_MATRICES:
            fields[field] = load_matrix(reader, name)
        else:
            vector = load_vector(reader, name)
            fields[field] = vector.reshape(config.ssm_conv_dim, config.ssm_d_conv) if field == "conv" else vector
    return MlxDeltaNet(**fields)


@mx.compile
def _delta_step(s: mx.array, q: mx.array, k: mx.array, v: mx.array, decay: mx.array, beta: mx.array):
    """One token of the delta rule for every value head: the new state and the (unscaled) output."""
    s = s * decay[:, None, None]
    remembered = (k[:, None, :] @ s)[:, 0, :]  # (n_v_heads, head_v_dim): S^T k
    s = s + k[:, :, None] * ((v - remembered) * beta[:, None])[:, None, :]
    return s, (q[:, None, :] @ s)[:, 0, :]


def _l2_norm(x: mx.array, eps: float) -> mx.array:
    return x * mx.rsqrt(mx.sum(x * x, axis=-1, keepdims=True) + eps)


def _silu(x: mx.array) -> mx.array:
    return x * mx.sigmoid(x)


def mlx_deltanet(h: mx.array, w: MlxDeltaNet, states: Sequence[MlxRecurrentState], config: ModelConfig,
                 dtype: mx.Dtype, snapshots: list[tuple[int, MlxRecurrentState]] | None = None
                 ) -> tuple[mx.array, list[MlxRecurrentState]]:
    """The mixer on normed rows ``h`` (B, L, n_embd): row ``b`` continues ``states[b]``.

    Returns the output (B, L, n_embd) and the new states; with ``snapshots`` (B = 1), ``(t, state after t)``
    for every row but the last is appended.
    """
    c = config
    b, n, _ = h.shape
    qkv = w.w_qkv.matmul(h).astype(mx.float32)  # (B, L, conv_dim)
    z = w.w_z.matmul(h).astype(mx.float32).reshape(b, n, c.ssm_n_v_heads, c.ssm_head_v_dim)
    beta = mx.sigmoid(w.w_beta.matmul(h).astype(mx.float32))  # (B, L, n_v_heads)
    alpha = w.w_alpha.matmul(h).astype(mx.float32) + w.dt_bias
    softplus = mx.where(alpha > SOFTPLUS_LINEAR_ABOVE, alpha,
                        mx.log1p(mx.exp(mx.minimum(alpha, SOFTPLUS_LINEAR_ABOVE))))
    decay = mx.exp(softplus * w.a)
    outs, new_states = [], []
    for row, state in enumerate(states):
        out, new = _mix_one(qkv[row], beta[row], decay[row], w, state, c, snapshots)
        outs.append(out)
        new_states.append(new)
    out = mx.stack(outs)  # (B, L, n_v_heads, head_v_dim)
    gated = mx.fast.rms_norm(out, w.norm, c.rms_eps) * _silu(z)
    return w.w_out.matmul(gated.reshape(b, n, c.ssm_value_dim).astype(dtype)), new_states


def _mix_one(qkv: mx.array, beta: mx.array, decay: mx.array, w: MlxDeltaNet, state: MlxRecurrentState,
             c: ModelConfig, snapshots) -> tuple[mx.array, MlxRecurrentState]:
    """Conv and recurrence of one sequence's rows (L, conv_dim): outputs (L, n_v_heads, head_v_dim)."""
    n = qkv.shape[0]
    conv_in = mx.concatenate([state.conv, qkv])  # (d_conv - 1 + L, conv_dim)
    conv_out = conv_in[0:n] * w.conv[:, 0]
    for i in range(1, c.ssm_d_conv):
        conv_out = conv_out + conv_in[i:i + n] * w.conv[:, i]
    conv_out = _silu(conv_out)
    key_dim, repeat = c.ssm_n_k_heads * c.ssm_d_state, c.ssm_n_v_heads // c.ssm_n_k_heads
    q = mx.tile(_l2_norm(conv_out[:, :key_dim].reshape(n, c.ssm_n_k_heads, c.ssm_d_state), c.rms_eps), (1, repeat, 1))
    k = mx.tile(_l2_norm(conv_out[:, key_dim:2 * key_dim].reshape(n, c.ssm_n_k_heads, c.ssm_d_state), c.rms_eps),
                (1, repeat, 1))
    v = conv_out[:, 2 * key_dim:].reshape(n, c.ssm_n_v_heads, c.ssm_head_v_dim)
    s, outs = state.ssm, []
    for t in range(n):
        s, o = _delta_step(s, q[t], k[t], v[t], decay[t], beta[t])
        outs.append(o)
        if snapshots is not None and t < n - 1:
            snapshots.append((t, MlxRecurrentState(conv_in[t + 1:t + c.ssm_d_conv], s)))
    scale = 1.0 / float(np.sqrt(c.ssm_head_v_dim))
    return mx.stack(outs) * scale, MlxRecurrentState(conv_in[n:], s)


class MlxHybridCache(MlxKVCache):
    """MLX KV buffers for the attention layers (recurrent layers hold none) plus ``recurrent`` states with
    the roll-back checkpoints of engine.hybrid_cache.RecurrentStates."""

    def __init__(self, config: ModelConfig, n_ctx: int, replay: Callable[[MlxKVCache, Sequence[int]], None],
                 dtype: mx.Dtype = mx.float32):
        conv_shape, ssm_shape = recurrent_state_shapes(config)
        self.recurrent = RecurrentStates(lambda: {il: MlxRecurrentState(mx.zeros(conv_shape), mx.zeros(ssm_shape))
                                                  for il in config.recurrent_layers})
        super().__init__(config, n_ctx, replay, dtype)

    def _new_layer(self, i: int) -> LayerKV:
        layer = super()._new_layer(i)
        if self.config.is_recurrent(i):
            layer.max_slots = 0  # never grows
        return layer

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.recurrent.nbytes()

    def arrays(self) -> list[mx.array]:
        return super().arrays() + [a for s in self.recurrent.live.values() for a in (s.conv, s.ssm)]

    def record(self, ids: Sequence[int]) -> None:
        super().record(ids)
        self.recurrent.end_call(ids)

    def truncate(self, n_past: int) -> None:
        """Go back to ``n_past``: from a checkpoint, replaying the tokens after it (engine.hybrid_cache)."""
        if not 0 <= n_past <= self._n_past:
            raise ValueError(f"cannot truncate a cache of {self._n_past} positions to {n_past}")
        if n_past == self._n_past:
            return
        replay = self.recurrent.rewind(n_past)
        self._n_past = n_past - len(replay)
        if self.tokens is not None:
            del self.tokens[self._n_past:]
        if replay:
            self._replay(self, replay)

    def export_state(self) -> KVState:
        n, c = self._n_past, self.config
        keys, values = [], []
        for il, layer in enumerate(self.layers):
            held = 0 if c.is_recurrent(il) else n
            keys.append(np.array(layer.keys[0, :, :held], np.float32))
            values.append(np.array(layer.values[0, :, :held], np.float32))
        recurrent = [np.array(a, np.float32) for il in c.recurrent_layers
                     for a in (self.recurrent.live[il].conv, self.recurrent.live[il].ssm)]
        return KVState(keys=keys, values=values, n_past=n, recurrent=recurrent)

    def import_state(self, state: KVState) -> None:
        c = self.config
        live = {il: MlxRecurrentState(mx.array(s.conv), mx.array(s.ssm))
                for il, s in recurrent_from_arrays(c, state.recurrent).items()}
        if len(state.keys) != c.n_layers or len(state.values) != c.n_layers:
            raise ValueError(f"the state has {len(state.keys)} layers, the model {c.n_layers}")
        self._n_past, self.tokens = 0, None
        self.reserve(state.n_past)
        for il, (layer, k, v) in enumerate(zip(self.layers, state.keys, state.values)):
            held = 0 if c.is_recurrent(il) else state.n_past
            if k.shape != (c.n_kv_heads, held, c.head_dim) or v.shape != (c.n_kv_heads, held, c.v_head_dim):
                raise ValueError(f"KV shapes {k.shape}/{v.shape} of layer {il} do not fit this model")
            if held:
                layer.store(mx.array(k[None], self.dtype), mx.array(v[None], self.dtype), 0)
                mx.eval(layer.keys, layer.values)
        self.recurrent.reset_to(live, state.n_past)
        self._n_past = state.n_past
