"""How much memory a GGUF model will take once loaded, and whether that fits in this machine's memory.

The estimate has three parts:

* **weights** — all resident, also a sparse model's every expert; ``active_weights_bytes`` is what one decode
  step reads (``active_weight_fraction``), the memory traffic that bounds decode speed. On the CPU backend the
  weights are pages of the memory-mapped file (``mapped_bytes``): the OS page cache holds them, so a file larger
  than the free memory still runs (pages are read from disk again as they are needed, and decoding slows down);
  ``fit_verdict`` calls that ``"paged"``. Per backend (``weights_bytes``): the CPU backend memory-maps the GGUF and computes on the
  quantized blocks, so once every page has been touched the resident weights are exactly the tensor bytes
  (the alignment padding between tensors is a few KiB in total); the NumPy backend dequantizes every matrix
  to float32 (the token embedding stays packed, plus a float32 copy when it is also the output) and keeps the
  file mapped, its pages resident once read for that; the MLX
  backend's figure comes from its own loader (``engine/backends/mlx/weights.py``). All three read the
  tensor table only, so a header without tensor data (``GGUFHeader``) is enough.
* **KV cache** — keys and values for ``n_ctx`` positions in every layer, as the backend stores them
  (``KV_LAYOUTS``): the CPU backend keeps float16 by default, or the opt-in ``kv_type`` (float32, or q8_0 blocks
  of 34 bytes per 32 elements: ``KV_TYPE_ELEMENT_BYTES``), and float32 for the models it runs on the reference
  path (``cpu_backend.runs_in_c_decoder``); it gives a sliding-window layer (Gemma 3) the full
  ``n_ctx`` like any other; a backend with rings (MLX) keeps only a ring there, as long as its cache module
  says (``engine/backends/mlx/kv_cache.py``: the window plus one prefill chunk).
* **overhead** — a runtime baseline plus scratch, per backend:

  - runtime baseline: the parsed metadata (tokenizer vocabulary and merges packed into UTF-8 buffers, scores
    and token types as arrays; the reader drops the header's pages once parsed), plus ``RUNTIME_BASELINE_BYTES``
    for what loading a model adds besides (the backend's code and C extension, its thread pool, the tokenizer's
    tables), measured on the three test models.
  - scratch of the CPU backend's fused C decoder: its arena, allocated once for ``MAX_ROWS`` rows (float32
    activations, quantized activations of the widest input, the attention's per-row partial states; for a
    mixture-of-experts model each (row, chosen expert) pair's hidden state, output and activations) and one
    row of logits; its attention runs in online-softmax blocks, so nothing grows with ``n_ctx``.
  - scratch of the NumPy backend (and of the CPU backend's reference path): the
    activations of one ``PREFILL_CHUNK``, and at the peak the attention scores of every head for that chunk over
    ``n_ctx`` positions twice (the scores and the masked copy) with the mask and its index arrays.
  - MLX: the NumPy-style activations of one micro-batch and one head's scores over ``n_ctx`` (not validated
    against a measured MLX load).
"""

from __future__ import annotations

import dataclasses
import platform
import sys
from collections.abc import Callable
from typing import Literal

import numpy as np
import psutil

from .config import ModelConfig
from .deltanet import recurrent_state_bytes
from .gguf_file import GGUFFile
from .hybrid_cache import MAX_ANCHORS, ROLLBACK_TOKENS
from .packed_strings import PackedStrings

# a hybrid sequence's recurrent states at their most: the live one, the prompt anchors, and what a short call (a
# speculative verify pass, a short message) keeps until the next call (engine.hybrid_cache): the state before it
# and after each of its tokens but the last (that one is the live state); about 60 MB each on a real
# Qwen3.5-35B-A3B
RECURRENT_STATE_COPIES = 1 + MAX_ANCHORS + ROLLBACK_TOKENS
MICRO_BATCH = 512  # tokens per prefill step assumed for the scratch buffers (NumPy's PREFILL_CHUNK, MLX)
FLOAT32_BYTES = 4
# What a load adds besides weights, KV cache, metadata and scratch (the backend's modules and C extension, the
# thread pool, the tokenizer's tables): 10-16 MiB measured on SmolLM2, Gemma 3 and Qwen2.5 (CPU backend, Linux
# x86-64, tests/app/models/measure_memory.py)
RUNTIME_BASELINE_BYTES = 12 << 20

# Fit thresholds, as fractions of the memory available now. The estimate is validated to within 8 % of the
# measured load, and the rest of the system keeps growing while a model runs: "fits" keeps 25 % in reserve,
# "tight" means it should load but may push other programs into swap; "paged" means only the memory-mapped
# weights do not fit: they stay in the file and the OS page cache reads them in as decoding needs them (it
# runs, more slowly: each token waits on the disk for the pages that were evicted).
FITS_FRACTION = 0.75
TIGHT_FRACTION = 1.0

Verdict = Literal["fits", "tight", "paged", "won't fit"]


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """How a backend stores its KV cache (tests/app/models/test_memory_estimate.py checks these on real caches)."""

    element_bytes: float  # 2 for float16, 4 for float32, 34 / 32 for q8_0
    sliding_rings: bool  # a sliding-window layer keeps only its window; without, every layer holds n_ctx
    ring_slots: Callable[[ModelConfig, int], int] | None = None  # (config, n_ctx) -> slots of a ring, if not the window


KV_LAYOUTS = {"cpu": KVLayout(element_bytes=2, sliding_rings=False), "numpy": KVLayout(element_bytes=4, sliding_rings=False)}
BACKENDS = ("cpu", "numpy", "mlx")  # the backends whose memory is modelled
KV_TYPE_ELEMENT_BYTES = {"f16": 2, "f32": 4, "q8_0": 34 / 32}  # the CPU backend's kv_type choices
MAPPED_BACKENDS = ("cpu",)  # compute on the memory-mapped file's pages (the others copy the weights)


def kv_layout(backend: str) -> KVLayout:
    """How ``backend`` stores its KV cache; for MLX the element type is its device's default matmul dtype (it needs mlx;
    ``estimate_memory`` takes the model's own compute dtype instead).

    Raises:
        ValueError: a backend whose memory is not modelled.
        ImportError: ``"mlx"`` without the mlx package.
    """
    if backend == "mlx":
        from .backends.mlx.kv_cache import sliding_slots
        from .backends.mlx.weights import default_matmul_dtype

        return KVLayout(element_bytes=default_matmul_dtype().size, sliding_rings=True, ring_slots=sliding_slots)
    layout = KV_LAYOUTS.get(backend)
    if layout is None:
        raise ValueError(f"the memory of the {backend!r} backend is not modelled; only {', '.join(BACKENDS)} are")
    return layout


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a loaded model is expected to hold, by part."""

    weights_bytes: int
    kv_cache_bytes: int
    overhead_bytes: int
    active_weights_bytes: int = 0  # weight bytes one decode step reads (a sparse model: its chosen experts only)
    mapped_bytes: int = 0  # weight bytes that are pages of the memory-mapped file (the OS page cache holds them)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.overhead_bytes


@dataclasses.dataclass(frozen=True)
class SystemMemory:
    """Physical memory of this machine. ``unified`` is True on Apple Silicon, where the GPU shares it."""

    total_bytes: int
    available_bytes: int
    unified: bool


def estimate_memory(gguf: GGUFFile, n_ctx: int, backend: str = "cpu", kv_type: str | None = None) -> MemoryEstimate:
    """Estimate the memory of ``gguf`` loaded on ``backend`` with a context of ``n_ctx`` positions.

    Args:
        gguf: A parsed GGUF file (``read_gguf``) or its header alone (``GGUFHeader``).
        n_ctx: Context length the model will be run with.
        backend: ``"cpu"`` (memory-mapped quantized weights, float16 KV cache), ``"numpy"`` (float32 matrices,
            float32 KV) or ``"mlx"`` (the MLX loader's repacked weights, KV in the model's compute dtype on this machine's
            MLX device — ``mlx_compute.choose_for_file`` — and sliding rings).
        kv_type: the CPU backend's KV element type (``"f16"``, ``"f32"``, ``"q8_0"``); None: its default.

    Returns:
        The estimate, split into weights, KV cache and overhead.

    Raises:
        ValueError: for a non-positive ``n_ctx``, a backend whose memory is not modelled, or a ``kv_type`` other
            than the CPU backend's choices (or on another backend).
        ImportError: ``"mlx"`` without the mlx package.
        ModelFormatError: when the file's metadata does not describe a supported model.
    """
    layout = kv_layout(backend)
    if kv_type is not None:
        if backend != "cpu" or kv_type not in KV_TYPE_ELEMENT_BYTES:
            raise ValueError(f"KV type {kv_type!r} on the {backend} backend is not an option (the cpu backend "
                             f"takes {', '.join(KV_TYPE_ELEMENT_BYTES)})")
        layout = dataclasses.replace(layout, element_bytes=KV_TYPE_ELEMENT_BYTES[kv_type])
    if n_ctx <= 0:
        raise ValueError(f"n_ctx must be positive, got {n_ctx}")
    config = ModelConfig.from_gguf(gguf)
    if backend == "mlx":  # this model's compute dtype on this machine's MLX device, which its KV cache is kept in
        from .backends import platform_mlx
        from .backends.mlx_compute import DTYPE_BYTES, choose_for_file

        compute = choose_for_file(gguf, config, platform_mlx.default_device_is_gpu())
        layout = dataclasses.replace(layout, element_bytes=DTYPE_BYTES[compute.name])
    scratch_backend = backend
    if backend == "cpu":
        from .backends.cpu_backend import runs_in_c_decoder
        if not runs_in_c_decoder(config):  # the CPU backend's reference path: NumPy's float32 cache and scratch
            layout, scratch_backend = KV_LAYOUTS["numpy"], "numpy"
    weights = weights_bytes(gguf, backend)
    return MemoryEstimate(
        weights_bytes=weights,
        active_weights_bytes=round(weights * active_weight_fraction(gguf, config)),
        mapped_bytes=weights if backend in MAPPED_BACKENDS else 0,
        kv_cache_bytes=kv_cache_bytes(config, n_ctx, layout.element_bytes, layout.sliding_rings,
                                      layout.ring_slots(config, n_ctx) if layout.ring_slots else None)
        + recurrent_state_bytes(config, RECURRENT_STATE_COPIES),
        overhead_bytes=metadata_bytes(gguf) + RUNTIME_BASELINE_BYTES + scratch_bytes(config, n_ctx, scratch_backend),
    )


def weights_bytes(gguf: GGUFFile, backend: str = "cpu") -> int:
    """Bytes ``backend`` holds for the weights: for ``"cpu"`` all tensors as stored (memory-mapped, resident
    once touched), for ``"numpy"`` see ``numpy_weight_bytes``, for ``"mlx"`` the MLX loader's own figure."""
    if backend == "numpy":
        return numpy_weight_bytes(gguf)
    if backend == "mlx":
        from .backends.mlx.weights import mlx_weight_bytes

        return mlx_weight_bytes(gguf)
    return sum(t.nbytes for t in gguf.tensors.values())


EXPERT_TENSOR_SUFFIXES = (".ffn_gate_exps.weight", ".ffn_up_exps.weight", ".ffn_down_exps.weight")


def active_weight_fraction(gguf: GGUFFile, config: ModelConfig) -> float:
    """The share of the stored weight bytes one decode step reads: 1 for a dense model; for a mixture of experts,
    every tensor but the expert tensors, of which only ``n_expert_used`` of ``n_expert`` experts' rows. All
    experts stay resident (mapped); this is the memory traffic per token that bounds decode speed. Backends that
    hold other forms (float32, MLX repacks) scale every tensor alike, so the stored share is theirs too."""
    total = sum(t.nbytes for t in gguf.tensors.values())
    if not config.is_moe or total == 0:
        return 1.0
    experts = sum(t.nbytes for t in gguf.tensors.values() if t.name.endswith(EXPERT_TENSOR_SUFFIXES))
    unread = experts * (1.0 - config.n_expert_used / config.n_expert)
    return (total - unread) / total


def numpy_weight_bytes(gguf: GGUFFile) -> int:
    """The NumPy backend's weights: every tensor as float32, except the token embedding, which it reads packed
    row by row (and dequantizes whole, as float32, only when it is also the output projection); plus the file
    itself, which stays memory-mapped and whose pages, read once to dequantize, stay resident until the system
    needs the memory back."""
    total = sum(t.nbytes for t in gguf.tensors.values())
    for info in gguf.tensors.values():
        if info.name == "token_embd.weight":
            total += FLOAT32_BYTES * info.n_elements if "output.weight" not in gguf.tensors else 0
        else:
            total += FLOAT32_BYTES * info.n_elements
    return total


def kv_cache_bytes(config: ModelConfig, n_ctx: int, bytes_per_element: float, sliding_rings: bool,
                   ring_slots: int | None = None) -> int:
    """Keys and values of every attention layer (a hybrid model's recurrent layers hold none); with
    ``sliding_rings`` a sliding-window layer holds at most ``ring_slots`` positions (by default ``sliding_window``)."""
    ring = config.sliding_window if ring_slots is None else ring_slots
    total = 0
    for layer in range(config.n_layers):  # head widths differ by layer kind in gemma4
        if config.is_recurrent(layer):
            continue
        per_position = config.layer_n_kv_heads(layer) * (config.layer_head_dim(layer) + config.layer_v_head_dim(layer))
        positions = min(n_ctx, ring) if sliding_rings and config.is_sliding(layer) else n_ctx
        total += positions * per_position * bytes_per_element
    return round(total)


def metadata_bytes(gguf: GGUFFile) -> int:
    """The parsed metadata as Python objects and arrays (the reader drops the header's pages once parsed)."""
    total = 0
    for value in gguf.metadata.values():
        if isinstance(value, PackedStrings):
            total += value.nbytes + sys.getsizeof(value)
        elif isinstance(value, np.ndarray):
            total += value.nbytes + sys.getsizeof(value[:0])
        else:
            total += sys.getsizeof(value)
    return total


def scratch_bytes(config: ModelConfig, n_ctx: int, backend: str = "cpu") -> int:
    """The working memory of a forward pass on ``backend`` (see the module docstring), at its peak."""
    if backend == "cpu":
        return cpu_decoder_scratch_bytes(config)
    if backend == "numpy":
        return numpy_scratch_bytes(config, n_ctx)
    return _activations_bytes(config, min(n_ctx, MICRO_BATCH)) + (min(n_ctx, MICRO_BATCH) * n_ctx
                                                                   + config.n_vocab) * FLOAT32_BYTES


def cpu_decoder_scratch_bytes(config: ModelConfig) -> int:
    """The fused C decoder's arena (``csrc/decoder.c`` ``layout``, ``attention.c`` prefill partials) for
    ``MAX_ROWS`` rows, and one row of logits."""
    from .backends.cpu.decoder import MAX_ROWS

    c, rows = config, MAX_ROWS
    n_ff = c.n_ff_shexp if c.is_moe and c.n_ff_shexp else c.n_ff  # as decoder.py: a MoE model's dense FFN width
    widest = max(c.n_embd, c.n_heads * c.v_head_dim, n_ff)
    rope_sets = len({c.layer_rope_base(layer) for layer in range(c.n_layers)})  # global, and sliding layers' own
    floats_per_row = (3 * c.n_embd + c.n_heads * c.head_dim + c.n_kv_heads * (c.head_dim + c.v_head_dim)
                      + c.n_heads * c.v_head_dim + 2 * n_ff  # x, h, o; q, k, v; attention output; gate, up
                      + c.rope_dim * rope_sets  # cos and sin of each row's position
                      + c.n_heads * (c.v_head_dim + 4) * 5 // 4)  # attention partials (m, l, O; M, L), grown by 1/4
    quantized_per_row = 2 * widest + widest * 25 // 64  # two activation kinds: int8 values plus block scales
    return (rows * (floats_per_row * FLOAT32_BYTES + quantized_per_row) + c.n_vocab * FLOAT32_BYTES
            + moe_scratch_bytes(c, rows))


ACT_DESCRIPTOR_BYTES = 40  # csrc hk_act: five pointers


def moe_scratch_bytes(config: ModelConfig, rows: int) -> int:
    """The C decoder's mixture-of-experts views (``csrc/moe.c`` ``hk_moe_layout``) for ``rows`` rows: per row the
    router's logits; per (row, chosen expert) pair its hidden state, up product and output (float32), its
    two int8 activation kinds with their block scales and the index and descriptor arrays."""
    c = config
    if not c.is_moe:
        return 0
    pairs, ff = rows * c.n_expert_used, c.n_ff_exp
    per_pair = ((2 * ff + c.n_embd) * FLOAT32_BYTES + 2 * ff + ff * 25 // 64  # the float32 kind points at hidden
                + 6 * ACT_DESCRIPTOR_BYTES + 4 * 4)
    return rows * (c.n_expert + 1) * FLOAT32_BYTES + pairs * per_pair


def numpy_scratch_bytes(config: ModelConfig, n_ctx: int) -> int:
    """The NumPy forward's peak: one chunk's activations, and its attention over ``n_ctx`` positions: the scores
    of every head twice (scores and the masked copy), the float32 mask, its boolean and int64 index arrays."""
    n = min(n_ctx, MICRO_BATCH)
    scores = 2 * config.n_heads * n * n_ctx * FLOAT32_BYTES
    mask = n * n_ctx * (FLOAT32_BYTES + 1 + 8)
    return _activations_bytes(config, n) + scores + mask + config.n_vocab * FLOAT32_BYTES


def _activations_bytes(config: ModelConfig, n: int) -> int:
    """Float32 activations of ``n`` tokens: hidden, residual and normed (3 × n_embd), q/k/v and the attention
    output, the FFN gate, up and product (3 × n_ff)."""
    c = config
    per_token = (3 * c.n_embd + c.n_heads * c.head_dim + c.n_kv_heads * (c.head_dim + c.v_head_dim)
                 + c.n_heads * c.v_head_dim + 3 * c.n_ff)
    return n * per_token * FLOAT32_BYTES


def fit_verdict(total_bytes: int, available_bytes: int, mapped_bytes: int = 0) -> Verdict:
    """``"fits"`` up to 75 % of the available memory, ``"tight"`` up to 100 %; past that ``"paged"`` when all
    but the ``mapped_bytes`` of memory-mapped weights fit (the page cache reads those from the file as needed:
    it runs, slower), else ``"won't fit"``."""
    if total_bytes <= FITS_FRACTION * available_bytes:
        return "fits"
    if total_bytes <= TIGHT_FRACTION * available_bytes:
        return "tight"
    if mapped_bytes and total_bytes - mapped_bytes <= TIGHT_FRACTION * available_bytes:
        return "paged"
    return "won't fit"


def paging_note(mapped_bytes: int, available_bytes: int) -> str:
    """What a ``"paged"`` verdict means, for people."""
    return (f"the memory-mapped weights ({mapped_bytes / 1e9:.1f} GB) are more than the free memory "
            f"({available_bytes / 1e9:.1f} GB): the OS page cache reads them from the file as they are needed, "
            "so the model runs, but decoding slows down to the speed of the disk")


def system_memory() -> SystemMemory:
    """Total and currently available physical memory (on Apple Silicon, the unified memory)."""
    vm = psutil.virtual_memory()
    unified = sys.platform == "darwin" and platform.machine() == "arm64"
    return SystemMemory(total_bytes=int(vm.total), available_bytes=int(vm.available), unified=unified)
