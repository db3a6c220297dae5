"""The MLX KV cache: per-layer buffers grown in steps, and rings for sliding-window layers.

A full-attention layer keeps every position, in a buffer grown ``GROWTH_STEP`` positions at a time up to
``n_ctx``. A sliding-window layer (Gemma 3) only ever looks back ``window - 1`` positions, so it keeps a ring
of ``window - 1 + MAX_CHUNK`` slots: position ``p`` lives in slot ``p % slots``. The extra ``MAX_CHUNK``
slots hold a whole forward chunk next to the window it attends to, and let ``truncate`` roll back up to
``MAX_CHUNK`` positions for free; a deeper rollback replays the kept prefix through the model (the cache
remembers its token ids for that), which costs one prefill.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np

from ...config import ModelConfig
from ...kv_cache import GROWTH_STEP
from ..base import KVCache, KVState

MAX_CHUNK = 512  # most tokens one forward step appends (the backend splits longer inputs)


@dataclasses.dataclass
class LayerKV:
    """One layer's keys and values. ``window`` is 0 for full attention."""

    max_slots: int  # n_ctx, or the ring size of a sliding-window layer
    window: int
    keys: mx.array  # (1, n_kv_heads, slots, head_dim)
    values: mx.array  # (1, n_kv_heads, slots, v_head_dim)
    valid_from: int = 0  # positions below this were overwritten by later ones (rings only)

    @property
    def slots(self) -> int:
        return self.keys.shape[2]

    def grow(self, needed: int) -> None:
        """Make at least ``min(needed, max_slots)`` slots, growing in steps of GROWTH_STEP."""
        target = min(self.max_slots, -(-needed // GROWTH_STEP) * GROWTH_STEP)
        if target > self.slots:
            self.keys, self.values = _padded(self.keys, target), _padded(self.values, target)

    def store(self, k: mx.array, v: mx.array, start: int) -> None:
        """Write keys ``k`` (1, n_kv_heads, L, head_dim) and values for positions ``start .. start + L - 1``."""
        n = k.shape[2]
        first = start % self.max_slots
        if first + n <= self.max_slots:
            self.keys[:, :, first:first + n] = k
            self.values[:, :, first:first + n] = v
        else:  # the ring wraps inside this chunk
            head = self.max_slots - first
            self.keys[:, :, first:] = k[:, :, :head]
            self.values[:, :, first:] = v[:, :, :head]
            self.keys[:, :, :n - head] = k[:, :, head:]
            self.values[:, :, :n - head] = v[:, :, head:]
        self.valid_from = max(self.valid_from, start + n - self.max_slots)

    def view(self, end: int) -> tuple[mx.array, mx.array]:
        """Keys and values of the slots in use once positions ``< end`` are stored."""
        if end <= self.max_slots:
            return self.keys[:, :, :end], self.values[:, :, :end]
        return self.keys, self.values

    def positions(self, end: int) -> np.ndarray:
        """The position each slot of ``view(end)`` stands for, (slots,) int64.

        A slot overwritten before a rollback may hold another position's data; it then stands for a
        position below ``valid_from``, which no query at or after the rollback point attends to.
        """
        if end <= self.max_slots:
            return np.arange(end)
        slot = np.arange(self.max_slots)
        return slot + self.max_slots * ((end - 1 - slot) // self.max_slots)

    def mask(self, start: int, n: int) -> mx.array | str | None:
        """The attention mask of ``n`` queries at ``start ..`` over ``view(start + n)``."""
        end = start + n
        if self.window == 0 or end <= self.window:
            return "causal" if n > 1 else None
        k_pos = self.positions(end)[None, :]
        q_pos = np.arange(start, end)[:, None]
        return mx.array((k_pos <= q_pos) & (k_pos > q_pos - self.window))  # (n, slots) bool


def _padded(buffer: mx.array, slots: int) -> mx.array:
    """``buffer`` (1, heads, n, dim) followed by zero slots up to ``slots``."""
    b, heads, n, dim = buffer.shape
    return mx.concatenate([buffer, mx.zeros((b, heads, slots - n, dim), buffer.dtype)], axis=2)


def sliding_slots(config: ModelConfig, n_ctx: int) -> int:
    """Ring size of a sliding-window layer: the window behind the oldest query of a chunk, plus the chunk."""
    return min(n_ctx, config.sliding_window - 1 + MAX_CHUNK)


class MlxKVCache(KVCache):
    """Keys and values of one sequence as MLX arrays, with the token ids that produced them.

    ``replay(cache, tokens)`` is the backend's prefill without logits; a deep ``truncate`` uses it.
    """

    def __init__(self, config: ModelConfig, n_ctx: int, replay: Callable[[MlxKVCache, Sequence[int]], None],
                 dtype: mx.Dtype = mx.float32):
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        self.config, self.n_ctx, self._replay, self.dtype = config, n_ctx, replay, dtype
        self._n_past = 0
        self.tokens: list[int] | None = []  # ids of positions 0 .. n_past-1; None when imported without them
        self.layers = [self._new_layer(i) for i in range(config.n_layers)]

    def _new_layer(self, i: int) -> LayerKV:
        c = self.config
        sliding = c.is_sliding(i)
        return LayerKV(
            max_slots=sliding_slots(c, self.n_ctx) if sliding else self.n_ctx,
            window=c.sliding_window if sliding else 0,
            keys=mx.zeros((1, c.layer_n_kv_heads(i), 0, c.layer_head_dim(i)), self.dtype),
            values=mx.zeros((1, c.layer_n_kv_heads(i), 0, c.layer_v_head_dim(i)), self.dtype),
        )

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def nbytes(self) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)

    def arrays(self) -> list[mx.array]:
        """Every buffer, for ``mx.eval`` after a forward chunk."""
        return [a for layer in self.layers for a in (layer.keys, layer.values)]

    def reserve(self, n_new: int) -> None:
        needed = self._n_past + n_new
        if needed > self.n_ctx:
            raise ValueError(f"the context is full: {needed} positions needed, n_ctx is {self.n_ctx}")
        for layer in self.layers:
            layer.grow(needed)

    def advance(self, n: int) -> None:
        """Count ``n`` more positions as stored (the backend calls this after writing their keys and values)."""
        self._n_past += n

    def record(self, ids: Sequence[int]) -> None:
        """Remember the token ids of the latest positions, in order (for a replay after a deep rollback)."""
        if self.tokens is not None:
            self.tokens.extend(int(t) for t in ids)

    def truncate(self, n_past: int) -> None:
        if not 0 <= n_past <= self._n_past:
            raise ValueError(f"cannot truncate a cache of {self._n_past} positions to {n_past}")
        if all(max(0, n_past - layer.window + 1) >= layer.valid_from for layer in self.layers if layer.window):
            self._n_past = n_past
            if self.tokens is not None:
                del self.tokens[n_past:]
            return
        if self.tokens is None:
            raise ValueError(f"cannot roll back to {n_past} positions: the sliding-window layers no longer hold them "
                             "and this cache was imported without its tokens")
        kept = self.tokens[:n_past]
        self._n_past, self.tokens = 0, []
        for layer in self.layers:
            layer.valid_from = 0
        if kept:
            self._replay(self, kept)

    def export_state(self) -> KVState:
        """Float32 copies per layer, (n_kv_heads, n_past, head_dim).

        Positions a sliding-window layer no longer holds are exported as zeros: no later position attends
        to them, and ``import_state`` treats all-zero key rows as such gaps.
        """
        n = self._n_past
        keys, values = [], []
        for layer in self.layers:
            k = np.array(layer.keys[0], np.float32)  # (n_kv_heads, slots, head_dim)
            v = np.array(layer.values[0], np.float32)
            keys.append(_in_position_order(k, layer, n))
            values.append(_in_position_order(v, layer, n))
        return KVState(keys=keys, values=values, n_past=n)

    def import_state(self, state: KVState) -> None:
        c = self.config
        if len(state.keys) != c.n_layers or len(state.values) != c.n_layers:
            raise ValueError(f"the state has {len(state.keys)} layers, the model {c.n_layers}")
        for i, (k, v) in enumerate(zip(state.keys, state.values)):
            want_k = (c.layer_n_kv_heads(i), state.n_past, c.layer_head_dim(i))
            want_v = (c.layer_n_kv_heads(i), state.n_past, c.layer_v_head_dim(i))
            if k.shape != want_k or v.shape != want_v:
                raise ValueError(f"KV shapes {k.shape}/{v.shape} do not fit this model")
        self._n_past, self.tokens = 0, None
        self.reserve(state.n_past)
        for layer, k, v in zip(self.layers, state.keys, state.values):
            first = max(0, state.n_past - layer.max_slots)  # a ring keeps only its last max_slots positions
            for start in range(first, state.n_past, MAX_CHUNK):
                stop = min(state.n_past, start + MAX_CHUNK)
                layer.store(mx.array(k[None, :, start:stop], self.dtype),
                            mx.array(v[None, :, start:stop], self.dtype), start)
            if layer.window:
                layer.valid_from = max(layer.valid_from, _after_last_gap(k))
            mx.eval(layer.keys, layer.values)
        self._n_past = state.n_past


def _in_position_order(buffer: np.ndarray, layer: LayerKV, n: int) -> np.ndarray:
    """Slots (n_kv_heads, slots, dim) -> positions (n_kv_heads, n, dim) float32, zeros where not held."""
    out = np.zeros((buffer.shape[0], n, buffer.shape[2]), np.float32)
    positions = layer.positions(n)
    held = positions >= layer.valid_from
    out[:, positions[held]] = buffer[:, :len(positions)][:, held]
    return out


def _after_last_gap(keys: np.ndarray) -> int:
    """One past the last position whose keys (n_kv_heads, n, head_dim) are all zero (a dropped position), or 0."""
    gaps = np.flatnonzero(~keys.any(axis=(0, 2)))
    return int(gaps[-1]) + 1 if gaps.size else 0
