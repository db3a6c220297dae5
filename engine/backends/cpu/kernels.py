"""Matrix products computed directly on packed GGUF blocks by the C extension, with a NumPy fallback.

The extension quantizes the activations once per product (8-bit blocks of 32 for the legacy types, IQ4_NL and
MXFP4; of 256 for the K, ternary, IQ4_XS and IQ2 / IQ3 types) and runs integer dot products on the best
instruction set of this CPU, chosen at run time. ``HEARTH_CPU_ISA`` forces one: ``scalar``, ``avx2``, ``avxvnni``, ``avx512`` (x86-64), ``neon``,
``dotprod`` (arm64) -- an ISA this CPU cannot run is an error -- or ``numpy`` to leave the extension
unloaded as if it had not been built.
"""

from __future__ import annotations

import os

import numpy as np
import psutil
from ...ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType

ISA_ENV = "HEARTH_CPU_ISA"

_T = GGMLQuantizationType
SUPPORTED_TYPES: frozenset[int] = frozenset(int(t) for t in (
    _T.F32, _T.F16, _T.BF16, _T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0,
    _T.Q2_K, _T.Q3_K, _T.Q4_K, _T.Q5_K, _T.Q6_K, _T.TQ1_0, _T.TQ2_0,
    _T.IQ4_NL, _T.IQ4_XS, _T.MXFP4, _T.IQ2_XXS, _T.IQ2_XS, _T.IQ2_S, _T.IQ3_XXS, _T.IQ3_S,
))
FEATURE_NAMES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16", "avxvnni",
                 "neon", "dotprod")


def _load_extension():
    """The C extension with the requested ISA selected, or None for the NumPy fallback."""
    requested = os.environ.get(ISA_ENV, "").strip().lower() or "auto"
    if requested == "numpy":
        return None
    try:
        from . import _kernels
    except ImportError:
        return None
    _kernels.set_isa(requested)  # ValueError names the ISAs this CPU runs
    return _kernels


def default_threads() -> int:
    """Physical cores: a second hyper-thread per core adds no memory bandwidth to a matrix-vector product."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


_ext = _load_extension()
AVAILABLE: bool = _ext is not None
_fallback_threads = default_threads()  # recorded only: the fallback leaves threading to NumPy


def cpu_features() -> dict[str, bool]:
    """The SIMD features of this CPU that the kernels can use (all False without the extension)."""
    if _ext is None:
        return dict.fromkeys(FEATURE_NAMES, False)
    return _ext.cpu_features()


def active_isa() -> str:
    """The instruction set the products run on: ``scalar``, ``avx2``, ``avxvnni``, ``avx512``, ``neon``,
    ``dotprod``, or ``numpy`` without the extension."""
    return _ext.isa() if _ext is not None else "numpy"


def set_threads(n: int) -> None:
    """Use n threads in all (the calling thread included) for every later product.

    Raises:
        ValueError: n is below 1 or above the pool's limit.
    """
    global _fallback_threads
    if _ext is None:
        if n < 1:
            raise ValueError(f"threads must be at least 1, got {n}")
        _fallback_threads = n
    else:
        _ext.set_threads(n)


def get_threads() -> int:
    return _ext.get_threads() if _ext is not None else _fallback_threads


def stream_prefetch(ahead: int | None = None) -> int:
    """Bytes ahead of the block being read that a one-token product over a repacked (16-row) matrix prefetches
    its stream into L1 (and four times as far into L2), 0 for none; with ``ahead``, set it first. The default
    comes from the CPU: a page on Intel cores, whose hardware prefetcher does not keep up with the stream alone,
    none elsewhere. Results do not depend on it.

    Raises:
        ValueError: ahead is negative, not a multiple of 64, or over 1 MiB.
    """
    if _ext is None:
        return 0
    return _ext.stream_prefetch() if ahead is None else _ext.stream_prefetch(int(ahead))


def read_words(buf) -> int:
    """The sum of a buffer's 64-bit words (a whole number of them), modulo 2**64, read front to back the way a
    one-token product reads a repacked matrix (prefetched as ``stream_prefetch`` says); the GIL is released.
    A bare read loop, for measuring read bandwidth (``python -m engine bench bandwidth``).

    Raises:
        RuntimeError: the C extension is not built.
        ValueError: the buffer is not a whole number of 64-bit words.
    """
    if _ext is None:
        raise RuntimeError("read_words needs the C kernels")
    return _ext.read_words(buf)


def row_elements(qtype: int, row_bytes: int) -> int:
    """Elements in a packed row of row_bytes bytes."""
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    return row_bytes // type_size * block


def matmul(w: np.ndarray, qtype: int, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x @ W.T for W given as packed GGUF rows, without dequantizing W.

    Args:
        w: uint8 (rows, row_bytes), each row whole blocks of qtype (a view into the model's memory map), or
            a ``repack16`` copy.
        qtype: the GGML type id of the blocks, one of SUPPORTED_TYPES, or the id ``repack16`` gave.
        x: float32 (n, cols), C-contiguous.
        out: optional float32 (n, rows), C-contiguous, written in place (no allocation); not sharing
            memory with x.

    Returns:
        float32 (n, rows); ``out`` when given.

    Raises:
        ValueError: an unsupported type or mismatched shapes.
    """
    if _ext is not None:
        return _ext.matmul(w, int(qtype), x, out)
    return _numpy_matmul(w, qtype, x, out)


def repack16_type(qtype: int, rows: int) -> int | None:
    """The internal type id ``repack16`` gives a matrix of ``rows`` rows of ``qtype``, or None where it would not
    pay: a type or instruction set without 16-row kernels for it, rows not a multiple of 16, no extension."""
    if _ext is None or rows <= 0 or rows % 16:
        return None
    r16 = _ext.repack_type(int(qtype))
    return None if r16 < 0 else r16


def repack16(w: np.ndarray, qtype: int, out: np.ndarray | None = None) -> tuple[np.ndarray, int] | None:
    """W copied into the 16-row layout of the active instruction set, for the products alone.

    Q4_0, IQ4_NL, Q4_K, Q8_0 and Q6_K under AVX-512: each group of 16 rows is stored block by block with the rows'
    scales and codes already in vector lanes (csrc/hk.h), which the 16-row kernels load as they are instead of
    transposing 16 rows' bytes for every block. Same size and shape as ``w``; its products are the same bits
    as ``w``'s, and ``get_rows`` reads a row back from its group.

    Args:
        out: where to write it (a writeable C-contiguous uint8 array of w's shape); None: a new array.

    Returns:
        (the copy, its internal type id for ``matmul``), or None where ``repack16_type`` is None.
    """
    if repack16_type(qtype, w.shape[0]) is None:
        return None
    return _ext.repack16(w, int(qtype), out)


def get_rows(w: np.ndarray, qtype: int, ids) -> np.ndarray:
    """Dequantized rows ``ids`` of W (an embedding look-up).

    Args:
        w: uint8 (rows, row_bytes) packed rows of qtype.
        qtype: the GGML type id; one of SUPPORTED_TYPES.
        ids: integer row ids, a scalar or 1-D.

    Returns:
        float32 (n, cols).

    Raises:
        IndexError: an id outside [0, rows).
    """
    ids = np.asarray(ids).reshape(-1)
    if _ext is not None:
        return _ext.get_rows(w, int(qtype), ids)
    _check_type(qtype)
    if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
        raise IndexError(f"row ids must be in [0, {w.shape[0]})")
    return _dequantize_rows(w[ids], qtype)


def _check_type(qtype: int) -> None:
    if int(qtype) not in SUPPORTED_TYPES:
        raise ValueError(f"GGML type {int(qtype)} is not supported by the CPU kernels")


def _dequantize_rows(w: np.ndarray, qtype: int) -> np.ndarray:
    qtype = GGMLQuantizationType(int(qtype))
    if w.shape[0] == 0:  # gguf's dequantizers cannot reshape zero blocks
        return np.zeros((0, row_elements(qtype, w.shape[1])), np.float32)
    if qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(w).view(np.float32).copy()
    from gguf.quants import dequantize  # the NumPy fallback only: the package is large to import

    return dequantize(np.ascontiguousarray(w), qtype).astype(np.float32, copy=False)


def _numpy_matmul(w: np.ndarray, qtype: int, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    _check_type(qtype)
    type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(qtype))][1]
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] % type_size:
        raise ValueError(f"w must be a uint8 array (rows, row_bytes) of whole {type_size}-byte blocks")
    cols = row_elements(qtype, w.shape[1])
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"x must be a C-contiguous float32 array (n, {cols})")
    result = x @ _dequantize_rows(w, qtype).T
    if out is None:
        return result
    if out.dtype != np.float32 or out.shape != result.shape:
        raise ValueError(f"out must be a writeable C-contiguous float32 array {result.shape}")
    if np.shares_memory(out, x):
        raise ValueError("out must not share memory with x")
    out[...] = result
    return out


if _ext is not None:
    set_threads(default_threads())
