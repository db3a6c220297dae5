"""The per-sequence cache of a hybrid model: KV for the attention layers, recurrent state for the others.

A recurrent (Gated DeltaNet) layer folds every token into a fixed-size state, so unlike keys and values its
state cannot be cut back to an earlier position. ``RecurrentStates`` keeps checkpoints instead and replays
from the nearest one:

- the state before the latest forward call, and, when that call fed 2 .. ``ROLLBACK_TOKENS`` tokens (a
  speculative verify pass), the state after each of them: rejecting drafted tokens or dropping the last
  token is exact and costs a copy;
- the state at the end of each of the last ``MAX_ANCHORS`` calls longer than that (prompt prefills), so a
  regenerated reply or an edited last message re-uses the prompt.

A roll-back to any other position restores the nearest earlier checkpoint (or the empty state) and replays
the token ids between (the cache keeps them) through the model: one prefill of those tokens. After a session
restore the ids before the restored position are not known, so a roll-back below it raises ValueError and
the caller starts a fresh cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .backends.base import KVState
from .config import ModelConfig
from .deltanet import RecurrentState, recurrent_state_shapes
from .kv_cache import NumpyKVCache

ROLLBACK_TOKENS = 16  # a call of at most this many tokens keeps the state after each (a verify pass)
MAX_ANCHORS = 4  # ends of longer calls (prompts) kept as checkpoints


class RecurrentStates:
    """The recurrent layers' live states of one sequence, its token ids and the roll-back checkpoints.

    Args:
        zeros: makes the empty states, ``{layer: state}``; a state has ``copy()``.
    """

    def __init__(self, zeros: Callable[[], dict[int, Any]]):
        self._zeros = zeros
        self.live: dict[int, Any] = zeros()  # layer -> state after every fed token
        self.tokens: list[int | None] = []  # ids fed so far; None where unknown (before a session restore)
        self._recent: dict[int, dict[int, Any]] = {}  # position -> states, from the latest call
        self._anchors: dict[int, dict[int, Any]] = {}  # position -> states, ends of long calls

    @property
    def n_fed(self) -> int:
        return len(self.tokens)

    def begin_call(self, n_new: int) -> bool:
        """Before feeding ``n_new`` tokens: checkpoint the current state; whether to snapshot each token."""
        self._recent = {self.n_fed: {layer: s.copy() for layer, s in self.live.items()}}
        return 1 < n_new <= ROLLBACK_TOKENS

    def add_snapshot(self, position: int, layer: int, state: Any) -> None:
        """The state of ``layer`` after ``position`` tokens (a position inside the current call)."""
        self._recent.setdefault(position, {})[layer] = state

    def end_call(self, tokens: Sequence[int]) -> None:
        """After feeding ``tokens``: remember them, and anchor the end of a long call."""
        self.tokens.extend(int(t) for t in tokens)
        if len(tokens) > ROLLBACK_TOKENS:
            self._anchors[self.n_fed] = {layer: s.copy() for layer, s in self.live.items()}
            for position in sorted(self._anchors)[:-MAX_ANCHORS]:
                del self._anchors[position]

    def rewind(self, n_past: int) -> list[int]:
        """Restore the nearest checkpoint at or before ``n_past``; returns the token ids to replay from it.

        Raises ValueError when those ids are unknown (before a restored session's position).
        """
        points = {0: None, **self._anchors, **self._recent}
        start = max(p for p in points if p <= n_past)
        replay = self.tokens[start:n_past]
        if any(t is None for t in replay):
            raise ValueError(f"a recurrent state cannot go back to position {n_past}: the token ids before "
                             f"position {self.n_fed} were not restored with it; start a new cache")
        saved = points[start]
        self.live = self._zeros() if saved is None else {layer: s.copy() for layer, s in saved.items()}
        self.tokens = self.tokens[:start]
        self._recent = {p: s for p, s in self._recent.items() if p <= start}
        self._anchors = {p: s for p, s in self._anchors.items() if p <= start}
        return [int(t) for t in replay]

    def reset_to(self, live: dict[int, Any], n_past: int) -> None:
        """Replace the state with ``live`` at position ``n_past`` (a session restore: earlier ids unknown)."""
        self.live, self.tokens = live, [None] * n_past
        self._recent, self._anchors = {}, {}

    def nbytes(self) -> int:
        sizes = [s.nbytes for s in self.live.values()]
        for points in (self._recent, self._anchors):
            sizes += [s.nbytes for states in points.values() for s in states.values()]
        return int(sum(sizes))


class HybridKVCache(NumpyKVCache):
    """NumPy KV arrays for the attention layers (recurrent layers hold none) plus ``recurrent`` states.

    Args:
        config: a hybrid model's config.
        n_ctx: the most positions the sequence will hold.
        replay: ``replay(cache, tokens)`` feeds ``tokens`` through the model without logits (the backend's
            prefill), used by a roll-back that has no checkpoint at its position.
        dtype: element type of the keys and values.
    """

    def __init__(self, config: ModelConfig, n_ctx: int, replay: Callable[[HybridKVCache, list[int]], None],
                 dtype=np.float32):
        self._replay = replay
        self.recurrent = RecurrentStates(lambda: {il: RecurrentState.zeros(config) for il in config.recurrent_layers})
        super().__init__(config, n_ctx, dtype)

    def _grow_to(self, capacity: int) -> None:
        cfg, filled = self.config, self._n_past
        keys, values = [], []
        for il in range(cfg.n_layers):
            slots = 0 if cfg.is_recurrent(il) else capacity
            keys.append(np.zeros((cfg.n_kv_heads, slots, cfg.head_dim), self.dtype))
            values.append(np.zeros((cfg.n_kv_heads, slots, cfg.v_head_dim), self.dtype))
        if filled:
            for il in range(cfg.n_layers):
                if not cfg.is_recurrent(il):
                    keys[il][:, :filled] = self.keys[il][:, :filled]
                    values[il][:, :filled] = self.values[il][:, :filled]
        self.keys, self.values, self.capacity = keys, values, capacity

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.recurrent.nbytes()

    def truncate(self, n_past: int) -> None:
        """Go back to ``n_past`` positions: from a checkpoint, replaying the tokens after it (module docstring)."""
        if not 0 <= n_past <= self._n_past:
            raise ValueError(f"cannot truncate a cache of {self._n_past} positions to {n_past}")
        if n_past == self._n_past:
            return
        replay = self.recurrent.rewind(n_past)
        self._n_past = n_past - len(replay)
        if replay:
            self._replay(self, replay)

    def export_state(self) -> KVState:
        state = super().export_state()
        state.recurrent = [a.copy() for il in self.config.recurrent_layers
                           for a in (self.recurrent.live[il].conv, self.recurrent.live[il].ssm)]
        return state

    def import_state(self, state: KVState) -> None:
        cfg = self.config
        live = recurrent_from_arrays(cfg, state.recurrent)
        if len(state.keys) != cfg.n_layers or len(state.values) != cfg.n_layers:
            raise ValueError(f"the state has {len(state.keys)} layers, the model {cfg.n_layers}")
        self._n_past = 0
        self.reserve(state.n_past)
        for il in range(cfg.n_layers):
            k, v = state.keys[il], state.values[il]
            n = 0 if cfg.is_recurrent(il) else state.n_past
            if k.shape != (cfg.n_kv_heads, n, cfg.head_dim) or v.shape != (cfg.n_kv_heads, n, cfg.v_head_dim):
                raise ValueError(f"KV shapes {k.shape}/{v.shape} of layer {il} do not fit this model")
            self.keys[il][:, :n] = k
            self.values[il][:, :n] = v
        self.recurrent.reset_to(live, state.n_past)
        self._n_past = state.n_past


def recurrent_from_arrays(config: ModelConfig, arrays: list[np.ndarray] | None) -> dict[int, RecurrentState]:
    """``KVState.recurrent`` (conv, ssm per recurrent layer, in layer order) as live states; ValueError if
    they do not fit the model."""
    layers = config.recurrent_layers
    conv_shape, ssm_shape = recurrent_state_shapes(config)
    if arrays is None or len(arrays) != 2 * len(layers):
        raise ValueError(f"the state holds {0 if arrays is None else len(arrays) // 2} recurrent layers' states, "
                         f"the model has {len(layers)} recurrent layers")
    live = {}
    for j, il in enumerate(layers):
        conv, ssm = arrays[2 * j], arrays[2 * j + 1]
        if conv.shape != conv_shape or ssm.shape != ssm_shape:
            raise ValueError(f"recurrent state shapes {conv.shape}/{ssm.shape} of layer {il} do not fit this model")
        live[il] = RecurrentState(np.array(conv, np.float32), np.array(ssm, np.float32))
    return live
