"""The fused C decoder's Python side: the model handle built once from the packed weights, and its KV cache.

One C call runs every layer for a chunk of prompt tokens, or for one decode step of one or several sequences,
with the GIL released. The handle points into the memory-mapped GGUF (nothing is copied) and keeps those
arrays alive; its scratch arena is allocated once for ``MAX_ROWS`` rows and reused by every call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from ...config import ModelConfig
from ...gguf_file import ModelFormatError
from .. import KV_TYPES
from ...kv_cache import SteppedKVCache
from . import kernels

MAX_ROWS = 256  # rows per C call: prompt chunks and decode batches are cut to this (it sizes the scratch arena)
# KV_TYPES, named as llama.cpp's -ctk / -ctv: float16, float32, or q8_0 blocks (32 int8 codes and a float16 scale:
# 34 bytes per 32 elements, 47 % less than float16)
_KV_DTYPES = {"f16": np.dtype(np.float16), "f32": np.dtype(np.float32), "q8_0": np.dtype(np.uint8)}
Q8_0_BLOCK, Q8_0_BYTES = 32, 34
_LOGITS_NONE, _LOGITS_LAST, _LOGITS_ALL = 0, 1, 2  # decoder.h HK_LOGITS_*
_LAYER_VECTORS = ("attn_norm", "ffn_norm", "bq", "bk", "bv", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")
_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "swiglu_oai": 2}  # swiglu_oai: the experts' only (moe.h)
_GATINGS = {"softmax": 0, "sigmoid": 1, "softmax_weight": 2}  # moe.h HK_GATING_*
_EXPERT_VECTORS = ("b_router", "b_gate_exps", "b_up_exps", "b_down_exps", "exp_probs_b")


def kv_type_name(kv_type: Any) -> str:
    """``"f16"``, ``"f32"`` or ``"q8_0"`` for a KV type given by that name or as a NumPy float dtype.

    Raises:
        ValueError: any other type.
    """
    if isinstance(kv_type, str) and kv_type in KV_TYPES:
        return kv_type
    try:
        dtype = np.dtype(kv_type)
    except TypeError:
        dtype = None
    for name in ("f16", "f32"):
        if dtype == _KV_DTYPES[name]:
            return name
    raise ValueError(f"KV cache type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")


def kv_row_bytes(kv_type: str, dim: int) -> int:
    """Bytes of one cached key or value row of ``dim`` elements."""
    return dim // Q8_0_BLOCK * Q8_0_BYTES if kv_type == "q8_0" else dim * _KV_DTYPES[kv_type].itemsize


class CpuKVCache(SteppedKVCache):
    """Keys and values of one sequence in two arrays the C decoder writes into, grown in steps up to n_ctx.

    A q8_0 cache holds each key and value row as uint8 q8_0 blocks (its last axis is bytes, not elements), after
    the Walsh-Hadamard rotation llama.cpp applies (``q8_0_rotation``); its snapshots (``export_state``) are the
    dequantized values turned back, float32, and ``import_state`` rotates and quantizes them.
    """

    k: np.ndarray  # (n_layers, n_kv_heads, capacity, head_dim), or (..., head_dim / 32 * 34) uint8 for q8_0
    v: np.ndarray  # (n_layers, n_kv_heads, capacity, v_head_dim), or (..., v_head_dim / 32 * 34) uint8

    def __init__(self, config: ModelConfig, n_ctx: int, dtype: Any = np.float16):
        self.kv_type = kv_type_name(dtype)
        if self.kv_type == "q8_0" and (config.head_dim % Q8_0_BLOCK or config.v_head_dim % Q8_0_BLOCK):
            raise ValueError(f"a q8_0 KV cache needs head dimensions that are multiples of {Q8_0_BLOCK}; this "
                             f"model's are {config.head_dim} and {config.v_head_dim}")
        super().__init__(config, n_ctx, _KV_DTYPES[self.kv_type])

    def layers(self) -> tuple[np.ndarray, np.ndarray]:
        return self.k, self.v  # indexing the first axis gives each layer's view

    def _grow_to(self, capacity: int) -> None:
        cfg, filled = self.config, self._n_past
        k = np.zeros((cfg.n_layers, cfg.n_kv_heads, capacity, kv_row_bytes(self.kv_type, cfg.head_dim)
                      // self.dtype.itemsize), self.dtype)
        v = np.zeros((cfg.n_layers, cfg.n_kv_heads, capacity, kv_row_bytes(self.kv_type, cfg.v_head_dim)
                      // self.dtype.itemsize), self.dtype)
        if filled:
            k[:, :, :filled] = self.k[:, :, :filled]
            v[:, :, :filled] = self.v[:, :, :filled]
        self.k, self.v, self.capacity = k, v, capacity

    def _decode(self, stored: np.ndarray, is_values: bool) -> np.ndarray:
        if self.kv_type != "q8_0":
            return super()._decode(stored, is_values)
        return _hadamard(_dequantize_q8_0(stored), q8_0_rotation(stored.shape[-1] // Q8_0_BYTES * Q8_0_BLOCK, is_values))

    def _encode(self, data: np.ndarray, is_values: bool) -> np.ndarray:
        if self.kv_type != "q8_0":
            return super()._encode(data, is_values)
        return _quantize_q8_0(_hadamard(np.asarray(data, np.float32), q8_0_rotation(data.shape[-1], is_values)))

    def c_view(self, n_rows: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        """What the C decoder takes for appending ``n_rows`` positions (room must be reserved)."""
        return self.k, self.v, self._n_past, n_rows


def q8_0_rotation(dim: int, is_values: bool) -> int:
    """The Walsh-Hadamard rotation a q8_0 cache applies to rows of ``dim`` keys (or values) before quantizing, as
    llama.cpp's: keys by the largest power of two from 64 that divides ``dim``, values by 64; 0: none (attention.c)."""
    if dim % 64:
        return 0
    if is_values:
        return 64
    n = 64
    while dim % (2 * n) == 0:
        n *= 2
    return n


def _hadamard(x: np.ndarray, n: int) -> np.ndarray:
    """x (..., dim) with every run of n elements multiplied by Sylvester's Hadamard matrix over sqrt(n) (its own
    inverse); x itself when n is 0."""
    if n == 0:
        return x
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    runs = x.reshape(*x.shape[:-1], -1, n) @ (h / np.float32(np.sqrt(n)))
    return runs.reshape(x.shape).astype(np.float32)


def _quantize_q8_0(values: np.ndarray) -> np.ndarray:
    """float (..., dim) -> uint8 (..., dim / 32 * 34) q8_0 blocks, as the C decoder writes them."""
    if values.shape[-1] % Q8_0_BLOCK:
        raise ValueError(f"q8_0 needs rows of a multiple of {Q8_0_BLOCK} values, got {values.shape[-1]}")
    return gguf_quants.quantize(np.ascontiguousarray(values, dtype=np.float32), GGMLQuantizationType.Q8_0)


def _dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """uint8 (..., dim / 32 * 34) q8_0 blocks -> float32 (..., dim)."""
    return gguf_quants.dequantize(np.ascontiguousarray(blocks), GGMLQuantizationType.Q8_0).astype(np.float32)


class CpuDecoder:
    """The C model handle: every layer's packed matrices, norms and biases, RoPE tables and windows.

    Args:
        config: the model's hyper-parameters; every architecture field it has is passed to the C decoder.
        layers: per layer, an object with the fields of ``numpy_backend.Layer`` whose matrices have
            ``blocks`` (uint8 rows, a view into the mmap) and ``qtype``, and whose vectors are float32
            (``attn_norm``/``ffn_norm`` None where the architecture has no norm before the block).
        token_embd: (embd uint8 rows, qtype); output: the output matrix (same form as the layer matrices).
        output_norm: (n_embd,) float32.
        inv_freq: (n_sets, rope_dim // 2) float64, the effective RoPE inverse frequencies of ``engine/rope.py``.
        layer_set: per layer, the row of ``inv_freq`` it rotates with, or -1 for a layer without RoPE.
        release: called with a matrix's mapped rows once the decoder holds a repacked copy of them
            (``kernels.repack16``: the dense Q4_0 / IQ4_NL / Q4_K / Q8_0 / Q6_K matrices under AVX-512), so the
            file's pages can leave resident memory. None: keep no copies, every matrix is read from the map.
    """

    def __init__(self, config: ModelConfig, layers: Sequence[Any], token_embd: tuple[np.ndarray, int], output: Any,
                 output_norm: np.ndarray, inv_freq: np.ndarray, layer_set: Sequence[int],
                 release: Callable[[np.ndarray], None] | None = None):
        if config.activation not in _ACTIVATIONS:
            raise ModelFormatError(f"the CPU decoder has no activation {config.activation!r}")
        c = config
        freqs = np.ascontiguousarray(inv_freq, dtype=np.float64).reshape(-1, c.rope_dim // 2)  # (n_sets, rope_dim // 2)
        if len(layer_set) != c.n_layers:
            raise ValueError(f"layer_set has {len(layer_set)} entries for {c.n_layers} layers")
        if c.is_moe and c.expert_gating not in _GATINGS:
            raise ModelFormatError(f"the CPU decoder has no expert gating {c.expert_gating!r}")
        n_ff = c.n_ff_shexp if c.is_moe and c.n_ff_shexp else c.n_ff  # a MoE layer's dense FFN: its shared expert
        ints = (c.n_layers, c.n_embd, n_ff, c.n_heads, c.n_kv_heads, c.head_dim, c.v_head_dim, c.n_vocab, c.rope_dim,
                int(c.rope_neox), _ACTIVATIONS[c.activation], MAX_ROWS, int(c.qk_norm_whole), c.attn_temp_floor,
                c.n_expert, c.n_expert_used, c.n_ff_exp, _GATINGS.get(c.expert_gating, 0), int(c.expert_norm_weights))
        floats = (c.rms_eps, c.embed_scale, c.attn_scale, c.attn_softcap, c.final_softcap, c.residual_scale,
                  c.logit_scale, c.rope_mscale, c.attn_temp_scale, c.expert_weights_scale)
        self._copies = self._repack([m for layer in layers for m in self._dense_of(layer)] + [output], release)
        specs = [self._layer_spec(c, i, layer, int(layer_set[i])) for i, layer in enumerate(layers)]
        # a tied output is the embedding: one copy serves both (the C decoder reads a token's row from it)
        embd = self._matrix(output) if np.shares_memory(output.blocks, token_embd[0]) else token_embd
        self.config = config
        self._ext = _extension()
        self._handle = self._ext.decoder_new(ints, floats, (embd[0], int(embd[1])), self._matrix(output),
                                           _f32(output_norm), freqs, specs)

    @staticmethod
    def _dense_of(layer: Any) -> tuple:
        """A layer's dense matrices, as the C decoder takes them: with experts, gate/up/down are the shared
        expert's."""
        ffn = (layer.w_gate, layer.w_up, layer.w_down) if layer.w_router is None else \
            (layer.w_gate_shexp, layer.w_up_shexp, layer.w_down_shexp)
        return (layer.wq, layer.wk, layer.wv, layer.wo, *ffn)

    @staticmethod
    def _repack(matrices: list, release: Callable[[np.ndarray], None] | None) -> dict[int, tuple[np.ndarray, int]]:
        """Copies of the dense matrices the 16-row layout pays for (``kernels.repack16``; one-token products from
        memory measured 1.00-1.36x the file layout's, docs/benchmarks.md), by id of the matrix, and their mapped
        pages released. One allocation aligned to 2 MiB, so the kernel can back it with huge pages as the file's map
        is. Only with ``release``: nothing is held twice. An untied token embedding stays in the map in 4 KiB
        pages (``GGUFFile``: a token reads one row of it)."""
        picks = [] if release is None else \
            [m for m in {id(m): m for m in matrices if m is not None}.values()
             if kernels.repack16_type(m.qtype, m.blocks.shape[0]) is not None]
        if not picks:
            return {}
        huge, line = 2 << 20, 64
        arena = np.empty(sum(m.nbytes + line for m in picks) + huge, np.uint8)
        at = -arena.__array_interface__["data"][0] % huge
        copies = {}
        for m in picks:
            out = arena[at:at + m.nbytes].reshape(m.blocks.shape)
            copies[id(m)] = kernels.repack16(m.blocks, m.qtype, out)
            at += -(-m.nbytes // line) * line  # each copy starts on a cache line, as its kernels' vectors expect
            release(m.blocks)
        return copies

    def _matrix(self, matrix: Any) -> tuple[np.ndarray, int] | None:
        """A matrix as the C decoder takes it: its repacked copy, else its mapped rows (None stays None)."""
        if matrix is None:
            return None
        return self._copies.get(id(matrix)) or (matrix.blocks, int(matrix.qtype))

    def _layer_spec(self, c: ModelConfig, i: int, layer: Any, rope_set: int) -> tuple:
        """decoder_module.c's layer tuple: 7 matrices (with experts, gate/up/down are the shared expert's, or
        None), 9 vectors, RoPE set, window, attention output bias, sinks, then the router, the 3 expert matrices,
        5 expert vectors and the shared expert's gate (None without experts)."""
        matrices = tuple(self._matrix(m) for m in self._dense_of(layer))
        experts = tuple(_packed(m) for m in (layer.w_router, layer.w_gate_exps, layer.w_up_exps, layer.w_down_exps))
        vectors = tuple(_f32(getattr(layer, name)) for name in _LAYER_VECTORS)
        expert_vectors = tuple(_f32(getattr(layer, name)) for name in _EXPERT_VECTORS)
        return (*matrices, *vectors, rope_set, c.sliding_window if c.is_sliding(i) else 0, _f32(layer.bo),
                _f32(layer.attn_sinks), *experts, *expert_vectors, _f32(layer.w_gate_inp_shexp))

    @property
    def scratch_bytes(self) -> int:
        return self._ext.decoder_scratch_bytes(self._handle)

    def forward(self, tokens: np.ndarray, cache: CpuKVCache, all_logits: bool) -> np.ndarray:
        """Append ``tokens`` (int32, room reserved) to ``cache``; logits (n, n_vocab) or (n_vocab,)."""
        n = tokens.size
        logits = np.empty((n if all_logits else 1, self.config.n_vocab), np.float32)  # (rows, n_vocab)
        for start in range(0, n, MAX_ROWS):
            chunk = tokens[start:start + MAX_ROWS]
            last = start + chunk.size == n
            if all_logits:
                out, mode = logits[start:start + chunk.size], _LOGITS_ALL
            else:
                out, mode = (logits, _LOGITS_LAST) if last else (None, _LOGITS_NONE)
            self._ext.decoder_forward(self._handle, chunk, (cache.c_view(chunk.size),), out, mode)
            cache.advance(chunk.size)
        return logits if all_logits else logits[0]

    def forward_batch(self, tokens: np.ndarray, caches: Sequence[CpuKVCache]) -> np.ndarray:
        """One decode step for each cache (room reserved): token ``i`` goes to ``caches[i]``; logits (B, n_vocab)."""
        logits = np.empty((tokens.size, self.config.n_vocab), np.float32)  # (B, n_vocab)
        for start in range(0, tokens.size, MAX_ROWS):
            group = caches[start:start + MAX_ROWS]
            self._ext.decoder_forward(self._handle, tokens[start:start + len(group)], [c.c_view(1) for c in group],
                                    logits[start:start + len(group)], _LOGITS_LAST)
            for cache in group:
                cache.advance(1)
        return logits

    def close(self) -> None:
        self._handle = None


def _extension():
    """The C extension, as kernels.py loaded and configured it (ISA, threads)."""
    if not kernels.AVAILABLE:
        raise RuntimeError(f"the CPU kernels extension is not loaded (not built, or {kernels.ISA_ENV}=numpy)")
    from . import _kernels
    return _kernels


def _packed(matrix: Any) -> tuple[np.ndarray, int] | None:
    return None if matrix is None else (matrix.blocks, int(matrix.qtype))


def _f32(vector: np.ndarray | None) -> np.ndarray | None:
    return None if vector is None else np.ascontiguousarray(vector, dtype=np.float32)
