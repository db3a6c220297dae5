"""Repack GGUF quantized blocks into MLX layouts that hold the same weights, exactly (no requantization).

Every GGML type is rewritten, vectorised in NumPy, into one of these layouts:

* ``affine``: MLX's packed quantization, ``bits``-bit unsigned codes as a little-endian bit stream in uint32
  words, one float16 scale (and bias) per group of 32 columns: ``w = scale * code + bias``.
* ``mxfp4`` and ``nvfp4``: MLX's microscaling modes (E2M1 codes with an E8M0 scale per 32, or an E4M3 scale per
  16), which is what GGUF's MXFP4 and NVFP4 are.
* ``pairs``, for a type whose scales change every 16 elements, which no MLX group can express: two symmetric
  affine terms per row, the first with the even 16-element sub-blocks of each group of 32 (the odd ones set to
  the code of 0), the second with the odd ones, summed after the product; for Q2_K also per-16 offsets applied
  to the 16-element sums of the input. Scales and offsets stay factored as the file has them (a small integer
  per 16 times the super-block's float16) and are multiplied out in the product's dtype at each product.
* ``dense``: float16 values.

"Exact" below means bit for bit (pairs: in float32 products and row lookups; a float16 product rounds its
scales, as it does every type's). "fp16 scales" means exact up to rounding a product of the block's scales to
float16: where the bias is a multiple of the scale (all but Q4_K and Q5_K) each weight is within 2^-11 of its
own magnitude, else within 2^-11 of its scale and bias terms. "fp16 values": each weight rounded to float16.
Memory is in bits per weight, in MLX against the GGUF file (``mlx_bytes``):

=======  ========  ==============================================  ===========  =====  ====
type     layout    codes                                           exactness    MLX    file
=======  ========  ==============================================  ===========  =====  ====
Q4_0     affine    4-bit, bias -8 scale made at each product       exact        4.5    4.5
Q4_1     affine    4-bit, scale and bias                           exact        5      5
Q5_0     affine    5-bit, bias -16 scale made at each product      exact        5.5    5.5
Q5_1     affine    5-bit, scale and bias                           exact        6      6
Q8_0     affine    int8 + 128, bias -128 scale                     exact        8.5    8.5
TQ1_0    affine    2-bit ternary, bias -scale                      exact        2.5    1.69
TQ2_0    affine    2-bit ternary, bias -scale                      exact        2.5    2.06
Q4_K     affine    4-bit, scale d*sc and bias -dmin*m per 32       fp16 scales  5      4.5
Q5_K     affine    5-bit, scale d*sc and bias -dmin*m per 32       fp16 scales  6      5.5
Q6_K     pairs     6-bit, scale d*sc per 16, zero code 32          exact        12.56  6.56
Q3_K     pairs     3-bit, scale d*(sc-32) per 16, zero code 4      exact        6.56   3.44
Q2_K     pairs     2-bit, scale d*sc per 16, + offsets -dmin*m     exact        5.13   2.63
IQ4_NL   affine    int8 codebook value + 128, scale d              exact        8.5    4.5
IQ4_XS   affine    int8 codebook value + 128, scale d*(ls-32)      fp16 scales  8.5    4.25
MXFP4    mxfp4     E2M1 codes and E8M0 scales as stored            exact        4.25   4.25
IQ2_XXS  affine    grid value * sign + 128 (8-bit), per 32         fp16 scales  8.5    2.06
IQ3_XXS  affine    grid value * sign + 128 (8-bit), per 32         fp16 scales  8.5    3.06
IQ3_S    affine    grid value * sign + 16 (5-bit), per 32          fp16 scales  5.5    3.44
IQ1_S    affine    8 * (grid value + delta) + 16 (5-bit), per 32   fp16 scales  5.5    1.56
IQ2_XS   dense     float16 (scales per 16; 8-bit pairs: 17 bits)   fp16 values  16     2.31
IQ2_S    dense     float16 (scales per 16)                         fp16 values  16     2.56
IQ1_M    dense     float16 (scales per 16)                         fp16 values  16     1.75
NVFP4    nvfp4     E2M1 codes and E4M3 scales as ggml reads them   exact        4.5    4.5
=======  ========  ==============================================  ===========  =====  ====

Q6_K's products ``d * sc * (q - 32)`` span 14 bits and change scale every 16 elements, so one 8-bit group of
32 cannot hold them; two 6-bit terms (12.56 bits per weight) are cheaper than float16 (16). The grid types' codes
come from the gguf package's dequantizer divided by the group's scale (integers by construction).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from ...ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
GROUP = 32  # MLX group size used for every type: the largest group every GGML type can be cut into
SUB_BLOCK = 16  # the sub-block of the ``pairs`` layout
SUPER_BLOCK = 256  # the K-quants' block: one float16 d (and dmin) per 256
FP4_GROUP = {"mxfp4": 32, "nvfp4": 16}  # MLX's group (elements per scale byte) of its E2M1 modes
DENSE_ITEMSIZE = {Q.F32: 4, Q.F16: 2, Q.BF16: 2}  # float types, kept as they are (not repacked)


@dataclasses.dataclass(frozen=True)
class Repack:
    """How one GGML type becomes an MLX layout.

    ``unpack`` turns blocks (n_blocks, type_size) uint8 into, by layout:

    * affine: codes (n, block_elems) uint8 < 2**bits, float32 scales and biases (n, block_elems // GROUP);
    * mxfp4, nvfp4: codes (n, block_elems) uint8 < 16 and scale bytes (n, block_elems // 32 or 16) uint8;
    * pairs: codes (n, 256 // 16, 16) uint8 and integer scales (n, 16) with ``w = d * scale * (code -
      zero_code)``, float32 super-block scales d (n, 1), then integer offsets (n, 16) and float32 super-block
      offset factors (n, 1), added as ``factor * offset``, or two Nones;
    * dense: float32 values (n, block_elems).
    """

    layout: str  # "affine", "mxfp4", "nvfp4", "pairs" or "dense"
    bits: int  # bits per code (16 for dense float16)
    exactness: str  # "exact", "fp16-scales" or "fp16-values": what the tests hold each type to
    unpack: Callable[[np.ndarray], tuple]
    zero_code: int | None = None  # the code of 0 when every bias is -zero_code * scale (None: biases are free)
    offsets: bool = False  # pairs: a per-16 offset term (Q2_K's mins)

    def bytes_for(self, n_elements: int) -> int:
        """Bytes MLX holds for ``n_elements`` weights of this type (a whole number of GROUP-element rows)."""
        groups = n_elements // GROUP
        if self.layout == "affine":
            return n_elements * self.bits // 8 + groups * (2 if self.zero_code is not None else 4)
        if self.layout in FP4_GROUP:
            return n_elements // 2 + n_elements // FP4_GROUP[self.layout]
        if self.layout == "pairs":  # int8 per term and group, float16 per 256
            per_offsets = n_elements // SUB_BLOCK + n_elements // SUPER_BLOCK * 2
            return 2 * (n_elements * self.bits // 8 + groups) + n_elements // SUPER_BLOCK * 2 + (
                per_offsets if self.offsets else 0)
        return 2 * n_elements


@dataclasses.dataclass(frozen=True)
class AffineRows:
    """Rows of a matrix in MLX's affine layout, as NumPy arrays ready for ``mx.array``."""

    packed: np.ndarray  # (rows, cols * bits // 32) uint32
    scales: np.ndarray  # (rows, cols // GROUP) float16
    biases: np.ndarray  # (rows, cols // GROUP) float16


@dataclasses.dataclass(frozen=True)
class MxRows:
    """Rows in MLX's mxfp4 or nvfp4 layout."""

    packed: np.ndarray  # (rows, cols // 8) uint32
    scales: np.ndarray  # (rows, cols // 32) uint8 E8M0, or (rows, cols // 16) uint8 E4M3


@dataclasses.dataclass(frozen=True)
class PairRows:
    """Rows as two symmetric affine terms (even and odd 16-element sub-blocks) with factored scales, and
    optional per-16 offsets: term scale = ``super_scales * scale_ints``, offset = ``super_offsets * offset_ints``."""

    packed: np.ndarray  # (rows, 2, cols * bits // 32) uint32
    scale_ints: np.ndarray  # (rows, 2, cols // GROUP) int8
    super_scales: np.ndarray  # (rows, cols // 256) float16
    offset_ints: np.ndarray | None  # (rows, cols // 16) int8, or None
    super_offsets: np.ndarray | None  # (rows, cols // 256) float16, or None


@dataclasses.dataclass(frozen=True)
class DenseRows:
    """Rows as float16 values."""

    weight: np.ndarray  # (rows, cols) float16


Rows = AffineRows | MxRows | PairRows | DenseRows
Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray]


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



# -- K-quants with sub-blocks of 16: two terms per row ---------------------------------------------------
def _q6_k(b: np.ndarray) -> tuple:
    """Q6_K -> codes (n, 16, 16) in 0..63, sub-block scales (n, 16) and d (n, 1): w = d * sc * (q - 32)."""
    ql = b[:, 0:128].reshape(-1, 2, 64)
    low = np.stack([ql & 0x0F, ql >> 4], axis=2).reshape(-1, 2, 4, 32)  # half h, quarter j: nibbles of ql
    qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    codes = (low | ((qh & 3) << 4)).reshape(-1, 16, 16)
    return codes, b[:, 192:208].view(np.int8), _f16(b[:, 208:210]), None, None


def _q3_k(b: np.ndarray) -> tuple:
    """Q3_K -> codes (n, 16, 16) in 0..7, sub-block scales (n, 16) and d (n, 1): w = d * (sc - 32) * (q - 4)."""
    raw = b[:, 96:108]
    low = np.concatenate([raw[:, 0:8] & 0x0F, raw[:, 0:8] >> 4], axis=1)
    high = (raw[:, 8:12][:, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, :, None]) & 3
    sc = (low | (high.reshape(-1, 16) << 4)).astype(np.int8) - 32
    ql = (b[:, None, 32:96].reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    hm = _bits_of(b[:, 0:32], 8).reshape(-1, 2, 4, 32)  # hmask bit (4h + j) of byte l
    codes = (ql | (hm << 2)).reshape(-1, 16, 16)  # 0..7; llama.cpp subtracts 4 where the mask bit is clear
    return codes, sc, _f16(b[:, 108:110]), None, None


def _q2_k(b: np.ndarray) -> tuple:
    """Q2_K -> codes (n, 16, 16) in 0..3, sc and m (n, 16), d and -dmin (n, 1): w = d * sc * q - dmin * m."""
    sc = b[:, 0:16]
    q = (b[:, 16:80].reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    return q.reshape(-1, 16, 16), (sc & 0x0F).astype(np.int8), _f16(b[:, 80:82]), (sc >> 4).astype(np.int8), \
        -_f16(b[:, 82:84])


# -- IQ4 and MXFP4: a 16-entry codebook per 32 -----------------------------------------------------------
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int16)


def _iq4_nl(b: np.ndarray) -> Unpacked:
    d = _f16(b[:, 0:2])
    return (IQ4_VALUES[_nibbles(b[:, 2:18])] + 128).astype(np.uint8), d, -128 * d


def _iq4_xs(b: np.ndarray) -> Unpacked:
    d, high = _f16(b[:, 0:2]), np.ascontiguousarray(b[:, 2:4]).view(np.uint16)  # (n, 1) each
    low = np.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], axis=2).reshape(-1, 8)  # sub-block j: byte j // 2
    ls = (low | (((high >> (2 * np.arange(8, dtype=np.uint16))) & 3) << 4)).astype(np.float32) - 32  # (n, 8)
    codes = IQ4_VALUES[_nibbles(b[:, 8:136].reshape(-1, 8, 16))].reshape(-1, 256) + 128
    s = d * ls
    return codes.astype(np.uint8), s, -128 * s


def _nvfp4(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NVFP4 (4 sub-blocks of 16: scale bytes, then 8 bytes each, low nibbles first) -> codes and E4M3 scales.

    ggml reads a scale byte as unsigned E4M3 (the top bit ignored) with 0x7F as 0; MLX's E4M3 has a sign bit and
    0x7F as NaN, so the top bit is dropped and 0x7F becomes 0, which reads the same. 0xFF, which ggml reads as
    480 and MLX cannot hold, is refused (ggml's quantizer writes none of these bytes).
    """
    raw = b[:, 0:4]
    if (raw == 0xFF).any():
        raise ValueError("NVFP4 block with scale byte 0xFF (480 to ggml, NaN in MLX's E4M3)")
    scales = np.where(raw == 0x7F, 0, raw & 0x7F).astype(np.uint8)
    return _nibbles(b[:, 4:36].reshape(-1, 4, 8)).reshape(-1, 64), scales


def _mxfp4(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if (b[:, 0] == 255).any():
        raise ValueError("MXFP4 block with scale exponent 255, which the MX format reserves for NaN")
    return _nibbles(b[:, 1:17]), np.ascontiguousarray(b[:, 0:1])


# -- grid (IQ) types with one scale per 32: integer codes from gguf's dequantizer ------------------------
def _u32(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.uint32)


def _per_nibble(raw: np.ndarray) -> np.ndarray:
    """Bytes (n, k) -> 4-bit fields (n, 2k), field j in byte j // 2 (low nibble first)."""
    return np.stack([raw & 0x0F, raw >> 4], axis=2).reshape(raw.shape[0], -1).astype(np.float32)


GRID_SCALES: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {  # blocks -> (n, 8) per 32
    Q.IQ2_XXS: lambda b: _f16(b[:, 0:2]) * (0.5 + (_u32(b[:, 2:66])[:, 1::2] >> 28)) * 0.25,
    Q.IQ3_XXS: lambda b: _f16(b[:, 0:2]) * (0.5 + (_u32(b[:, 66:98]) >> 28)) * 0.5,
    Q.IQ3_S: lambda b: _f16(b[:, 0:2]) * (1 + 2 * _per_nibble(b[:, 106:110])),
    Q.IQ1_S: lambda b: _f16(b[:, 0:2]) * (2 * ((np.ascontiguousarray(b[:, 34:50]).view(np.uint16) >> 12) & 7) + 1) / 8,
}


def _grid(qtype: GGMLQuantizationType, zero_code: int) -> Callable[[np.ndarray], Unpacked]:
    """Codes ``value / scale + zero_code`` with the type's scale per 32 (``GRID_SCALES``)."""
    def unpack(b: np.ndarray) -> Unpacked:
        from gguf.quants import dequantize  # here: the gguf package costs every process about 6 MB resident

        s = GRID_SCALES[qtype](b).astype(np.float32)  # (n, 8)
        values = dequantize(b, qtype).reshape(b.shape[0], 8, GROUP)
        k = np.rint(values / np.where(s == 0, 1, s)[..., None]) + zero_code
        return k.astype(np.uint8).reshape(b.shape[0], -1), s, -zero_code * s
    return unpack


def _dense(qtype: GGMLQuantizationType) -> Callable[[np.ndarray], np.ndarray]:
    def unpack(b: np.ndarray) -> np.ndarray:
        from gguf.quants import dequantize  # here: the gguf package costs every process about 6 MB resident

        return dequantize(b, qtype).reshape(b.shape[0], -1)
    return unpack


REPACKS: dict[GGMLQuantizationType, Repack] = {
    Q.Q4_0: Repack("affine", 4, "exact", _q4_0, zero_code=8),
    Q.Q4_1: Repack("affine", 4, "exact", _q4_1),
    Q.Q5_0: Repack("affine", 5, "exact", _q5_0, zero_code=16),
    Q.Q5_1: Repack("affine", 5, "exact", _q5_1),
    Q.Q8_0: Repack("affine", 8, "exact", _q8_0, zero_code=128),
    Q.TQ1_0: Repack("affine", 2, "exact", _ternary(Q.TQ1_0), zero_code=1),
    Q.TQ2_0: Repack("affine", 2, "exact", _ternary(Q.TQ2_0), zero_code=1),
    Q.Q4_K: Repack("affine", 4, "fp16-scales", _q4_k),
    Q.Q5_K: Repack("affine", 5, "fp16-scales", _q5_k),
    Q.Q6_K: Repack("pairs", 6, "exact", _q6_k, zero_code=32),
    Q.Q3_K: Repack("pairs", 3, "exact", _q3_k, zero_code=4),
    Q.Q2_K: Repack("pairs", 2, "exact", _q2_k, zero_code=0, offsets=True),
    Q.IQ4_NL: Repack("affine", 8, "exact", _iq4_nl, zero_code=128),
    Q.IQ4_XS: Repack("affine", 8, "fp16-scales", _iq4_xs, zero_code=128),
    Q.MXFP4: Repack("mxfp4", 4, "exact", _mxfp4),
    Q.IQ2_XXS: Repack("affine", 8, "fp16-scales", _grid(Q.IQ2_XXS, 128), zero_code=128),
    Q.IQ3_XXS: Repack("affine", 8, "fp16-scales", _grid(Q.IQ3_XXS, 128), zero_code=128),
    Q.IQ3_S: Repack("affine", 5, "fp16-scales", _grid(Q.IQ3_S, 16), zero_code=16),
    Q.IQ1_S: Repack("affine", 5, "fp16-scales", _grid(Q.IQ1_S, 16), zero_code=16),
    Q.IQ2_XS: Repack("dense", 16, "fp16-values", _dense(Q.IQ2_XS)),
    Q.IQ2_S: Repack("dense", 16, "fp16-values", _dense(Q.IQ2_S)),
    Q.IQ1_M: Repack("dense", 16, "fp16-values", _dense(Q.IQ1_M)),
    Q.NVFP4: Repack("nvfp4", 4, "exact", _nvfp4),
}


def mlx_bytes(qtype: GGMLQuantizationType, n_elements: int) -> int:
    """Bytes the MLX backend holds for a matrix of ``n_elements`` weights stored as ``qtype``.

    Raises ValueError for a type the MLX backend cannot hold.
    """
    if qtype in DENSE_ITEMSIZE:
        return DENSE_ITEMSIZE[qtype] * n_elements
    if qtype not in REPACKS:
        raise ValueError(f"GGML type {qtype.name} has no MLX form")
    return REPACKS[qtype].bytes_for(n_elements)


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



def mlx_weight_bytes(gguf) -> int:
    """The bytes the MLX backend will allocate for a parsed GGUF's weights, from its tensor table alone."""
    total = 0
    for info in gguf.tensors.values():
        n = info.n_elements
        if len(info.shape) == 1:
            total += 4 * n  # vectors: float32 (float16 for those applied to float16 activations: an upper bound)
        elif info.qtype in DENSE_ITEMSIZE or info.qtype in REPACKS:
            total += mlx_bytes(info.qtype, n)
        else:
            total += info.nbytes  # refused at load anyway
    return total


def to_float16(values: np.ndarray, what: str) -> np.ndarray:
    """float32 -> float16, refusing values past float16's range (a corrupt block) instead of making infinities."""
    with np.errstate(over="ignore"):
        out = values.astype(np.float16)
    if not np.isfinite(out).all() and np.isfinite(values).all():
        raise ValueError(f"{what} out of float16 range (largest magnitude {float(np.abs(values).max()):g})")
    return out


def repack_rows(blocks: np.ndarray, qtype: GGMLQuantizationType) -> Rows:
    """Rows of packed GGUF blocks (rows, row_bytes) uint8 -> the same rows in the type's MLX layout.

    Raises ValueError for a type with no MLX form (dense float types are not repacked; use them as they are)
    or a block whose scales do not fit the layout.
    """
    if qtype not in REPACKS:
        raise ValueError(f"GGML type {qtype.name} has no MLX quantized form")
    repack = REPACKS[qtype]
    block_elems, type_size = GGML_QUANT_SIZES[qtype]
    rows = blocks.shape[0]
    cols = blocks.shape[1] // type_size * block_elems
    parts = repack.unpack(np.ascontiguousarray(blocks).reshape(-1, type_size))
    if repack.layout == "affine":
        codes, scales, biases = parts
        scales = to_float16(scales.reshape(rows, cols // GROUP), f"{qtype.name} scales")
        if repack.zero_code is not None:  # from the rounded scales, as a SymmetricMatrix makes them
            biases = scales * np.float16(-repack.zero_code)
        return AffineRows(pack_codes(codes.reshape(rows, cols), repack.bits), scales,
                          to_float16(biases.reshape(rows, cols // GROUP), f"{qtype.name} biases"))
    if repack.layout in FP4_GROUP:
        codes, scales = parts
        return MxRows(pack_codes(codes.reshape(rows, cols), 4), scales.reshape(rows, cols // FP4_GROUP[repack.layout]))
    if repack.layout == "pairs":
        return _pair_rows(*parts, rows, cols, repack)
    return DenseRows(to_float16(parts.reshape(rows, cols), f"{qtype.name} weights"))


def _pair_rows(codes: np.ndarray, scale_ints: np.ndarray, d: np.ndarray, offset_ints: np.ndarray | None,
               offset_d: np.ndarray | None, rows: int, cols: int, repack: Repack) -> PairRows:
    """Sub-blocks of 16 -> term 0 holding the even ones of each group of 32, term 1 the odd ones."""
    groups = cols // GROUP
    codes = codes.reshape(rows, groups, 2, SUB_BLOCK)
    terms = np.full((rows, 2, groups, 2, SUB_BLOCK), repack.zero_code, np.uint8)  # (row, term, group, half, i)
    terms[:, 0, :, 0] = codes[:, :, 0]
    terms[:, 1, :, 1] = codes[:, :, 1]
    packed = pack_codes(terms.reshape(rows * 2, cols), repack.bits).reshape(rows, 2, -1)
    term_ints = np.ascontiguousarray(scale_ints.reshape(rows, groups, 2).transpose(0, 2, 1))
    supers = cols // SUPER_BLOCK
    return PairRows(packed, term_ints, d.reshape(rows, supers).astype(np.float16),
                    None if offset_ints is None else offset_ints.reshape(rows, cols // SUB_BLOCK),
                    None if offset_d is None else offset_d.reshape(rows, supers).astype(np.float16))
