"""The NumPy reference backend: one float32 decoder for every architecture, read from ModelConfig.

Weights are dequantized to float32 once at load with the gguf package (simple and exact, at the cost of
4 bytes per parameter). The C backend subclasses this decoder and replaces the matrix products and
attention with kernels that work on the packed GGUF blocks.
"""

from __future__ import annotations

import ctypes
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from ..kv_cache import NumpyKVCache
from ..moe import expert_groups, route
from ..model_tensors import MATRIX_FIELDS, layer_tensor_names, output_tensor_name
from ..rope import attn_temperature, rope_tables
from .base import Backend, KVCache, MemoryStats

PREFILL_CHUNK = 512  # tokens per forward chunk: bounds the (heads, chunk, n_past) score matrix
ROW_EXACT_ROWS = 16  # up to this many rows, attention runs row by row: a speculative verify pass then
                     # computes each position exactly as a decode step would (same shapes, same sums)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Normalise the last axis to unit root-mean-square, then scale by ``weight``."""
    variance = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return x * (1.0 / np.sqrt(variance + eps)) * weight


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """``cap * tanh(x / cap)`` (gemma2's attention-score and logit soft-capping)."""
    return np.float32(cap) * np.tanh(x * np.float32(1.0 / cap))


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, neox: bool,
               mscale: float = 1.0) -> np.ndarray:
    """Rotate the first ``2 * len(inv_freq)`` dims of ``x`` (n, heads, head_dim) by position.

    ``inv_freq`` is one row of ``rope.rope_tables``; cos and sin are multiplied by ``mscale`` (ggml's mscale).
    """
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]  # (n, rope_dim/2)
    cos = (np.cos(angles) * mscale).astype(np.float32)[:, None, :]
    sin = (np.sin(angles) * mscale).astype(np.float32)[:, None, :]
    rope_dim = 2 * inv_freq.shape[0]
    out = x.copy()
    if neox:
        half = rope_dim // 2
        x1, x2 = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rope_dim] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = x1 * cos - x2 * sin
        out[..., 1:rope_dim:2] = x2 * cos + x1 * sin
    return out


DEQUANTIZE_CHUNK_BYTES = 16 << 20  # float32 output per dequantization step: bounds the temporaries of a big matrix


def dequantize_rows(raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """A tensor as float32, dequantized a block of rows at a time into its final array, so that the temporaries
    of the whole tensor (several times its float32 size for some types) never exist at once."""
    if raw.ndim < 2 or raw.shape[0] < 2:
        return dequantize(raw, qtype).astype(np.float32, copy=False)
    first = dequantize(raw[:1], qtype)
    out = np.empty((raw.shape[0], *first.shape[1:]), np.float32)
    step = max(1, DEQUANTIZE_CHUNK_BYTES // max(1, out[0].nbytes))
    for start in range(0, raw.shape[0], step):
        out[start:start + step] = dequantize(raw[start:start + step], qtype)
    return out


def _find_malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _find_malloc_trim()


def release_freed_memory() -> None:
    """Give freed heap memory back to the OS where the C library keeps it (glibc's ``malloc_trim``; elsewhere a
    no-op). Dequantizing a model frees large temporaries tensor by tensor; glibc keeps the holes they leave, which
    held Gemma 3's NumPy load 640 MB above what it uses."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def attention_mask(q_pos: np.ndarray, k_len: int, window: int) -> np.ndarray:
    """Additive mask (n, k_len): causal, and limited to the last ``window`` positions when window > 0."""
    k_pos = np.arange(k_len)[None, :]
    allowed = k_pos <= q_pos[:, None]
    if window > 0:
        allowed &= (q_pos[:, None] - k_pos) < window
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))


@dataclasses.dataclass
class Layer:
    """One decoder block's weights; matrices are whatever the backend's ``matmul`` takes."""

    attn_norm: np.ndarray | None  # (n_embd,); None without pre-norms (olmo2)
    wq: Any  # (n_heads * head_dim, n_embd)
    wk: Any  # (n_kv_heads * head_dim, n_embd)
    wv: Any  # (n_kv_heads * v_head_dim, n_embd)
    wo: Any  # (n_embd, n_heads * v_head_dim)
    ffn_norm: np.ndarray | None
    w_gate: Any  # (n_ff, n_embd); None in a mixture-of-experts model
    w_up: Any  # (n_ff, n_embd)
    w_down: Any  # (n_embd, n_ff)
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None  # (head_dim,), or (n_q_embd,) with qk_norm_whole
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    # mixture of experts (ModelConfig.n_expert > 0) in place of w_gate / w_up / w_down:
    w_router: Any = None  # (n_expert, n_embd)
    w_gate_exps: Any = None  # (n_expert * n_ff_exp, n_embd): expert e is rows e * n_ff_exp .. (e + 1) * n_ff_exp
    w_up_exps: Any = None  # (n_expert * n_ff_exp, n_embd)
    w_down_exps: Any = None  # (n_expert * n_embd, n_ff_exp)


class NumpyBackend(Backend):
    """Reference decoder in float32 NumPy. Subclasses override ``load_matrix``, ``matrix_rows`` and ``matmul``.

    Args:
        gguf: the open model file.
        config: the model's hyper-parameters.
        n_ctx: the context size the model is loaded for; only LongRoPE models depend on it (see
            ``rope.rope_tables``). None: within the model's original context.
    """

    name = "numpy"

    def __init__(self, gguf: GGUFFile, config: ModelConfig, n_ctx: int | None = None):
        self.gguf, self.config = gguf, config
        self.layers = []
        for i in range(config.n_layers):
            self.layers.append(self._load_layer(i))
            release_freed_memory()  # the layer's dequantization temporaries: not left as heap holes in RSS
        self.output_norm = self.load_vector("output_norm.weight")
        self.token_embd = gguf.raw("token_embd.weight")  # packed rows, dequantized on lookup
        self.token_embd_type = gguf.tensor("token_embd.weight").qtype
        self.output = self.load_matrix(output_tensor_name(gguf, config))
        release_freed_memory()
        self.rope_inv_freq, self.rope_layer_set = rope_tables(gguf, config, n_ctx)  # (n_sets, rope_dim // 2), per layer
        # by base, for decoders that still key their tables by the layer's base (one set per base)
        self.inv_freq = {config.layer_rope_base(i): self.rope_inv_freq[s]
                         for i, s in enumerate(self.rope_layer_set) if s >= 0}
        self.activation = ACTIVATIONS[config.activation]

    # -- weights: overridden by backends that keep the packed blocks ----------------------------------
    def load_matrix(self, name: str) -> Any:
        """A weight matrix in the form ``matmul`` takes; here dequantized float32 (rows, cols)."""
        return dequantize_rows(self.gguf.raw(name), self.gguf.tensor(name).qtype)

    def matrix_rows(self, matrix: Any, rows: slice) -> Any:
        """Rows of a matrix from ``load_matrix`` (a fused tensor's part), in the same form; here a view."""
        return matrix[rows]

    def matmul(self, x: np.ndarray, w: Any) -> np.ndarray:
        """``x @ w.T`` for x (n, cols) float32 -> (n, rows)."""
        return x @ w.T

    def load_vector(self, name: str) -> np.ndarray:
        info = self.gguf.tensor(name)
        raw = self.gguf.raw(name)
        if info.qtype == GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(-1)
        return dequantize(raw, info.qtype).astype(np.float32).reshape(-1)

    def _load_layer(self, i: int) -> Layer:
        fields = {}
        loaded: dict[str, Any] = {}  # a fused tensor is loaded once and cut into its parts
        for field, ref in layer_tensor_names(self.gguf, self.config, i).items():
            if ref is None:
                fields[field] = None
                continue
            is_matrix = field in MATRIX_FIELDS
            if ref.name not in loaded:
                loaded[ref.name] = self.load_matrix(ref.name) if is_matrix else self.load_vector(ref.name)
            whole = loaded[ref.name]
            if ref.is_whole:
                fields[field] = whole
            else:
                n_rows = self.gguf.tensor(ref.name).shape[-1]
                fields[field] = self.matrix_rows(whole, ref.rows(n_rows)) if is_matrix else whole[ref.rows(n_rows)]
        return Layer(**fields)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Embedding rows for ``tokens``, scaled as the architecture asks; (n, n_embd) float32."""
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.config.n_vocab):
            raise ValueError(f"token id out of range 0..{self.config.n_vocab - 1}")
        rows = dequantize(self.token_embd[tokens], self.token_embd_type).astype(np.float32)
        if self.config.embed_scale != 1.0:
            rows *= np.float32(self.config.embed_scale)
        return rows

    # -- the decoder --------------------------------------------------------------------------------
    def new_cache(self, n_ctx: int) -> KVCache:
        return NumpyKVCache(self.config, n_ctx)

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("forward needs at least one token")
        cache.reserve(tokens.size)
        outputs = []
        for start in range(0, tokens.size, PREFILL_CHUNK):
            chunk = tokens[start:start + PREFILL_CHUNK]
            hidden = self._forward_chunk(chunk, cache)
            if all_logits:
                outputs.append(self.logits(hidden))
        if all_logits:
            return np.concatenate(outputs)
        return self.logits(hidden[-1:])[0]

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """Final norm and output projection of hidden states (n, n_embd) -> (n, n_vocab), scaled and
        soft-capped as the architecture asks."""
        c = self.config
        x = rms_norm(hidden, self.output_norm, c.rms_eps)
        logits = self.matmul(np.ascontiguousarray(x, dtype=np.float32), self.output)
        if c.logit_scale != 1.0:
            logits *= np.float32(c.logit_scale)
        if c.final_softcap:
            logits = softcap(logits, c.final_softcap)
        return logits

    def _forward_chunk(self, tokens: np.ndarray, cache: NumpyKVCache) -> np.ndarray:
        positions = np.arange(cache.n_past, cache.n_past + tokens.size)
        x = self.embed(tokens)  # (n, n_embd)
        for i, layer in enumerate(self.layers):
            x = x + self._attention_block(i, layer, x, positions, cache)
            x = x + self._ffn_block(layer, x)
        cache.advance(tokens.size)
        return x

    def _attention_block(self, i: int, layer: Layer, x: np.ndarray, positions: np.ndarray, cache) -> np.ndarray:
        c = self.config
        q, k, v = self._project_qkv(i, layer, x, positions)
        cache.store(i, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
        window = c.sliding_window if c.is_sliding(i) else 0
        out = self._attend(q, cache.keys[i], cache.values[i], positions, window)
        return self._attention_output(layer, out)

    def _attention_output(self, layer: Layer, out: np.ndarray) -> np.ndarray:
        """Output projection of attention rows (n, n_heads * v_head_dim), post-norm and residual scale."""
        c = self.config
        out = self.matmul(np.ascontiguousarray(out, dtype=np.float32), layer.wo)
        if layer.post_attn_norm is not None:
            out = rms_norm(out, layer.post_attn_norm, c.rms_eps)
        if c.residual_scale != 1.0:
            out = out * np.float32(c.residual_scale)
        return out

    def _attend(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, positions: np.ndarray, window: int) -> np.ndarray:
        """Grouped-query attention of q (n, n_heads, head_dim) over the cache; returns (n, n_heads * v_head_dim)."""
        c = self.config
        n = q.shape[0]
        if 1 < n <= ROW_EXACT_ROWS:  # BLAS sums differ with the shapes; quantized activations amplify that
            return np.concatenate([self._attend(q[r:r + 1], keys, values, positions[r:r + 1], window) for r in range(n)])
        k_len = int(positions[-1]) + 1
        group = c.n_heads // c.n_kv_heads
        qg = (q * np.float32(c.attn_scale)).transpose(1, 0, 2).reshape(c.n_kv_heads, group * n, c.head_dim)
        scores = qg @ keys[:, :k_len].transpose(0, 2, 1)  # (n_kv_heads, group * n, k_len)
        if c.attn_softcap:
            scores = softcap(scores, c.attn_softcap)
        scores = scores.reshape(c.n_kv_heads, group, n, k_len) + attention_mask(positions, k_len, window)
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out = scores.reshape(c.n_kv_heads, group * n, k_len) @ values[:, :k_len]  # (n_kv_heads, group * n, v_head_dim)
        return out.reshape(c.n_heads, n, c.v_head_dim).transpose(1, 0, 2).reshape(n, c.n_heads * c.v_head_dim)

    def _ffn_block(self, layer: Layer, x: np.ndarray) -> np.ndarray:
        c = self.config
        h = x if layer.ffn_norm is None else rms_norm(x, layer.ffn_norm, c.rms_eps)
        h = np.ascontiguousarray(h, dtype=np.float32)
        if c.is_moe:
            out = self._moe(layer, h)
        else:
            act = self.activation(self.matmul(h, layer.w_gate)) * self.matmul(h, layer.w_up)
            out = self.matmul(np.ascontiguousarray(act, dtype=np.float32), layer.w_down)
        if layer.post_ffn_norm is not None:
            out = rms_norm(out, layer.post_ffn_norm, c.rms_eps)
        if c.residual_scale != 1.0:
            out = out * np.float32(c.residual_scale)
        return out

    def _moe(self, layer: Layer, h: np.ndarray) -> np.ndarray:
        """The mixture-of-experts FFN of normed rows h (n, n_embd): only the chosen experts run, each once
        for all the rows that chose it; their outputs are summed with the router's weights."""
        c = self.config
        experts, weights = route(self.matmul(h, layer.w_router), c)  # (n, n_expert_used) each
        out = np.zeros((h.shape[0], c.n_embd), dtype=np.float32)  # (n, n_embd)
        for expert, rows, slots in expert_groups(experts):
            ff = slice(expert * c.n_ff_exp, (expert + 1) * c.n_ff_exp)
            x = np.ascontiguousarray(h[rows])
            act = self.activation(self.matmul(x, self.matrix_rows(layer.w_gate_exps, ff))) \
                * self.matmul(x, self.matrix_rows(layer.w_up_exps, ff))
            down = slice(expert * c.n_embd, (expert + 1) * c.n_embd)
            y = self.matmul(np.ascontiguousarray(act, dtype=np.float32), self.matrix_rows(layer.w_down_exps, down))
            np.add.at(out, rows, y * weights[rows, slots][:, None])
        return out

    def memory(self) -> MemoryStats:
        weights = sum(getattr(w, "nbytes", 0) for layer in self.layers for w in vars(layer).values() if w is not None)
        weights += self.output.nbytes + self.token_embd.nbytes
        return MemoryStats(weights_bytes=weights, kv_cache_bytes=0)

    def close(self) -> None:
        self.layers = []
        self.output = None

    # -- batched decode: one pass for several sequences --------------------------------------------------
    def forward_batch(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> np.ndarray:
        """One decode step for B sequences of different lengths: token ``i`` is appended to ``caches[i]``.

        The B hidden rows go through every weight as one (B, n_embd) product (the weights are read once
        per step, not B times); attention runs per sequence over its own cache.

        Returns:
            float32 logits, shape (B, n_vocab).
        """
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0 or tokens.size != len(caches):
            raise ValueError(f"forward_batch needs one token per cache, got {tokens.size} tokens for {len(caches)} caches")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("forward_batch got the same cache twice")
        for cache in caches:
            cache.reserve(1)
        positions = np.array([cache.n_past for cache in caches])  # (B,)
        x = self.embed(tokens)  # (B, n_embd)
        for i, layer in enumerate(self.layers):
            x = x + self._attention_block_batch(i, layer, x, positions, caches)
            x = x + self._ffn_block(layer, x)
        for cache in caches:
            cache.advance(1)
        return self.logits(x)

    def _attention_block_batch(self, i: int, layer: Layer, x: np.ndarray, positions: np.ndarray,
                               caches: Sequence[KVCache]) -> np.ndarray:
        """Attention for B decode rows: row ``b`` is at ``positions[b]`` of ``caches[b]``."""
        c = self.config
        q, k, v = self._project_qkv(i, layer, x, positions)
        window = c.sliding_window if c.is_sliding(i) else 0
        out = np.empty((x.shape[0], c.n_heads * c.v_head_dim), dtype=np.float32)  # (B, n_heads * v_head_dim)
        for b, cache in enumerate(caches):
            cache.store(i, k[b:b + 1].transpose(1, 0, 2), v[b:b + 1].transpose(1, 0, 2))
            out[b] = self._attend(q[b:b + 1], cache.keys[i], cache.values[i], positions[b:b + 1], window)[0]
        return self._attention_output(layer, out)

    def _project_qkv(self, i: int, layer: Layer, x: np.ndarray, positions: np.ndarray):
        """Normed, biased, rotated queries (n, n_heads, head_dim), keys and values (n, n_kv_heads, ...) of rows ``x``."""
        c = self.config
        n = x.shape[0]
        h = x if layer.attn_norm is None else rms_norm(x, layer.attn_norm, c.rms_eps)
        h = np.ascontiguousarray(h, dtype=np.float32)
        q, k, v = self.matmul(h, layer.wq), self.matmul(h, layer.wk), self.matmul(h, layer.wv)
        if layer.bq is not None:
            q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
        if c.qk_norm_whole:  # olmo2: one norm over the whole projection, before the split into heads
            q = rms_norm(q, layer.q_norm, c.rms_eps)
            k = rms_norm(k, layer.k_norm, c.rms_eps)
        q = q.reshape(n, c.n_heads, c.head_dim)
        k = k.reshape(n, c.n_kv_heads, c.head_dim)
        v = v.reshape(n, c.n_kv_heads, c.v_head_dim)
        if c.qk_norm:
            q = rms_norm(q, layer.q_norm, c.rms_eps)
            k = rms_norm(k, layer.k_norm, c.rms_eps)
        rope_set = self.rope_layer_set[i]
        if rope_set >= 0:
            inv_freq = self.rope_inv_freq[rope_set]
            q = apply_rope(q, positions, inv_freq, c.rope_neox, c.rope_mscale)
            k = apply_rope(k, positions, inv_freq, c.rope_neox, c.rope_mscale)
        if c.attn_temp_scale:  # mistral3 temperature tuning, after RoPE
            q = q * attn_temperature(c, positions)[:, None, None]
        return q, k, v
