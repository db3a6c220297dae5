"""Repack GGUF quantized blocks into MLX affine quantization (``w = scale * q + bias`` per group of 32).

Every GGML type is rewritten, vectorised in NumPy, into MLX's packed layout: ``bits``-bit unsigned codes laid
out as a little-endian bit stream in uint32 words, one float16 scale and bias per group of 32 columns.

* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, TQ1_0, TQ2_0: the block is already affine over 32 (or 256) elements with a
  float16 scale: bit-exact.
* Q4_K, Q5_K: sub-blocks of 32 with 6-bit scale and min: exact up to rounding ``d * sc`` and ``dmin * m`` to
  float16 (relative error at most 2^-11 on each).
* Q6_K, Q3_K, Q2_K: sub-blocks of 16, which MLX cannot express (its smallest group is 32). Each group of 32
  (two sub-blocks) is requantized with 2 more bits than the source on the grid of its coarser sub-block, which
  that sub-block keeps exactly (up to float16 rounding); the finer sub-block is rounded to that grid, an error
  of at most 1/8 of the coarser sub-block's step. Groups whose two sub-blocks do not fit one grid fall back
  to min-max requantization over the group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from ...ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
GROUP = 32  # MLX group size used for every type: the largest group every GGML type can be cut into
DENSE_ITEMSIZE = {Q.F32: 4, Q.F16: 2, Q.BF16: 2}  # float types, kept as they are (not repacked)

# An unpacker turns blocks (n_blocks, type_size) uint8 into codes (n_blocks, block_elems) uint8 in
# [0, 2**bits) and float32 scales and biases (n_blocks, block_elems // GROUP).
Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Repack:
    """How one GGML type becomes MLX affine quantization."""

    bits: int
    exactness: str  # "exact", "fp16-scales" or "requantized": what the tests hold each type to
    unpack: Callable[[np.ndarray], Unpacked]
    zero_code: int | None = None  # the code of 0 when every bias is -zero_code * scale (None: biases are free)


@dataclasses.dataclass(frozen=True)
class AffineRows:
    """Rows of a matrix in MLX's quantized layout, as NumPy arrays ready for ``mx.array``."""

    packed: np.ndarray  # (rows, cols * bits // 32) uint32
    scales: np.ndarray  # (rows, cols // GROUP) float16
    biases: np.ndarray  # (rows, cols // GROUP) float16


def _f16(raw: np.ndarray) -> np.ndarray:
    """float16 fields (n, 2) uint8 -> (n, 1) float32."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes (..., k) -> 4-bit codes (..., 2k): the k low nibbles, then the k high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits_of(mask: np.ndarray, count: int) -> np.ndarray:
    """Bit ``i`` of each byte of ``mask`` (n, k) as (n, count, k) for i < count."""
    return (mask[:, None, :] >> np.arange(count, dtype=np.uint8)[None, :, None]) & 1


# -- blocks of 32 with one float16 scale: exact ----------------------------------------------------------
def _q4_0(b: np.ndarray) -> Unpacked:
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, None, 2:18])[:, 0], d, -8 * d


def _q4_1(b: np.ndarray) -> Unpacked:
    return _nibbles(b[:, None, 4:20])[:, 0], _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _five_bit(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    high = _bits_of(qh.reshape(-1, 4), 8).transpose(0, 2, 1).reshape(-1, 32)  # bit j of the uint32 -> element j
    return _nibbles(qs[:, None])[:, 0] | (high << 4)


def _q5_0(b: np.ndarray) -> Unpacked:
    d = _f16(b[:, 0:2])
    return _five_bit(b[:, 2:6], b[:, 6:22]), d, -16 * d


def _q5_1(b: np.ndarray) -> Unpacked:
    return _five_bit(b[:, 4:8], b[:, 8:24]), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q8_0(b: np.ndarray) -> Unpacked:
    d = _f16(b[:, 0:2])
    return b[:, 2:34] ^ np.uint8(0x80), d, -128 * d  # int8 + 128 as uint8


def _ternary(qtype: GGMLQuantizationType) -> Callable[[np.ndarray], Unpacked]:
    """TQ1_0 / TQ2_0: values d * {-1, 0, 1} with d the block's last two bytes; codes from the gguf dequantizer."""
    def unpack(b: np.ndarray) -> Unpacked:
        from gguf.quants import dequantize  # here: the gguf package costs every process about 6 MB resident

        d = _f16(b[:, -2:])  # (n, 1)
        values = dequantize(b, qtype).reshape(b.shape[0], -1)
        safe = np.where(d == 0, 1, d)
        codes = (np.rint(values / safe) + 1).clip(0, 3).astype(np.uint8)  # 3 (2d) is unused but representable
        groups = values.shape[1] // GROUP
        return codes, np.repeat(d, groups, axis=1), np.repeat(-d, groups, axis=1)
    return unpack


# -- K-quants with sub-blocks of 32: exact up to float16 scales ------------------------------------------
def _k_scales(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes of 6-bit scales and mins of Q4_K / Q5_K -> (n, 8) each."""
    d, m, hi = raw[:, 0:4], raw[:, 4:8], raw[:, 8:12]
    sc = np.concatenate([d & 0x3F, (hi & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (hi >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_affine(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sc, mn = _k_scales(b[:, 4:16])
    return _f16(b[:, 0:2]) * sc, -_f16(b[:, 2:4]) * mn


def _q4_k(b: np.ndarray) -> Unpacked:
    codes = _nibbles(b[:, 16:144].reshape(-1, 4, 32)).reshape(-1, 256)  # sub-blocks 2g, 2g+1 share 32 bytes
    return (codes, *_k_affine(b))


def _q5_k(b: np.ndarray) -> Unpacked:
    low = _nibbles(b[:, 48:176].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    high = _bits_of(b[:, 16:48], 8)  # bit s of qh[l] is the high bit of element l of sub-block s
    return ((low | (high << 4)).reshape(-1, 256), *_k_affine(b))


# -- K-quants with sub-blocks of 16: requantized to groups of 32 -----------------------------------------
def _q6_k_sub(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K -> codes (n, 16, 16) in 0..63, sub-block scales (n, 16) and offsets (n, 16): w = s * q + o."""
    ql = b[:, 0:128].reshape(-1, 2, 64)
    low = np.stack([ql & 0x0F, ql >> 4], axis=2).reshape(-1, 2, 4, 32)  # half h, quarter j: nibbles of ql
    qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    codes = (low | ((qh & 3) << 4)).reshape(-1, 16, 16)
    s = _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32)
    return codes, s, -32 * s


def _q3_k_sub(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    raw = b[:, 96:108]
    low = np.concatenate([raw[:, 0:8] & 0x0F, raw[:, 0:8] >> 4], axis=1)
    high = (raw[:, 8:12][:, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, :, None]) & 3
    sc = (low | (high.reshape(-1, 16) << 4)).astype(np.float32) - 32
    ql = (b[:, None, 32:96].reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    hm = _bits_of(b[:, 0:32], 8).reshape(-1, 2, 4, 32)  # hmask bit (4h + j) of byte l
    codes = (ql | (hm << 2)).reshape(-1, 16, 16)  # 0..7; llama.cpp subtracts 4 where the mask bit is clear
    s = _f16(b[:, 108:110]) * sc
    return codes, s, -4 * s


def _q2_k_sub(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sc = b[:, 0:16]
    q = (b[:, 16:80].reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    s = _f16(b[:, 80:82]) * (sc & 0x0F).astype(np.float32)
    return q.reshape(-1, 16, 16), s, -_f16(b[:, 82:84]) * (sc >> 4).astype(np.float32)


def _requantize(sub: Callable, src_bits: int, bits: int) -> Callable[[np.ndarray], Unpacked]:
    """Pairs of 16-element sub-blocks (w = s * q + o) -> ``bits``-bit groups of 32 on the coarser one's grid."""
    def unpack(b: np.ndarray) -> Unpacked:
        codes, s, o = sub(b)
        values = s[..., None] * codes.astype(np.float32) + o[..., None]  # (n, 16, 16)
        values = values.reshape(-1, 2, 16)  # (n * 8, 2, 16): two sub-blocks per group of 32
        s, o = s.reshape(-1, 2), o.reshape(-1, 2)
        coarse = np.take_along_axis(np.abs(s), np.abs(s).argmax(axis=1)[:, None], axis=1)
        offset = np.take_along_axis(o, np.abs(s).argmax(axis=1)[:, None], axis=1)
        step = (coarse / (1 << (bits - src_bits))).astype(np.float16).astype(np.float32)
        lo, hi = values.min(axis=(1, 2))[:, None], values.max(axis=(1, 2))[:, None]
        safe = np.where(step == 0, 1, step)
        bias = (offset + safe * np.floor((lo - offset) / safe)).astype(np.float16).astype(np.float32)
        levels = (1 << bits) - 1
        misfit = ~(hi - bias <= (levels + 0.5) * step)  # the finer sub-block reaches past the coarse grid
        minmax = ((hi - lo) / levels).astype(np.float16).astype(np.float32)
        step = np.where(misfit, minmax, step)
        bias = np.where(misfit, lo.astype(np.float16).astype(np.float32), bias)
        safe = np.where(step == 0, 1, step)
        flat = values.reshape(-1, 32)
        q = np.rint((flat - bias) / safe).clip(0, levels).astype(np.uint8)
        return q.reshape(b.shape[0], 256), step.reshape(b.shape[0], 8), bias.reshape(b.shape[0], 8)
    return unpack


REPACKS: dict[GGMLQuantizationType, Repack] = {
    Q.Q4_0: Repack(4, "exact", _q4_0, zero_code=8),
    Q.Q4_1: Repack(4, "exact", _q4_1),
    Q.Q5_0: Repack(5, "exact", _q5_0, zero_code=16),
    Q.Q5_1: Repack(5, "exact", _q5_1),
    Q.Q8_0: Repack(8, "exact", _q8_0, zero_code=128),
    Q.TQ1_0: Repack(2, "exact", _ternary(Q.TQ1_0), zero_code=1),
    Q.TQ2_0: Repack(2, "exact", _ternary(Q.TQ2_0), zero_code=1),
    Q.Q4_K: Repack(4, "fp16-scales", _q4_k),
    Q.Q5_K: Repack(5, "fp16-scales", _q5_k),
    Q.Q6_K: Repack(8, "requantized", _requantize(_q6_k_sub, 6, 8)),
    Q.Q3_K: Repack(5, "requantized", _requantize(_q3_k_sub, 3, 5)),
    Q.Q2_K: Repack(4, "requantized", _requantize(_q2_k_sub, 2, 4)),
}


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (rows, cols) uint8 < 2**bits -> MLX's packed words (rows, cols * bits // 32) uint32.

    Element ``i`` of a row occupies bits ``[i * bits, (i + 1) * bits)`` of the row's little-endian bit stream.
    """
    rows, cols = codes.shape
    if bits == 8:
        return np.ascontiguousarray(codes).view(np.uint32)
    per_byte = 8 // bits if 8 % bits == 0 else 0
    if per_byte:
        parts = codes.reshape(rows, cols // per_byte, per_byte)
        packed = np.zeros((rows, cols // per_byte), np.uint8)
        for j in range(per_byte):
            packed |= parts[..., j] << np.uint8(j * bits)
        return packed.view(np.uint32)
    eights = codes.reshape(rows, cols // 8, 8)  # 8 codes fill exactly ``bits`` bytes
    word = np.zeros((rows, cols // 8), np.uint64)
    for j in range(8):  # widened one code column at a time: a uint64 copy of every code would be 8x the codes
        word |= eights[..., j].astype(np.uint64) << np.uint64(j * bits)
    stream = word.view(np.uint8).reshape(rows, cols // 8, 8)[..., :bits]
    return np.ascontiguousarray(stream).reshape(rows, cols * bits // 8).view(np.uint32)


def repack_rows(blocks: np.ndarray, qtype: GGMLQuantizationType) -> AffineRows:
    """Rows of packed GGUF blocks (rows, row_bytes) uint8 -> the same rows in MLX affine form.

    Raises ValueError for a type with no MLX form (dense types are not quantized; use them as they are).
    """
    if qtype not in REPACKS:
        raise ValueError(f"GGML type {qtype.name} has no MLX quantized form")
    repack = REPACKS[qtype]
    block_elems, type_size = GGML_QUANT_SIZES[qtype]
    rows = blocks.shape[0]
    cols = blocks.shape[1] // type_size * block_elems
    codes, scales, biases = repack.unpack(np.ascontiguousarray(blocks).reshape(-1, type_size))
    return AffineRows(
        packed=pack_codes(codes.reshape(rows, cols), repack.bits),
        scales=scales.reshape(rows, cols // GROUP).astype(np.float16),
        biases=biases.reshape(rows, cols // GROUP).astype(np.float16),
    )
