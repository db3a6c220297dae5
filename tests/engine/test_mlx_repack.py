"""GGUF blocks repacked into MLX affine quantization, checked against the gguf package's NumPy dequantizer."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from engine.backends.mlx.repack import GROUP, REPACKS, mlx_bytes, pack_codes, repack_rows
from engine.backends.mlx.weights import matrix_from_parts, rows_to_mlx

pytestmark = pytest.mark.mlx
Q = GGMLQuantizationType

# Byte offsets of the float16 fields (scales, mins) in each block: random bytes there would be NaN or huge.
F16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.TQ1_0: (52,),
              Q.TQ2_0: (64,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q3_K: (108,), Q.Q2_K: (80, 82),
              Q.IQ4_NL: (0,), Q.IQ4_XS: (0,), Q.IQ2_XXS: (0,), Q.IQ2_XS: (0,), Q.IQ2_S: (0,), Q.IQ3_XXS: (0,),
              Q.IQ3_S: (0,), Q.IQ1_S: (0,), Q.MXFP4: (), Q.NVFP4: (), Q.IQ1_M: ()}
BY_EXACTNESS = {e: [t for t, r in REPACKS.items() if r.exactness == e] for e in ("exact", "fp16-scales", "fp16-values")}


def random_blocks(qtype: GGMLQuantizationType, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """Rows of random blocks of ``qtype`` (every code and scale pattern), float16 fields in +-0.05."""
    rng = np.random.default_rng(seed)
    type_size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (rows * blocks_per_row, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        d = rng.uniform(-0.05, 0.05, blocks.shape[0]).astype(np.float16)
        blocks[:, offset:offset + 2] = d.view(np.uint8).reshape(-1, 2)
    if qtype == Q.MXFP4:  # E8M0 exponents of weights from 2^-17 to 2^2
        blocks[:, 0] = rng.integers(110, 130, blocks.shape[0])
    if qtype == Q.IQ1_M:  # its float16 scale is spread over the top nibbles of the last four 16-bit words
        d = rng.uniform(-0.05, 0.05, blocks.shape[0]).astype(np.float16).view(np.uint16)
        words = blocks[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        words |= (d[:, None] >> np.array([0, 4, 8, 12], np.uint16)) << np.uint16(12) & np.uint16(0xF000)
        blocks[:, 48:56] = words.view(np.uint8)
    if qtype == Q.NVFP4:  # UE4M3 scales below 2^8 (a byte under 0x78), and sign bits ggml ignores
        blocks[:, 0:4] = rng.integers(0, 0x78, (blocks.shape[0], 4)) | (rng.integers(0, 2, (blocks.shape[0], 4)) << 7)
    return blocks.reshape(rows, blocks_per_row * type_size)


def blocks_per_row(qtype: GGMLQuantizationType, cols: int) -> int:
    return max(1, cols // GGML_QUANT_SIZES[qtype][0])


def mlx_matrix(blocks: np.ndarray, qtype: GGMLQuantizationType):
    """The matrix the MLX backend would hold for these rows (repack, then the layout's Matrix kind)."""
    return matrix_from_parts(qtype, rows_to_mlx(repack_rows(blocks, qtype), qtype))


def mlx_rows(blocks: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Every row of the repacked matrix, as its ``rows`` lookup gives them (float32)."""
    return np.array(mlx_matrix(blocks, qtype).rows(mx.arange(blocks.shape[0])))


def rounding_bound(blocks: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Per weight, what rounding its scales to float16 (relative error 2^-11) can move it by, times 1.01.

    Where the bias is ``-zero_code * scale`` the weight scales with one rounded number: 2^-11 of itself. Where
    scale and bias are separate (Q4_K, Q5_K) each term contributes 2^-11 of its magnitude.
    """
    repack, ref = REPACKS[qtype], dequantize(blocks, qtype).reshape(blocks.shape[0], -1)
    q_max, unit = (1 << repack.bits) - 1, 2.0 ** -11 * 1.01
    if repack.zero_code is not None:
        return unit * np.abs(ref) + 1e-12
    rows = repack_rows(blocks, qtype)
    per_group = unit * (np.abs(rows.scales.astype(np.float32)) * q_max + np.abs(rows.biases.astype(np.float32)))
    return np.repeat(per_group, GROUP, axis=1) + 1e-12


def test_every_type_the_cpu_backend_reads_has_a_repack():
    from engine.backends.cpu.kernels import SUPPORTED_TYPES
    from engine.backends.mlx.repack import DENSE_ITEMSIZE
    missing = {Q(t).name for t in SUPPORTED_TYPES} - {t.name for t in REPACKS} - {t.name for t in DENSE_ITEMSIZE}
    assert not missing


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_codes_matches_mlx_layout(bits):
    codes = np.random.default_rng(bits).integers(0, 1 << bits, (3, 64), dtype=np.uint8)
    ones, zeros = mx.ones((3, 2), mx.float32), mx.zeros((3, 2), mx.float32)
    unpacked = mx.dequantize(mx.array(pack_codes(codes, bits)), ones, zeros, group_size=GROUP, bits=bits)
    np.testing.assert_array_equal(np.array(unpacked), codes.astype(np.float32))


@pytest.mark.parametrize("qtype", BY_EXACTNESS["exact"], ids=lambda t: t.name)
def test_exact_types_are_bit_exact(qtype):
    blocks = random_blocks(qtype, rows=5, blocks_per_row=blocks_per_row(qtype, 96))
    got = mlx_rows(blocks, qtype)
    np.testing.assert_array_equal(got, dequantize(blocks, qtype).reshape(got.shape))


@pytest.mark.parametrize("qtype", BY_EXACTNESS["fp16-scales"], ids=lambda t: t.name)
def test_types_with_products_of_scales_are_exact_up_to_float16_scales(qtype):
    """Block for block against gguf's dequantizer: only the float16 rounding of each group's scale and bias."""
    blocks = random_blocks(qtype, rows=7, blocks_per_row=3)
    got = mlx_rows(blocks, qtype)
    ref = dequantize(blocks, qtype).reshape(got.shape)
    err = np.abs(got - ref)
    assert (err <= rounding_bound(blocks, qtype)).all(), float(err.max())


@pytest.mark.parametrize("qtype", BY_EXACTNESS["fp16-values"], ids=lambda t: t.name)
def test_float16_types_are_the_dequantized_weights_rounded_to_float16(qtype):
    blocks = random_blocks(qtype, rows=5, blocks_per_row=2)
    got = mlx_rows(blocks, qtype)
    np.testing.assert_array_equal(got, dequantize(blocks, qtype).reshape(got.shape).astype(np.float16))


@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q3_K, Q.Q2_K], ids=lambda t: t.name)
def test_16_element_sub_blocks_keep_their_own_scales(qtype):
    """Two sub-blocks of one group of 32 with scales far apart (the case requantization got wrong) stay exact,
    and the float32 product is that of gguf's weights (no float16 scale in between)."""
    blocks = random_blocks(qtype, rows=2, blocks_per_row=2, seed=3)
    raw = blocks.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    scale_bytes = {Q.Q6_K: (192, 208), Q.Q3_K: (96, 108), Q.Q2_K: (0, 16)}[qtype]
    raw[:, scale_bytes[0]:scale_bytes[1]] = np.where(np.arange(scale_bytes[1] - scale_bytes[0]) % 2, 0x11, 0x7F)
    got = mlx_rows(blocks, qtype)
    ref = dequantize(blocks, qtype).reshape(got.shape)
    np.testing.assert_array_equal(got, ref)
    x = np.random.default_rng(6).standard_normal((4, ref.shape[1])).astype(np.float32)
    product = np.array(mlx_matrix(blocks, qtype).matmul(mx.array(x)))
    np.testing.assert_allclose(product, x @ ref.T, rtol=0, atol=1e-6 * float((np.abs(x) @ np.abs(ref).T).max()))


@pytest.mark.parametrize("qtype", list(REPACKS), ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=["float32", "float16"])
def test_matmul_matches_the_dequantized_reference(qtype, dtype):
    """x @ W.T through the type's Matrix vs on gguf's float32 dequantization, for an awkward row count."""
    blocks = random_blocks(qtype, rows=13, blocks_per_row=blocks_per_row(qtype, 512), seed=1)
    ref = dequantize(blocks, qtype).reshape(13, -1)
    x = np.random.default_rng(2).standard_normal((3, ref.shape[1])).astype(np.float32)
    got = np.array(mlx_matrix(blocks, qtype).matmul(mx.array(x, dtype)).astype(mx.float32))
    # float32: each weight within its float16 rounding; float16: inputs and outputs rounded too
    tolerance = {"exact": 1e-6, "fp16-scales": 2.0 ** -10, "fp16-values": 2.0 ** -10}[REPACKS[qtype].exactness]
    if dtype == mx.float16:
        tolerance = 2.0 ** -7
    scale = np.abs(x) @ np.abs(ref).T  # what the error of each output could add up to
    assert (np.abs(got - x @ ref.T) <= tolerance * scale + 1e-5).all()


@pytest.mark.parametrize("qtype", list(REPACKS), ids=lambda t: t.name)
def test_rows_lookup_of_chosen_ids_matches_the_whole_matrix(qtype):
    blocks = random_blocks(qtype, rows=6, blocks_per_row=blocks_per_row(qtype, 256), seed=4)
    matrix = mlx_matrix(blocks, qtype)
    ids = [5, 0, 3, 3]
    np.testing.assert_array_equal(np.array(matrix.rows(mx.array(ids))), mlx_rows(blocks, qtype)[ids])


@pytest.mark.parametrize("qtype", list(REPACKS), ids=lambda t: t.name)
def test_the_memory_estimate_is_what_the_matrix_holds(qtype):
    blocks = random_blocks(qtype, rows=4, blocks_per_row=blocks_per_row(qtype, 512), seed=5)
    matrix = mlx_matrix(blocks, qtype)
    assert matrix.nbytes == mlx_bytes(qtype, 4 * blocks_per_row(qtype, 512) * GGML_QUANT_SIZES[qtype][0])


def test_memory_per_weight_against_the_file_is_the_documented_table():
    """The module docstring's table: bits per weight in MLX, for 256 x 256 weights."""
    n = 256 * 256
    mlx_bits = {t.name: mlx_bytes(t, n) * 8 / n for t in REPACKS}
    assert mlx_bits == {"Q4_0": 4.5, "Q4_1": 5, "Q5_0": 5.5, "Q5_1": 6, "Q8_0": 8.5, "TQ1_0": 2.5, "TQ2_0": 2.5,
                        "Q4_K": 5, "Q5_K": 6, "Q6_K": 12.5625, "Q3_K": 6.5625, "Q2_K": 5.125, "IQ4_NL": 8.5,
                        "IQ4_XS": 8.5,
                        "MXFP4": 4.25, "IQ2_XXS": 8.5, "IQ3_XXS": 8.5, "IQ3_S": 5.5, "IQ1_S": 5.5, "IQ2_XS": 16,
                        "IQ2_S": 16, "IQ1_M": 16, "NVFP4": 4.5}


def test_legacy_types_match_what_mx_load_reads_from_gguf(tiny_model_path):
    """mx.load keeps Q4_0 and Q8_0 as MLX quantized arrays; our repack of the same bytes is identical."""
    from engine.backends.mlx.weights import TensorReader
    from engine.gguf_file import read_gguf

    loaded = mx.load(str(tiny_model_path))
    with read_gguf(tiny_model_path) as gguf:
        reader = TensorReader(gguf)
        names = [n for n, t in gguf.tensors.items() if t.qtype in (Q.Q4_0, Q.Q8_0)]
        assert {gguf.tensors[n].qtype for n in names} == {Q.Q4_0, Q.Q8_0}
        for name in names:
            a = repack_rows(reader.read_rows(name, 0, gguf.tensors[name].shape[1]), gguf.tensors[name].qtype)
            stem = name.removesuffix(".weight")
            np.testing.assert_array_equal(a.packed, np.array(loaded[f"{stem}.weight"]))
            np.testing.assert_array_equal(a.scales, np.array(loaded[f"{stem}.scales"]))
            np.testing.assert_array_equal(a.biases, np.array(loaded[f"{stem}.biases"]))
        reader.close()


def test_unsupported_type_is_refused():
    with pytest.raises(ValueError, match="Q8_1"):
        repack_rows(np.zeros((1, 40), np.uint8), Q.Q8_1)


def test_corrupt_blocks_are_refused_not_turned_into_infinities():
    blocks = random_blocks(Q.MXFP4, rows=1, blocks_per_row=2)
    blocks[0, 17] = 255  # the second block's exponent: NaN in the MX format
    with pytest.raises(ValueError, match="exponent 255"):
        repack_rows(blocks, Q.MXFP4)
    q4 = random_blocks(Q.Q4_K, rows=1, blocks_per_row=1)
    q4[0, 0:2] = np.array([60000], np.float16).view(np.uint8)  # d * 63 is past float16's range
    q4[0, 4:16] = 0xFF
    with pytest.raises(ValueError, match="float16 range"):
        repack_rows(q4, Q.Q4_K)


@pytest.mark.parametrize("qtype", [t for t, r in REPACKS.items() if r.zero_code is not None and r.layout == "affine"],
                         ids=lambda t: t.name)
def test_types_with_a_zero_code_have_biases_of_minus_zero_code_scales(qtype):
    """What lets a SymmetricMatrix drop its biases: the rows and products it gives are the same, bit for bit."""
    from engine.backends.mlx.weights import QuantizedMatrix, SymmetricMatrix

    block = GGML_QUANT_SIZES[qtype][0]
    a = repack_rows(random_blocks(qtype, rows=6, blocks_per_row=max(1, 256 // block)), qtype)
    zero_code, bits = REPACKS[qtype].zero_code, REPACKS[qtype].bits
    np.testing.assert_array_equal(a.biases, (a.scales * -zero_code).astype(np.float16))
    packed, scales, ids = mx.array(a.packed), mx.array(a.scales), mx.array([5, 0, 3, 3])
    full = QuantizedMatrix(packed, scales, mx.array(a.biases), bits)
    symmetric = SymmetricMatrix(packed, scales, zero_code, bits)
    np.testing.assert_array_equal(np.array(symmetric.rows(ids)), np.array(full.rows(ids)))
    np.testing.assert_array_equal(np.array(symmetric.biases), a.biases)
    for n, dtype in ((1, mx.float32), (5, mx.float32), (3, mx.float16)):
        x = mx.array(np.random.default_rng(n).standard_normal((n, a.packed.shape[1] * 32 // bits)), dtype)
        np.testing.assert_array_equal(np.array(symmetric.matmul(x)), np.array(full.matmul(x)))


def test_nvfp4_scale_bytes_read_as_ggml_reads_them():
    """ggml's unsigned E4M3: the top bit ignored and 0x7F read as 0 (NaN and negative in MLX's E4M3)."""
    blocks = random_blocks(Q.NVFP4, rows=1, blocks_per_row=2)
    blocks[0, 0:4] = [0x7F, 0x80, 0x80 | 0x38, 0x38]
    got = mlx_rows(blocks, Q.NVFP4)
    np.testing.assert_array_equal(got, dequantize(blocks, Q.NVFP4).reshape(got.shape))
    assert (got[0, :32] == 0).all() and (got[0, 32:64] != 0).any()
    blocks[0, 37] = 0xFF  # the second block's second scale
    with pytest.raises(ValueError, match="0xFF"):
        repack_rows(blocks, Q.NVFP4)
