"""KV caches grown in fixed steps up to n_ctx, never per token: the shared bookkeeping, and the NumPy cache."""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np

from .backends.base import KVCache, KVState
from .config import ModelConfig

GROWTH_STEP = 256  # positions added per growth; a 4k chat grows 16 times, not 4,000


class SteppedKVCache(KVCache):
    """What every array-backed cache shares: ``n_past``, growth in ``GROWTH_STEP`` steps up to ``n_ctx``,
    rollback, and the float32 export and import of snapshots.

    A subclass holds the arrays: ``_grow_to`` reallocates them for ``capacity`` positions keeping the filled
    ones (none on the first call, from ``__init__``), and ``layers`` gives each layer's keys and values as
    ``(n_kv_heads, capacity, dim)`` views. Their arrays come from ``np.zeros``, whose large allocations are
    pages the OS maps only when written, so reserving room ahead costs no memory (``room_is_free``).
    """

    room_is_free = True

    def __init__(self, config: ModelConfig, n_ctx: int, dtype):
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        self.config, self.n_ctx, self.dtype = config, n_ctx, np.dtype(dtype)
        self._n_past = 0
        self.capacity = 0
        self._grow_to(min(GROWTH_STEP, n_ctx))

    @abc.abstractmethod
    def _grow_to(self, capacity: int) -> None:
        """Reallocate for ``capacity`` positions, keeping the first ``n_past``; set ``self.capacity``."""

    @abc.abstractmethod
    def layers(self) -> tuple[Sequence[np.ndarray], Sequence[np.ndarray]]:
        """Per layer, keys ``(n_kv_heads, capacity, head_dim)`` and values ``(n_kv_heads, capacity, v_head_dim)``."""

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def nbytes(self) -> int:
        keys, values = self.layers()
        return sum(a.nbytes for a in keys) + sum(a.nbytes for a in values)

    def reserve(self, n_new: int) -> None:
        """Make room for ``n_new`` more positions; raises ValueError past ``n_ctx``."""
        needed = self._n_past + n_new
        if needed > self.n_ctx:
            raise ValueError(f"the context is full: {needed} positions needed, n_ctx is {self.n_ctx}")
        if needed > self.capacity:
            steps = -(-needed // GROWTH_STEP)
            self._grow_to(min(self.n_ctx, steps * GROWTH_STEP))

    def advance(self, n: int) -> None:
        self._n_past += n

    def truncate(self, n_past: int) -> None:
        if not 0 <= n_past <= self._n_past:
            raise ValueError(f"cannot truncate a cache of {self._n_past} positions to {n_past}")
        self._n_past = n_past

    def export_state(self) -> KVState:
        n, (keys, values) = self._n_past, self.layers()
        return KVState(keys=[self._decode(k[:, :n], False) for k in keys],
                       values=[self._decode(v[:, :n], True) for v in values], n_past=n)

    def _decode(self, stored: np.ndarray, is_values: bool) -> np.ndarray:
        """Stored keys (or values) ``(n_kv_heads, n, ...)`` as float32 ``(n_kv_heads, n, dim)``, a snapshot's form."""
        return stored.astype(np.float32)

    def _encode(self, data: np.ndarray, is_values: bool) -> np.ndarray:
        """float32 keys (or values) ``(n_kv_heads, n, dim)`` in the stored form (the inverse of ``_decode``)."""
        return data

    def import_state(self, state: KVState) -> None:
        cfg = self.config
        if len(state.keys) != cfg.n_layers or len(state.values) != cfg.n_layers:
            raise ValueError(f"the state has {len(state.keys)} layers, the model {cfg.n_layers}")
        for layer, (k, v) in enumerate(zip(state.keys, state.values)):
            heads = cfg.layer_n_kv_heads(layer)
            if k.shape != (heads, state.n_past, cfg.layer_head_dim(layer)) \
                    or v.shape != (heads, state.n_past, cfg.layer_v_head_dim(layer)):
                raise ValueError(f"KV shapes {k.shape}/{v.shape} do not fit this model")
        self._n_past = 0
        self.reserve(state.n_past)
        keys, values = self.layers()
        for layer in range(cfg.n_layers):
            keys[layer][:, :state.n_past] = self._encode(state.keys[layer], False)
            values[layer][:, :state.n_past] = self._encode(state.values[layer], True)
        self._n_past = state.n_past


class NumpyKVCache(SteppedKVCache):
    """Keys and values as ``(n_kv_heads, capacity, head_dim)`` arrays per layer."""

    keys: list[np.ndarray]  # per layer: (n_kv_heads, capacity, head_dim)
    values: list[np.ndarray]  # per layer: (n_kv_heads, capacity, v_head_dim)

    def __init__(self, config: ModelConfig, n_ctx: int, dtype=np.float32):
        super().__init__(config, n_ctx, dtype)

    def layers(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return self.keys, self.values

    def _grow_to(self, capacity: int) -> None:
        cfg, filled = self.config, self._n_past
        keys = [np.zeros((cfg.layer_n_kv_heads(il), capacity, cfg.layer_head_dim(il)), self.dtype)
                for il in range(cfg.n_layers)]
        values = [np.zeros((cfg.layer_n_kv_heads(il), capacity, cfg.layer_v_head_dim(il)), self.dtype)
                  for il in range(cfg.n_layers)]
        if filled:
            for new, old in zip(keys + values, self.keys + self.values):
                new[:, :filled] = old[:, :filled]
        self.keys, self.values, self.capacity = keys, values, capacity

    def store(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write keys ``(n_kv_heads, n, head_dim)`` and values at positions ``n_past ...`` of ``layer``."""
        n = k.shape[1]
        self.keys[layer][:, self._n_past:self._n_past + n] = k
        self.values[layer][:, self._n_past:self._n_past + n] = v
