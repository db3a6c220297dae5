"""Load GGUF tensors into MLX arrays: quantized matrices repacked to their MLX layout (repack.py), dense ones as stored.

Tensor bytes are read with positional reads in chunks of rows, never through the file's memory map, so the
file's pages stay in the page cache and do not count toward this process's resident memory; each chunk is
repacked and written into a preallocated MLX array (the update reuses the array's buffer), so loading needs
about the final size plus one chunk's temporaries.
"""

from __future__ import annotations

import dataclasses
import os

import mlx.core as mx
import numpy as np
from ...ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType
from ...gguf_file import GGUFFile, ModelFormatError
from .repack import DENSE_ITEMSIZE, FP4_GROUP, GROUP, REPACKS, SUB_BLOCK, Rows, repack_rows
from .repack import mlx_weight_bytes  # noqa: F401  (the backend's fit check takes it from here)

CHUNK_ELEMENTS = 1 << 16  # weights repacked at a time: each float32 temporary of a repack is 256 KiB
RESIDUAL_DTYPE = mx.float32  # the residual stream, embeddings, the main norms and the logits


def default_matmul_dtype() -> mx.Dtype:
    """What matrix products take and attention runs in: float16 on the GPU, float32 on the CPU.

    MLX casts a quantized matrix's scales and biases to the input's dtype on every product, so inputs in
    the scales' own float16 spare the GPU two conversions per product; MLX's CPU kernels are an order of
    magnitude slower in float16, so on the CPU the conversion is the cheaper side.
    """
    return mx.float16 if mx.default_device().type == mx.gpu else mx.float32


def quantized_matmul(x: mx.array, packed: mx.array, scales: mx.array, biases: mx.array | None = None,
                     **kwargs) -> mx.array:
    """``mx.quantized_matmul(x, packed, scales, biases, transpose=True, **kwargs)`` in ``x``'s dtype.

    MLX's CPU device has no float16 path for quantized products: one took 1.9 s in float16 against 44 ms in
    float32 (51 tokens × 640 × 2048, 4 bits). There a float16 product runs on its float16 inputs widened to
    float32 and rounds the result to float16, which is what MLX's GPU kernels do (they accumulate in float32).
    """
    if x.dtype == mx.float16 and mx.default_device().type == mx.cpu:
        wide = [a.astype(mx.float32) if a is not None and a.dtype == mx.float16 else a for a in (scales, biases)]
        return mx.quantized_matmul(x.astype(mx.float32), packed, *wide, transpose=True,
                                   **kwargs).astype(mx.float16)
    return mx.quantized_matmul(x, packed, scales, biases, transpose=True, **kwargs)


@dataclasses.dataclass(frozen=True)
class QuantizedMatrix:
    """A (rows, cols) weight in MLX affine quantization with groups of ``GROUP`` columns."""

    packed: mx.array  # (rows, cols * bits // 32) uint32
    scales: mx.array  # (rows, cols // GROUP) float16
    biases: mx.array  # (rows, cols // GROUP) float16
    bits: int

    def matmul(self, x: mx.array) -> mx.array:
        """``x @ W.T`` for x (..., cols) -> (..., rows)."""
        return quantized_matmul(x, self.packed, self.scales, self.biases, group_size=GROUP, bits=self.bits)

    def rows(self, ids: mx.array) -> mx.array:
        """Rows ``ids`` dequantized to float32 (scales widened first, so the rows are exact), (n, cols)."""
        return mx.dequantize(self.packed[ids], self.scales[ids].astype(mx.float32),
                             self.biases[ids].astype(mx.float32), group_size=GROUP, bits=self.bits)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes + self.biases.nbytes


@dataclasses.dataclass(frozen=True)
class SymmetricMatrix:
    """A QuantizedMatrix whose GGML type has biases of ``-zero_code * scale`` (Q4_0, Q5_0, Q8_0, TQ1_0,
    TQ2_0): MLX's codes and scales without the biases, which each product or lookup makes from the scales it
    reads: half a bit per weight less than a QuantizedMatrix, the same products and rows, bit for bit.
    """

    packed: mx.array  # (rows, cols * bits // 32) uint32
    scales: mx.array  # (rows, cols // GROUP) float16
    zero_code: int  # a power of two (or 1), so -zero_code * scale is exact in float16 and float32
    bits: int

    def matmul(self, x: mx.array) -> mx.array:
        """``x @ W.T`` for x (..., cols) -> (..., rows).

        MLX casts scales and biases to the input's dtype for the product anyway; casting the scales first
        makes the biases in that dtype, so the product costs one cast and one multiply instead of two casts.
        """
        scales = self.scales.astype(x.dtype)
        return quantized_matmul(x, self.packed, scales, scales * -self.zero_code, group_size=GROUP, bits=self.bits)

    def rows(self, ids: mx.array) -> mx.array:
        """Rows ``ids`` dequantized to float32, (n, cols), as QuantizedMatrix.rows gives them."""
        scales = self.scales[ids].astype(mx.float32)
        return mx.dequantize(self.packed[ids], scales, scales * -self.zero_code, group_size=GROUP, bits=self.bits)

    @property
    def biases(self) -> mx.array:
        """The biases a QuantizedMatrix would hold, (rows, cols // GROUP) float16, made anew (for mlx-lm's peer)."""
        return self.scales * -self.zero_code

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes


@dataclasses.dataclass(frozen=True)
class DenseMatrix:
    """A (rows, cols) weight as float values: a stored float type (float32, float16, bfloat16), or float16 for a
    GGML type whose scales change too often for an MLX group (repack.py)."""

    weight: mx.array  # (rows, cols)

    def matmul(self, x: mx.array) -> mx.array:
        return (x @ self.weight.T).astype(x.dtype)

    def rows(self, ids: mx.array) -> mx.array:
        return self.weight[ids].astype(RESIDUAL_DTYPE)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes


@dataclasses.dataclass(frozen=True)
class MxfpMatrix:
    """A (rows, cols) weight in one of MLX's E2M1 modes: ``"mxfp4"`` (an E8M0 exponent per 32, GGUF's MXFP4) or
    ``"nvfp4"`` (an E4M3 scale per 16, GGUF's NVFP4)."""

    packed: mx.array  # (rows, cols // 8) uint32
    scales: mx.array  # (rows, cols // group_size) uint8
    mode: str
    bits = 4

    @property
    def group_size(self) -> int:
        return FP4_GROUP[self.mode]

    def matmul(self, x: mx.array) -> mx.array:
        """``x @ W.T`` for x (..., cols) -> (..., rows)."""
        return quantized_matmul(x, self.packed, self.scales, group_size=self.group_size, bits=4, mode=self.mode)

    def rows(self, ids: mx.array) -> mx.array:
        """Rows ``ids`` dequantized to float32, (n, cols)."""
        return mx.dequantize(self.packed[ids], self.scales[ids], group_size=self.group_size, bits=4, mode=self.mode,
                             dtype=mx.float32)

    @property
    def n_rows(self) -> int:
        return self.packed.shape[0]

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes


@dataclasses.dataclass(frozen=True)
class PairMatrix:
    """A (rows, cols) weight whose scales change every 16 elements (Q6_K, Q3_K, Q2_K), held exactly as two
    symmetric terms per row (term row 2r has the even 16-element sub-blocks of each group of 32 of row r,
    row 2r + 1 the odd ones, each zero elsewhere) plus, for Q2_K, per-16 offsets applied to the 16-element
    sums of the input. Scales and offsets stay factored as in the file (an integer per 16 times a float16 per
    256) and are multiplied out in the product's dtype at each product: bit exact in float32. One quantized
    product over both terms, then a sum of each row's two outputs.
    """

    packed: mx.array  # (2 * rows, cols * bits // 32) uint32
    scale_ints: mx.array  # (2 * rows, cols // GROUP) int8
    super_scales: mx.array  # (rows, cols // 256) float16
    offset_ints: mx.array | None  # (rows, cols // 16) int8
    super_offsets: mx.array | None  # (rows, cols // 256) float16
    zero_code: int
    bits: int

    def _scales(self, dtype: mx.Dtype, ids: mx.array | None = None) -> mx.array:
        """The terms' scales (2 * rows, cols // GROUP), or of term rows ``ids``' rows ``ids // 2``."""
        if ids is None:  # term rows 2r and 2r + 1 share row r's super-block scales
            rows, n_super = self.super_scales.shape
            ints = self.scale_ints.astype(dtype).reshape(rows, 2, n_super, -1)
            return (ints * self.super_scales.astype(dtype)[:, None, :, None]).reshape(2 * rows, -1)
        supers = self.super_scales[ids // 2]  # (n, n_super)
        ints = self.scale_ints[ids].astype(dtype).reshape(ids.shape[0], supers.shape[1], -1)
        return (ints * supers.astype(dtype)[:, :, None]).reshape(ids.shape[0], -1)

    def _offsets(self, dtype: mx.Dtype, ids: mx.array | None = None) -> mx.array:
        """Per-16 offsets (rows, cols // 16), or of rows ``ids``."""
        ints = self.offset_ints if ids is None else self.offset_ints[ids]
        supers = self.super_offsets if ids is None else self.super_offsets[ids]
        per_16 = ints.astype(dtype).reshape(ints.shape[0], supers.shape[1], -1) * supers.astype(dtype)[:, :, None]
        return per_16.reshape(ints.shape[0], -1)

    def matmul(self, x: mx.array) -> mx.array:
        """``x @ W.T`` for x (..., cols) -> (..., rows)."""
        scales = self._scales(x.dtype)
        y = quantized_matmul(x, self.packed, scales, scales * -self.zero_code, group_size=GROUP,
                             bits=self.bits)  # (..., 2 * rows)
        y = y.reshape(*y.shape[:-1], -1, 2).sum(axis=-1)
        if self.offset_ints is not None:
            sums = x.reshape(*x.shape[:-1], -1, SUB_BLOCK).sum(axis=-1)  # (..., cols // 16)
            y = y + sums @ self._offsets(x.dtype).T
        return y.astype(x.dtype)

    def rows(self, ids: mx.array) -> mx.array:
        """Rows ``ids`` dequantized to float32, (n, cols): the two terms' rows summed (one of each pair is 0)."""
        ids = ids.reshape(-1)
        term_ids = (2 * ids[:, None] + mx.arange(2)).reshape(-1)  # (2n,)
        scales = self._scales(mx.float32, term_ids)
        both = mx.dequantize(self.packed[term_ids], scales, scales * -self.zero_code, group_size=GROUP,
                             bits=self.bits)  # (2n, cols)
        w = both.reshape(ids.shape[0], 2, -1).sum(axis=1)
        if self.offset_ints is not None:
            w = w + mx.repeat(self._offsets(mx.float32, ids), SUB_BLOCK, axis=1)
        return w

    @property
    def n_rows(self) -> int:
        return self.packed.shape[0] // 2

    @property
    def nbytes(self) -> int:
        parts = (self.packed, self.scale_ints, self.super_scales, self.offset_ints, self.super_offsets)
        return sum(p.nbytes for p in parts if p is not None)


Matrix = QuantizedMatrix | SymmetricMatrix | DenseMatrix | MxfpMatrix | PairMatrix


class TensorReader:
    """Positional reads of tensor rows from a GGUF file (the tensor table comes from the parsed file)."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf
        self._fd = os.open(gguf.path, os.O_RDONLY)

    def row_bytes(self, name: str) -> int:
        info = self.gguf.tensor(name)
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        return info.shape[0] // block * type_size

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of tensor ``name`` as a fresh (stop - start, row_bytes) uint8 array."""
        info, row_bytes = self.gguf.tensor(name), self.row_bytes(name)
        out = np.empty((stop - start, row_bytes), np.uint8)
        view, offset = memoryview(out).cast("B"), info.offset + start * row_bytes
        done = 0
        while done < out.nbytes:
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n <= 0:
                raise ModelFormatError(f"{self.gguf.path}: tensor {name!r} is cut short (file changed while loading?)")
            done += n
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def load_matrix(reader: TensorReader, name: str) -> Matrix:
    """Tensor ``name`` as a matrix; raises ModelFormatError for a type the MLX backend cannot hold."""
    qtype = reader.gguf.tensor(name).qtype
    if qtype in DENSE_ITEMSIZE:
        return DenseMatrix(_dense(reader, name, qtype))
    if qtype not in REPACKS:
        raise ModelFormatError(f"tensor {name!r} has type {qtype.name}, which the MLX backend does not support")
    return matrix_from_parts(qtype, _repacked(reader, name, qtype))


def matrix_from_parts(qtype: GGMLQuantizationType, parts: dict[str, mx.array]) -> Matrix:
    """The Matrix kind of ``qtype``'s layout over its arrays (the fields of repack's rows, as MLX arrays)."""
    repack = REPACKS[qtype]
    if repack.layout in FP4_GROUP:
        return MxfpMatrix(parts["packed"], parts["scales"], repack.layout)
    if repack.layout == "dense":
        return DenseMatrix(parts["weight"])
    if repack.layout == "pairs":
        packed, ints = parts["packed"], parts["scale_ints"]  # (rows, 2, ...): rows of the two terms interleaved
        return PairMatrix(packed.reshape(-1, packed.shape[-1]), ints.reshape(-1, ints.shape[-1]),
                          parts["super_scales"], parts.get("offset_ints"), parts.get("super_offsets"),
                          repack.zero_code, repack.bits)
    if repack.zero_code is not None:
        return SymmetricMatrix(parts["packed"], parts["scales"], repack.zero_code, repack.bits)
    return QuantizedMatrix(parts["packed"], parts["scales"], parts["biases"], repack.bits)


def rows_to_mlx(rows: Rows, qtype: GGMLQuantizationType) -> dict[str, mx.array]:
    """Repacked NumPy rows -> the MLX arrays a Matrix holds (a symmetric type's biases are left out)."""
    skip = {"biases"} if REPACKS[qtype].zero_code is not None else set()
    return {f.name: mx.array(getattr(rows, f.name)) for f in dataclasses.fields(rows)
            if getattr(rows, f.name) is not None and f.name not in skip}


def _repacked(reader: TensorReader, name: str, qtype: GGMLQuantizationType) -> dict[str, mx.array]:
    """The arrays of tensor ``name`` in its MLX layout, repacked chunk by chunk into preallocated arrays."""
    info = reader.gguf.tensor(name)
    n_rows, cols = int(np.prod(info.shape[1:])), info.shape[0]
    if cols % GROUP:
        raise ModelFormatError(f"tensor {name!r}: row length {cols} is not a multiple of {GROUP}")
    arrays: dict[str, mx.array] = {}
    step = max(1, CHUNK_ELEMENTS // cols)
    for start in range(0, n_rows, step):
        stop = min(n_rows, start + step)
        try:
            chunk = rows_to_mlx(repack_rows(reader.read_rows(name, start, stop), qtype), qtype)
        except ValueError as e:
            raise ModelFormatError(f"tensor {name!r}: {e}") from e
        for key, part in chunk.items():
            if key not in arrays:  # allocated once, from the first chunk's shapes and dtypes
                arrays[key] = mx.zeros((n_rows, *part.shape[1:]), part.dtype)
            arrays[key][start:stop] = part
        mx.eval(list(arrays.values()))  # write in place now, so only one chunk is ever pending
    return arrays


def _dense(reader: TensorReader, name: str, qtype: GGMLQuantizationType) -> mx.array:
    info = reader.gguf.tensor(name)
    raw = reader.read_rows(name, 0, int(np.prod(info.shape[1:])))
    if qtype == GGMLQuantizationType.F32:
        return mx.array(raw.view(np.float32))
    if qtype == GGMLQuantizationType.F16:
        return mx.array(raw.view(np.float16))
    return mx.array(raw.view(np.uint16)).view(mx.bfloat16)


def load_vector(reader: TensorReader, name: str, dtype: mx.Dtype = RESIDUAL_DTYPE) -> mx.array:
    """A 1-D tensor (norm weight, bias, RoPE factors), (n,), in ``dtype``."""
    info = reader.gguf.tensor(name)
    raw = reader.read_rows(name, 0, int(np.prod(info.shape[1:])))
    if info.qtype == GGMLQuantizationType.F32:
        return mx.array(raw.view(np.float32).reshape(-1), dtype)
    from gguf.quants import dequantize  # here: the gguf package costs every process about 6 MB resident

    return mx.array(dequantize(raw, info.qtype).astype(np.float32).reshape(-1), dtype)
