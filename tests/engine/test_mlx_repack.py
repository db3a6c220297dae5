"""GGUF blocks repacked into MLX affine quantization, checked against the gguf package's NumPy dequantizer."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from engine.backends.mlx.repack import GROUP, REPACKS, pack_codes, repack_rows

pytestmark = pytest.mark.mlx
Q = GGMLQuantizationType

# Byte offsets of the float16 fields (scales, mins) in each block: random bytes there would be NaN or huge.
F16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.TQ1_0: (52,),
              Q.TQ2_0: (64,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q3_K: (108,), Q.Q2_K: (80, 82)}


def random_blocks(qtype: GGMLQuantizationType, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """Rows of random blocks of ``qtype`` (every code and scale pattern), float16 fields in +-0.05."""
    rng = np.random.default_rng(seed)
    type_size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (rows * blocks_per_row, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        d = rng.uniform(-0.05, 0.05, blocks.shape[0]).astype(np.float16)
        blocks[:, offset:offset + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, blocks_per_row * type_size)


def mlx_rows(blocks: np.ndarray, qtype: GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The repacked matrix as the quantized matmul sees it (identity @ W.T, in float32), and its scales/biases."""
    a = repack_rows(blocks, qtype)
    cols = a.scales.shape[1] * GROUP
    w = mx.quantized_matmul(mx.eye(cols), mx.array(a.packed), mx.array(a.scales), mx.array(a.biases),
                            transpose=True, group_size=GROUP, bits=REPACKS[qtype].bits)
    return np.array(w).T, a.scales.astype(np.float32), a.biases.astype(np.float32)


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


@pytest.mark.parametrize("qtype", [t for t, r in REPACKS.items() if r.exactness == "exact"], ids=lambda t: t.name)
def test_exact_types_are_bit_exact(qtype):
    block = GGML_QUANT_SIZES[qtype][0]
    blocks = random_blocks(qtype, rows=5, blocks_per_row=max(1, 96 // block))
    got, _, _ = mlx_rows(blocks, qtype)
    np.testing.assert_array_equal(got, dequantize(blocks, qtype).reshape(got.shape))


@pytest.mark.parametrize("qtype", [t for t, r in REPACKS.items() if r.exactness == "fp16-scales"], ids=lambda t: t.name)
def test_k_quants_with_32_sub_blocks_are_exact_up_to_float16_scales(qtype):
    """Error per element at most 2^-11 relative on each of ``scale * q`` and ``bias`` (their float16 rounding)."""
    blocks = random_blocks(qtype, rows=7, blocks_per_row=3)
    got, scales, biases = mlx_rows(blocks, qtype)
    ref = dequantize(blocks, qtype).reshape(got.shape)
    q_max = (1 << REPACKS[qtype].bits) - 1
    bound = 2.0 ** -11 * (np.abs(scales) * q_max + np.abs(biases)) + 1e-7  # per group (rows, groups)
    err = np.abs(got - ref).reshape(*bound.shape, GROUP).max(axis=-1)
    assert (err <= bound).all(), float((err / bound).max())


@pytest.mark.parametrize("qtype", [t for t, r in REPACKS.items() if r.exactness == "requantized"], ids=lambda t: t.name)
def test_16_element_sub_block_types_are_within_half_a_step(qtype):
    """Requantized to groups of 32: error at most half the new step (plus float16 rounding of the bias)."""
    blocks = random_blocks(qtype, rows=7, blocks_per_row=3)
    got, scales, biases = mlx_rows(blocks, qtype)
    ref = dequantize(blocks, qtype).reshape(got.shape)
    bound = 0.5 * np.abs(scales) + 2.0 ** -10 * np.abs(biases) + 1e-7
    err = np.abs(got - ref).reshape(*bound.shape, GROUP).max(axis=-1)
    assert (err <= bound).all(), float((err / bound).max())


def test_q6_k_keeps_the_coarser_sub_block_of_each_group_on_its_grid():
    """The new step is a quarter of the coarser sub-block's, so the requantization error is at most 1/8 of its step."""
    blocks = random_blocks(Q.Q6_K, rows=4, blocks_per_row=2)
    got, _, _ = mlx_rows(blocks, Q.Q6_K)
    ref = dequantize(blocks, Q.Q6_K).reshape(got.shape)
    raw = blocks.reshape(-1, 210)
    sub_step = np.abs(raw[:, 208:210].copy().view(np.float16).astype(np.float32) * raw[:, 192:208].view(np.int8))
    coarse = sub_step.reshape(-1, 8, 2).max(axis=-1).reshape(got.shape[0], -1)  # (rows, groups)
    err = np.abs(got - ref).reshape(*coarse.shape, GROUP).max(axis=-1)
    assert (err <= coarse / 8 * 1.01 + coarse * 2.0 ** -6).all()


@pytest.mark.parametrize("qtype", list(REPACKS), ids=lambda t: t.name)
def test_repacked_matmul_matches_the_dequantized_reference(qtype):
    """x @ W.T on the repacked rows vs on gguf's float32 dequantization, for an awkward row count."""
    block = GGML_QUANT_SIZES[qtype][0]
    blocks = random_blocks(qtype, rows=13, blocks_per_row=max(1, 512 // block), seed=1)
    a = repack_rows(blocks, qtype)
    ref = dequantize(blocks, qtype).reshape(13, -1)
    x = np.random.default_rng(2).standard_normal((3, ref.shape[1])).astype(np.float32)
    got = np.array(mx.quantized_matmul(mx.array(x), mx.array(a.packed), mx.array(a.scales), mx.array(a.biases),
                                       transpose=True, group_size=GROUP, bits=REPACKS[qtype].bits))
    tolerance = {"exact": 1e-5, "fp16-scales": 2e-3, "requantized": 0.1}[REPACKS[qtype].exactness]
    scale = np.abs(x) @ np.abs(ref).T  # what the error of each output could add up to
    assert (np.abs(got - x @ ref.T) <= tolerance * scale + 1e-5).all()


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
    with pytest.raises(ValueError, match="IQ2_XXS"):
        repack_rows(np.zeros((1, 66), np.uint8), Q.IQ2_XXS)


@pytest.mark.parametrize("qtype", [t for t, r in REPACKS.items() if r.zero_code is not None], ids=lambda t: t.name)
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
