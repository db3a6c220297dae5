"""A NumPy KV cache: preallocated per layer, grown in fixed steps up to n_ctx, never per token."""

from __future__ import annotations

import numpy as np

from .backends.base import KVCache, KVState
from .config import ModelConfig

GROWTH_STEP = 256  # positions added per growth; a 4k chat grows 16 times, not 4,000


class NumpyKVCache(KVCache):
    """Keys and values as ``(n_kv_heads, capacity, head_dim)`` arrays per layer."""

    def __init__(self, config: ModelConfig, n_ctx: int, dtype=np.float32):
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        self.config, self.n_ctx, self.dtype = config, n_ctx, np.dtype(dtype)
        self._n_past = 0
        self.capacity = 0
        self.keys: list[np.ndarray] = []  # per layer: (n_kv_heads, capacity, head_dim)
        self.values: list[np.ndarray] = []  # per layer: (n_kv_heads, capacity, v_head_dim)
        self._grow_to(min(GROWTH_STEP, n_ctx))

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    def _grow_to(self, capacity: int) -> None:
        cfg = self.config
        old_keys, old_values, filled = self.keys, self.values, self._n_past
        self.keys = [np.zeros((cfg.n_kv_heads, capacity, cfg.head_dim), self.dtype) for _ in range(cfg.n_layers)]
        self.values = [np.zeros((cfg.n_kv_heads, capacity, cfg.v_head_dim), self.dtype) for _ in range(cfg.n_layers)]
        for new, old in zip(self.keys + self.values, old_keys + old_values):
            new[:, :filled] = old[:, :filled]
        self.capacity = capacity

    def reserve(self, n_new: int) -> None:
        """Make room for ``n_new`` more positions; raises ValueError past ``n_ctx``."""
        needed = self._n_past + n_new
        if needed > self.n_ctx:
            raise ValueError(f"the context is full: {needed} positions needed, n_ctx is {self.n_ctx}")
        if needed > self.capacity:
            steps = -(-needed // GROWTH_STEP)
            self._grow_to(min(self.n_ctx, steps * GROWTH_STEP))

    def store(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write keys ``(n_kv_heads, n, head_dim)`` and values at positions ``n_past ...`` of ``layer``."""
        n = k.shape[1]
        self.keys[layer][:, self._n_past:self._n_past + n] = k
        self.values[layer][:, self._n_past:self._n_past + n] = v

    def advance(self, n: int) -> None:
        self._n_past += n

    def truncate(self, n_past: int) -> None:
        if not 0 <= n_past <= self._n_past:
            raise ValueError(f"cannot truncate a cache of {self._n_past} positions to {n_past}")
        self._n_past = n_past

    def export_state(self) -> KVState:
        n = self._n_past
        return KVState(
            keys=[k[:, :n].astype(np.float32) for k in self.keys],
            values=[v[:, :n].astype(np.float32) for v in self.values],
            n_past=n,
        )

    def import_state(self, state: KVState) -> None:
        cfg = self.config
        if len(state.keys) != cfg.n_layers or len(state.values) != cfg.n_layers:
            raise ValueError(f"the state has {len(state.keys)} layers, the model {cfg.n_layers}")
        for k, v in zip(state.keys, state.values):
            if k.shape != (cfg.n_kv_heads, state.n_past, cfg.head_dim) or v.shape != (cfg.n_kv_heads, state.n_past, cfg.v_head_dim):
                raise ValueError(f"KV shapes {k.shape}/{v.shape} do not fit this model")
        self._n_past = 0
        self.reserve(state.n_past)
        for layer in range(cfg.n_layers):
            self.store(layer, state.keys[layer], state.values[layer])
        self._n_past = state.n_past
