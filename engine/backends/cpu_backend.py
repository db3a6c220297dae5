"""The CPU backend: the fused C decoder (engine/backends/cpu/decoder.py) on the packed GGUF blocks.

Weights are never dequantized: each matrix is a view into the memory-mapped file, so resident memory is about
the file size. The one copy is a layout change: under AVX-512 the C decoder's dense Q4_0 / IQ4_NL / Q4_K /
Q8_0 matrices are repacked at load into groups of 16 rows (``kernels.repack16``; Qwen3-4B Q4_0's 2 GB add 0.5 s
to a load, Llama-3.2-1B Q4_K_M's 0.47 GB of Q4_K 0.15-0.35 s, 2 threads, file cached) and their pages in the map
are released, so they are still held once. Every forward call runs all layers in C with the GIL released; the NumPy
reference decoder this class inherits stays available as ``reference_forward`` (the same math with the same C
matrix products, in NumPy), which the tests hold the C decoder to.

Mixture-of-experts models (qwen3moe, gpt-oss, qwen2moe with its shared expert) run in the C decoder too, which
reads only the chosen experts' rows (csrc/moe.c). Hybrid (Gated DeltaNet) models, gemma4 and MoE models with the
router's weights on the experts' input (llama4) do not yet: they take
that reference path (the C products on the packed, memory-mapped rows; only the chosen experts' rows are read; the
DeltaNet conv and recurrence in NumPy) with a NumPy float32 KV cache (``HybridKVCache`` for hybrids).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence

import numpy as np

from ..config import ModelConfig
from ..gemma4 import uses_gemma4_blocks
from ..gguf_file import GGUFFile, ModelFormatError
from ..kv_cache import NumpyKVCache
from ..memory_estimate import active_weight_fraction
from .base import KVCache, MemoryStats
from .cpu import kernels
from .cpu.decoder import Q8_0_BLOCK, CpuDecoder, CpuKVCache, kv_type_name
from .numpy_backend import NumpyBackend

DEFAULT_KV_DTYPE = np.float16  # as llama.cpp: half the attention's memory traffic; export_state gives float32


@dataclasses.dataclass(frozen=True)
class PackedMatrix:
    """A weight matrix as GGUF stores it."""

    blocks: np.ndarray  # (rows, row_bytes) uint8 view into the mmap
    qtype: int

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes


def runs_in_c_decoder(config: ModelConfig) -> bool:
    """Whether the fused C decoder runs this model; hybrid and gemma4 models, and MoE models with the router's
    weights on the experts' input, take the reference path."""
    if config.is_hybrid or uses_gemma4_blocks(config):
        return False
    return not (config.is_moe and config.expert_weights_before)


def _check_q8_0_cache(config: ModelConfig) -> None:
    """Raise ValueError where a q8_0 KV cache cannot hold this model's keys and values."""
    if not runs_in_c_decoder(config):
        raise ValueError("a q8_0 KV cache needs the fused C decoder, which does not run this model yet "
                         "(hybrid and gemma4 models keep a float32 cache)")
    if config.head_dim % Q8_0_BLOCK or config.v_head_dim % Q8_0_BLOCK:
        raise ValueError(f"a q8_0 KV cache needs head dimensions that are multiples of {Q8_0_BLOCK}; this model's "
                         f"are {config.head_dim} and {config.v_head_dim}")


class CpuBackend(NumpyBackend):
    """The C decoder: one call per prompt chunk or decode step, for one sequence or a batch of them.

    Args:
        gguf: the open model file (its memory map backs every weight).
        config: the model's hyper-parameters.
        kv_dtype: element type of the KV caches this backend makes: float16 or float32 (as NumPy dtypes or
            ``"f16"``/``"f32"``), or ``"q8_0"`` (opt-in: llama.cpp's 8-bit blocks, 47 % less memory than float16;
            fused C decoder only, head dimensions multiples of 32).
        n_ctx: the context size the model is loaded for (LongRoPE models choose their factors by it; see
            ``rope.rope_tables``). None: within the model's original context.
    """

    name = "cpu"

    def __init__(self, gguf: GGUFFile, config: ModelConfig, kv_dtype=DEFAULT_KV_DTYPE, n_ctx: int | None = None):
        super().__init__(gguf, config, n_ctx)
        self.kv_type = kv_type_name(kv_dtype)  # "f16", "f32" or "q8_0"
        self.decoder: CpuDecoder | None = None  # None: the reference path (see runs_in_c_decoder)
        if self.kv_type == "q8_0":
            _check_q8_0_cache(config)
        if runs_in_c_decoder(config):
            self.decoder = CpuDecoder(config, self.layers, (self.token_embd, int(self.token_embd_type)), self.output,
                                      self.output_norm, self.rope_inv_freq, self.rope_layer_set,
                                      release=self.gguf.release)
        self._caches: weakref.WeakSet[CpuKVCache | NumpyKVCache] = weakref.WeakSet()

    # -- weights: packed views, and the products the reference path uses ------------------------------
    def load_matrix(self, name: str) -> PackedMatrix:
        qtype = int(self.gguf.tensor(name).qtype)
        if qtype not in kernels.SUPPORTED_TYPES:
            raise ModelFormatError(f"tensor {name!r} has type {self.gguf.tensor(name).qtype.name}, "
                                   "which the CPU kernels do not support")
        return PackedMatrix(self.gguf.raw(name), qtype)

    def matrix_rows(self, matrix: PackedMatrix, rows: slice) -> PackedMatrix:
        """A fused tensor's part: a row range of the packed rows (a view, nothing copied)."""
        return PackedMatrix(matrix.blocks[rows], matrix.qtype)

    def matmul(self, x: np.ndarray, w: PackedMatrix) -> np.ndarray:
        return kernels.matmul(w.blocks, w.qtype, np.ascontiguousarray(x, dtype=np.float32))

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        self._token_ids(tokens)
        rows = kernels.get_rows(self.token_embd, int(self.token_embd_type), tokens)
        if self.config.embed_scale != 1.0:
            rows *= np.float32(self.config.embed_scale)
        return rows

    # -- the decoder ---------------------------------------------------------------------------------
    def new_cache(self, n_ctx: int) -> CpuKVCache | NumpyKVCache:
        if self.decoder is None:
            cache = NumpyBackend.new_cache(self, n_ctx)
        else:
            cache = CpuKVCache(self.config, n_ctx, self.kv_type)
        self._caches.add(cache)
        return cache

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        if self.decoder is None:
            return NumpyBackend.forward(self, tokens, cache, all_logits)
        ids = self._token_ids(tokens)
        if ids.size == 0:
            raise ValueError("forward needs at least one token")
        cache = self._own(cache)
        cache.reserve(ids.size)
        return self.decoder.forward(ids, cache, all_logits)

    def forward_batch(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> np.ndarray:
        """One decode step for B sequences in one C call: the weights are read once for all B rows."""
        if self.decoder is None:
            return NumpyBackend.forward_batch(self, tokens, caches)
        ids = self._token_ids(tokens)
        if ids.size == 0 or ids.size != len(caches):
            raise ValueError(f"forward_batch needs one token per cache, got {ids.size} tokens for {len(caches)} caches")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("forward_batch got the same cache twice")
        owned = [self._own(c) for c in caches]
        for cache in owned:
            cache.reserve(1)
        return self.decoder.forward_batch(ids, owned)

    def reference_forward(self, tokens: Sequence[int], cache: NumpyKVCache, all_logits: bool = False) -> np.ndarray:
        """The NumPy reference decoder with this backend's C products, on a ``NumpyKVCache`` (for tests)."""
        return NumpyBackend.forward(self, tokens, cache, all_logits)

    def _token_ids(self, tokens) -> np.ndarray:
        """int32 ids, checked against the vocabulary before the narrowing."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.n_vocab):
            raise ValueError(f"token id out of range 0..{self.config.n_vocab - 1}")
        return ids.astype(np.int32)

    @staticmethod
    def _own(cache: KVCache) -> CpuKVCache:
        if not isinstance(cache, CpuKVCache):
            raise TypeError(f"the CPU backend runs on caches from its new_cache, got {type(cache).__name__}")
        return cache

    def memory(self) -> MemoryStats:
        weights = self.gguf.file_size
        return MemoryStats(weights_bytes=weights, kv_cache_bytes=sum(c.nbytes for c in self._caches),
                           scratch_bytes=0 if self.decoder is None else self.decoder.scratch_bytes,
                           active_weights_bytes=round(weights * active_weight_fraction(self.gguf, self.config)))

    def close(self) -> None:
        super().close()
        if self.decoder is not None:
            self.decoder.close()
