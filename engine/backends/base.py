"""The contract every compute backend implements: a decoder forward pass over a per-sequence KV cache."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Sequence
from typing import ClassVar

import numpy as np

from ..config import ModelConfig


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Bytes held by a loaded model, as the backend sees them."""

    weights_bytes: int
    kv_cache_bytes: int  # allocated across the caches this backend created and that are still alive
    scratch_bytes: int = 0
    active_weights_bytes: int | None = None  # weight bytes one decode step reads (a sparse model's chosen experts
                                             # and the shared tensors); None: all of weights_bytes
    device_active_bytes: int | None = None  # MLX: mx.get_active_memory()
    device_peak_bytes: int | None = None
    device_cache_bytes: int | None = None


@dataclasses.dataclass
class KVState:
    """A backend-neutral copy of a KV cache, for snapshots and cross-backend restore."""

    keys: list[np.ndarray]  # per layer: (n_kv_heads, n_past, head_dim)
    values: list[np.ndarray]  # per layer: (n_kv_heads, n_past, v_head_dim); 0 positions in a recurrent layer
    n_past: int
    # hybrid models: per recurrent layer in order, its conv state (d_conv - 1, conv_dim) then its
    # delta-rule state (n_v_heads, head_k_dim, head_v_dim), float32 (engine.deltanet.RecurrentState)
    recurrent: list[np.ndarray] | None = None


class KVCache(abc.ABC):
    """Keys and values of one sequence for every layer; positions ``0 .. n_past-1`` are filled."""

    n_ctx: int  # the most positions this cache will ever hold
    room_is_free = False  # True: room reserved ahead takes no memory until written (zero pages)

    @property
    @abc.abstractmethod
    def n_past(self) -> int:
        """How many positions are filled."""

    @abc.abstractmethod
    def reserve(self, n_new: int) -> None:
        """Make room for ``n_new`` more positions (growing in steps); ValueError past ``n_ctx``."""

    def reserve_whole_room(self) -> None:
        """Room for all ``n_ctx`` positions now, where that costs no memory (``room_is_free``); otherwise nothing.

        Grown step by step, a cache copies what it holds at each step, and in a batch inside decode steps.
        """
        if self.room_is_free:
            self.reserve(self.n_ctx - self.n_past)

    @abc.abstractmethod
    def truncate(self, n_past: int) -> None:
        """Forget every position from ``n_past`` on (rollback for speculation, edits and regeneration)."""

    @abc.abstractmethod
    def export_state(self) -> KVState:
        """A float32 NumPy copy of the filled part of the cache."""

    @abc.abstractmethod
    def import_state(self, state: KVState) -> None:
        """Replace the cache's content with ``state`` (shapes are checked; ValueError when they do not fit)."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes allocated now (the cache grows in steps up to ``n_ctx``)."""


class Backend(abc.ABC):
    """A loaded model on one kind of compute. ``forward`` appends ``tokens`` to ``cache`` and returns logits."""

    name: ClassVar[str]
    kv_sliding_rings: ClassVar[bool] = False  # a sliding-window layer's cache keeps only its window (else n_ctx)
    # Declared capabilities the scheduler's decode step uses when a sequence decodes alone (never probed):
    pipelined_greedy: ClassVar[bool] = False  # decode_greedy_pipelined: argmax on the device, steps queued ahead
    verifies_drafts: ClassVar[bool] = True  # forward(all_logits=True) + KVCache.truncate: speculative verify
    config: ModelConfig
    compute_note: str | None = None  # how this model computes where the backend chooses per model (MLX's dtype)

    @abc.abstractmethod
    def new_cache(self, n_ctx: int) -> KVCache:
        """An empty KV cache for a sequence of at most ``n_ctx`` positions."""

    @abc.abstractmethod
    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Run the decoder on ``tokens`` at positions ``cache.n_past ...`` and store their keys and values.

        Args:
            tokens: token ids to append; prefill passes many, decode passes one.
            cache: the sequence's cache; ``cache.n_past`` grows by ``len(tokens)``.
            all_logits: return logits for every token instead of only the last one.

        Returns:
            float32 logits, shape (len(tokens), n_vocab) when ``all_logits`` else (n_vocab,).
        """

    def forward_batch(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> np.ndarray:
        """One decode step for several sequences: token ``i`` is appended to ``caches[i]``.

        Returns float32 logits of shape (len(tokens), n_vocab). Backends override this with one batched pass.
        """
        return np.stack([self.forward([t], c) for t, c in zip(tokens, caches)])

    def decode_greedy_pipelined(self, token: int, cache: KVCache) -> Iterator[tuple[int, float]]:
        """Feed ``token``, then yield ``(argmax token, logprob)`` per step until the cache is full, each step
        queued before the previous token is read back; each yielded token is already being fed into ``cache``
        (``cache.n_past`` counts it). Only where ``pipelined_greedy`` is declared."""
        raise NotImplementedError(f"the {self.name} backend declares no pipelined greedy decode")

    @abc.abstractmethod
    def memory(self) -> MemoryStats:
        """What the model holds in memory now."""

    def close(self) -> None:
        """Release weights and caches; the backend is unusable afterwards."""
