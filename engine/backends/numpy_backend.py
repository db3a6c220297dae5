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
from ..deltanet import deltanet_mix, deltanet_project, load_deltanet
from ..gemma4 import PerLayerEmbeddings, dense_and_experts_ffn
from ..gguf_file import GGUFFile, ModelFormatError
from ..hybrid_cache import HybridKVCache
from ..kv_cache import NumpyKVCache
from ..memory_estimate import active_weight_fraction
from ..moe import moe_ffn, swiglu_oai
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
# ModelConfig.activation -> the gated FFN's (gate, up) -> hidden
GATED_ACTIVATIONS = {"silu": lambda gate, up: silu(gate) * up, "gelu_tanh": lambda gate, up: gelu_tanh(gate) * up,
                     "swiglu_oai": swiglu_oai}


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
    b_router: np.ndarray | None = None  # (n_expert,), gpt-oss
    b_gate_exps: np.ndarray | None = None  # (n_expert * n_ff_exp,): expert e's are e * n_ff_exp ...
    b_up_exps: np.ndarray | None = None  # (n_expert * n_ff_exp,)
    b_down_exps: np.ndarray | None = None  # (n_expert * n_embd,)
    exp_probs_b: np.ndarray | None = None  # (n_expert,) selection bias
    w_gate_shexp: Any = None  # (n_ff_shexp, n_embd): the shared expert every token runs
    w_up_shexp: Any = None  # (n_ff_shexp, n_embd)
    w_down_shexp: Any = None  # (n_embd, n_ff_shexp)
    w_gate_inp_shexp: np.ndarray | None = None  # (n_embd,): its sigmoid gate
    bo: np.ndarray | None = None  # (n_embd,) attn_output.bias
    attn_sinks: np.ndarray | None = None  # (n_heads,) per-head sink logits
    # a hybrid model's recurrent layer: its Gated DeltaNet mixer in place of attention (wq ... are None)
    deltanet: Any = None  # engine.deltanet.DeltaNetWeights
    # gemma4 (engine.gemma4): wk / wv / k_norm are None in a layer that reads another layer's cache
    out_scale: np.ndarray | None = None  # (1,) the layer's output multiplier
    ple_gate: Any = None  # (n_embd_per_layer, n_embd): the per-layer embedding's gate
    ple_proj: Any = None  # (n_embd, n_embd_per_layer)
    ple_norm: np.ndarray | None = None  # (n_embd,)
    router_scale: np.ndarray | None = None  # (n_embd,) gemma4 with experts: the router input's scale
    pre_ffn_norm_2: np.ndarray | None = None  # (n_embd,) the experts' input norm
    post_ffn_norm_1: np.ndarray | None = None  # (n_embd,) the dense FFN's output norm
    post_ffn_norm_2: np.ndarray | None = None  # (n_embd,) the experts' output norm
    down_exps_scale: np.ndarray | None = None  # (n_expert,)


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
        self.gated_activation = GATED_ACTIVATIONS[config.activation]
        self.per_layer = None  # gemma4's per-layer embeddings
        if config.n_embd_per_layer:
            self.per_layer = self._load_per_layer_embeddings()

    def _load_per_layer_embeddings(self) -> PerLayerEmbeddings:
        c, name = self.config, "per_layer_token_embd.weight"
        width = c.n_layers * c.n_embd_per_layer
        for tensor, shape in ((name, (width, c.n_vocab)), ("per_layer_model_proj.weight", (c.n_embd, width)),
                              ("per_layer_proj_norm.weight", (c.n_embd_per_layer,))):
            if self.gguf.tensor(tensor).shape != shape:
                raise ModelFormatError(f"tensor {tensor!r} has shape {self.gguf.tensor(tensor).shape}, expected {shape}")
        packed, qtype = self.gguf.raw(name), self.gguf.tensor(name).qtype

        def rows(tokens: np.ndarray) -> np.ndarray:  # dequantized on lookup, as the token embedding
            return dequantize(packed[tokens], qtype).astype(np.float32)

        return PerLayerEmbeddings(rows, self.load_matrix("per_layer_model_proj.weight"),
                                  self.load_vector("per_layer_proj_norm.weight"), c.n_layers, c.n_embd,
                                  c.n_embd_per_layer, c.rms_eps)

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
        if self.config.is_recurrent(i):
            fields["deltanet"] = load_deltanet(self.gguf, self.config, i, self.load_matrix, self.load_vector)
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
        if self.config.is_hybrid:
            return HybridKVCache(self.config, n_ctx, self._replay)
        return NumpyKVCache(self.config, n_ctx)

    def _replay(self, cache: KVCache, tokens: list[int]) -> None:
        """Feed ``tokens`` without logits: a hybrid cache's roll-back to a position it has no checkpoint for."""
        NumpyBackend.forward(self, tokens, cache)

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("forward needs at least one token")
        cache.reserve(tokens.size)
        snapshot = cache.recurrent.begin_call(tokens.size) if self.config.is_hybrid else False
        outputs = []
        for start in range(0, tokens.size, PREFILL_CHUNK):
            chunk = tokens[start:start + PREFILL_CHUNK]
            hidden = self._forward_chunk(chunk, cache, snapshot)
            if all_logits:
                outputs.append(self.logits(hidden))
        if self.config.is_hybrid:
            cache.recurrent.end_call(tokens)
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

    def _forward_chunk(self, tokens: np.ndarray, cache: NumpyKVCache, snapshot: bool = False) -> np.ndarray:
        positions = np.arange(cache.n_past, cache.n_past + tokens.size)
        x = self.embed(tokens)  # (n, n_embd)
        layer_inputs = self._per_layer_inputs(tokens, x)
        for i, layer in enumerate(self.layers):
            if layer.deltanet is None:
                x = x + self._attention_block(i, layer, x, positions, cache)
            else:
                x = x + self._deltanet_block(i, layer, x, [cache], snapshot)
            x = self._layer_output(i, layer, x + self._ffn_block(layer, x), layer_inputs)
        cache.advance(tokens.size)
        return x

    def _deltanet_block(self, i: int, layer: Layer, x: np.ndarray, caches: Sequence[HybridKVCache],
                        snapshot: bool = False) -> np.ndarray:
        """A recurrent layer's mixer: ``x`` holds one sequence's consecutive rows (one cache), or one decode
        row per cache; the projections run once for all rows, the recurrence per sequence."""
        c, w = self.config, layer.deltanet
        h = np.ascontiguousarray(rms_norm(x, layer.attn_norm, c.rms_eps), dtype=np.float32)
        inputs = deltanet_project(h, w, self.matmul)
        per_row = len(caches) > 1
        mixed = []
        for b, cache in enumerate(caches):
            states = cache.recurrent
            snapshots = [] if snapshot else None
            rows = slice(b, b + 1) if per_row else slice(None)
            mixed.append(deltanet_mix(inputs.rows(rows), w, states.live[i], c, snapshots))
            for t, state in snapshots or ():
                states.add_snapshot(cache.n_past + t + 1, i, state)
        out = np.concatenate(mixed) if per_row else mixed[0]
        out = self.matmul(out, w.w_out)
        if c.residual_scale != 1.0:
            out = out * np.float32(c.residual_scale)
        return out

    def _per_layer_inputs(self, tokens: np.ndarray, x: np.ndarray) -> np.ndarray | None:
        """gemma4's per-layer inputs (n_layers, n, n_embd_per_layer) of embedded rows ``x``; None without."""
        if self.per_layer is None:
            return None
        return self.per_layer.inputs(tokens, x, self.matmul, rms_norm)

    def _layer_output(self, i: int, layer: Layer, x: np.ndarray, layer_inputs: np.ndarray | None) -> np.ndarray:
        """A layer's residual after its FFN, plus gemma4's per-layer embedding block and output scale."""
        if layer_inputs is not None:
            x = x + PerLayerEmbeddings.block(x, layer_inputs[i], layer, self.matmul, gelu_tanh, rms_norm,
                                             self.config.rms_eps)
        if layer.out_scale is not None:
            x = x * layer.out_scale[0]
        return x

    def _attention_block(self, i: int, layer: Layer, x: np.ndarray, positions: np.ndarray, cache) -> np.ndarray:
        c = self.config
        q, k, v, gate = self._project_qkv(i, layer, x, positions)
        if k is not None:  # None: a gemma4 layer that reads an earlier layer's cache
            cache.store(i, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
        window = c.sliding_window if c.is_sliding(i) else 0
        src = c.kv_layer(i)
        out = self._attend(q, cache.keys[src], cache.values[src], positions, window, layer.attn_sinks)
        return self._attention_output(layer, out, gate)

    def _attention_output(self, layer: Layer, out: np.ndarray, gate: np.ndarray | None = None) -> np.ndarray:
        """Output gate (qwen35: ``out * sigmoid(gate)``), projection of attention rows (n, n_heads * v_head_dim),
        post-norm and residual scale."""
        c = self.config
        if gate is not None:
            out = out * (1.0 / (1.0 + np.exp(-gate)))
        out = self.matmul(np.ascontiguousarray(out, dtype=np.float32), layer.wo)
        if layer.bo is not None:
            out = out + layer.bo
        if layer.post_attn_norm is not None:
            out = rms_norm(out, layer.post_attn_norm, c.rms_eps)
        if c.residual_scale != 1.0:
            out = out * np.float32(c.residual_scale)
        return out

    def _attend(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, positions: np.ndarray, window: int,
                sinks: np.ndarray | None = None) -> np.ndarray:
        """Grouped-query attention of q (n, n_heads, head_dim) over the cache; returns (n, n_heads * v_head_dim).

        ``sinks`` (n_heads,): a logit per head that joins each softmax's normalisation but has no value (gpt-oss).
        """
        c = self.config
        n = q.shape[0]
        if 1 < n <= ROW_EXACT_ROWS:  # BLAS sums differ with the shapes; quantized activations amplify that
            return np.concatenate([self._attend(q[r:r + 1], keys, values, positions[r:r + 1], window, sinks)
                                   for r in range(n)])
        k_len = int(positions[-1]) + 1
        n_kv_heads = keys.shape[0]  # heads and widths by layer kind in gemma4
        group = c.n_heads // n_kv_heads
        head_dim, v_head_dim = q.shape[-1], values.shape[-1]
        qg = (q * np.float32(c.attn_scale)).transpose(1, 0, 2).reshape(n_kv_heads, group * n, head_dim)
        scores = qg @ keys[:, :k_len].transpose(0, 2, 1)  # (n_kv_heads, group * n, k_len)
        if c.attn_softcap:
            scores = softcap(scores, c.attn_softcap)
        scores = scores.reshape(n_kv_heads, group, n, k_len) + attention_mask(positions, k_len, window)
        peak = scores.max(axis=-1, keepdims=True)
        if sinks is not None:
            sink = sinks.reshape(n_kv_heads, group, 1, 1).astype(np.float32)
            peak = np.maximum(peak, sink)
        scores -= peak
        np.exp(scores, out=scores)
        total = scores.sum(axis=-1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(sink - peak)
        scores /= total
        out = scores.reshape(n_kv_heads, group * n, k_len) @ values[:, :k_len]  # (n_kv_heads, group * n, v_head_dim)
        return out.reshape(c.n_heads, n, v_head_dim).transpose(1, 0, 2).reshape(n, c.n_heads * v_head_dim)

    def _ffn_block(self, layer: Layer, x: np.ndarray) -> np.ndarray:
        c = self.config
        if c.ffn_dense_and_experts:
            out = dense_and_experts_ffn(x, layer, c, self.matmul, self.matrix_rows, self.gated_activation, rms_norm,
                                        moe_ffn)
            return rms_norm(out, layer.post_ffn_norm, c.rms_eps)
        h = x if layer.ffn_norm is None else rms_norm(x, layer.ffn_norm, c.rms_eps)
        h = np.ascontiguousarray(h, dtype=np.float32)
        if c.is_moe:
            out = self._moe(layer, h)
        else:
            act = self.gated_activation(self.matmul(h, layer.w_gate), self.matmul(h, layer.w_up))
            out = self.matmul(np.ascontiguousarray(act, dtype=np.float32), layer.w_down)
        if layer.post_ffn_norm is not None:
            out = rms_norm(out, layer.post_ffn_norm, c.rms_eps)
        if c.residual_scale != 1.0:
            out = out * np.float32(c.residual_scale)
        return out

    def _moe(self, layer: Layer, h: np.ndarray) -> np.ndarray:
        """The mixture-of-experts FFN of normed rows h (n, n_embd) (``engine.moe.moe_ffn``)."""
        return moe_ffn(h, layer, self.config, self.matmul, self.matrix_rows, self.gated_activation)

    def memory(self) -> MemoryStats:
        weights = sum(getattr(w, "nbytes", 0) for layer in self.layers for w in vars(layer).values() if w is not None)
        weights += self.output.nbytes + self.token_embd.nbytes
        return MemoryStats(weights_bytes=weights, kv_cache_bytes=0,
                           active_weights_bytes=round(weights * active_weight_fraction(self.gguf, self.config)))

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
        layer_inputs = self._per_layer_inputs(tokens, x)
        if self.config.is_hybrid:
            for cache in caches:
                cache.recurrent.begin_call(1)
        for i, layer in enumerate(self.layers):
            if layer.deltanet is None:
                x = x + self._attention_block_batch(i, layer, x, positions, caches)
            else:
                x = x + self._deltanet_block(i, layer, x, caches)
            x = self._layer_output(i, layer, x + self._ffn_block(layer, x), layer_inputs)
        if self.config.is_hybrid:
            for cache, token in zip(caches, tokens):
                cache.recurrent.end_call([token])
        for cache in caches:
            cache.advance(1)
        return self.logits(x)

    def _attention_block_batch(self, i: int, layer: Layer, x: np.ndarray, positions: np.ndarray,
                               caches: Sequence[KVCache]) -> np.ndarray:
        """Attention for B decode rows: row ``b`` is at ``positions[b]`` of ``caches[b]``."""
        c = self.config
        q, k, v, gate = self._project_qkv(i, layer, x, positions)
        window = c.sliding_window if c.is_sliding(i) else 0
        src = c.kv_layer(i)
        out = np.empty((x.shape[0], c.n_heads * c.layer_v_head_dim(i)), dtype=np.float32)  # (B, n_heads * v_head_dim)
        for b, cache in enumerate(caches):
            if k is not None:
                cache.store(i, k[b:b + 1].transpose(1, 0, 2), v[b:b + 1].transpose(1, 0, 2))
            out[b] = self._attend(q[b:b + 1], cache.keys[src], cache.values[src], positions[b:b + 1], window,
                                  layer.attn_sinks)[0]
        return self._attention_output(layer, out, gate)

    def _project_qkv(self, i: int, layer: Layer, x: np.ndarray, positions: np.ndarray):
        """Normed, biased, rotated queries (n, n_heads, head_dim), keys and values (n, n_kv_heads, ...) of rows ``x``,
        and the output gate (n, n_heads * head_dim) of gated attention (qwen35), else None; keys and values are None
        in a layer that reads another layer's cache (gemma4)."""
        c = self.config
        n = x.shape[0]
        h = x if layer.attn_norm is None else rms_norm(x, layer.attn_norm, c.rms_eps)
        h = np.ascontiguousarray(h, dtype=np.float32)
        if layer.wk is None:
            return self._project_q_only(i, layer, h, positions), None, None, None
        q, k = self.matmul(h, layer.wq), self.matmul(h, layer.wk)
        v = k if layer.wv is None else self.matmul(h, layer.wv)  # gemma4: no attn_v, the keys are the values
        if layer.bq is not None:
            q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
        gate = None
        if c.attn_output_gate:  # per head: the query, then its gate
            both = q.reshape(n, c.n_heads, 2, c.head_dim)
            q, gate = both[:, :, 0].reshape(n, c.n_q_embd), both[:, :, 1].reshape(n, c.n_q_embd)
        if c.qk_norm_whole:  # olmo2: one norm over the whole projection, before the split into heads
            q = rms_norm(q, layer.q_norm, c.rms_eps)
            k = rms_norm(k, layer.k_norm, c.rms_eps)
        q = q.reshape(n, c.n_heads, c.layer_head_dim(i))
        k = k.reshape(n, c.layer_n_kv_heads(i), c.layer_head_dim(i))
        v = v.reshape(n, c.layer_n_kv_heads(i), c.layer_v_head_dim(i))
        if c.qk_norm:
            q = rms_norm(q, layer.q_norm, c.rms_eps)
            k = rms_norm(k, layer.k_norm, c.rms_eps)
        if c.v_norm:
            v = rms_norm(v, np.float32(1.0), c.rms_eps)
        rope_set = self.rope_layer_set[i]
        if rope_set >= 0:
            inv_freq = self.rope_inv_freq[rope_set]
            q = apply_rope(q, positions, inv_freq, c.rope_neox, c.rope_mscale)
            k = apply_rope(k, positions, inv_freq, c.rope_neox, c.rope_mscale)
        if c.attn_temp_scale:  # mistral3 temperature tuning, after RoPE
            q = q * attn_temperature(c, positions)[:, None, None]
        return q, k, v, gate

    def _project_q_only(self, i: int, layer: Layer, h: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Normed, rotated queries (n, n_heads, head_dim) of normed rows ``h``: a gemma4 shared-KV layer."""
        c = self.config
        q = rms_norm(self.matmul(h, layer.wq).reshape(h.shape[0], c.n_heads, c.layer_head_dim(i)), layer.q_norm,
                     c.rms_eps)
        rope_set = self.rope_layer_set[i]
        return apply_rope(q, positions, self.rope_inv_freq[rope_set], c.rope_neox, c.rope_mscale)
