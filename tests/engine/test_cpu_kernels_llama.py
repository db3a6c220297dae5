"""The C kernels against llama.cpp's own CPU kernels, called through ctypes in the ggml libraries that
llama-cpp-python ships: weights written by llama.cpp's quantizer (``ggml_quantize_chunk``, with an importance
matrix where the type needs one), dequantized block for block like ``to_float``, and products close to
``vec_dot`` on activations quantized by llama.cpp's ``from_float``.

Both sides quantize the activations to 8 bits the same way (scale amax / 127, round to nearest), so the integer
dot products are the same and the results differ only by float rounding: within 1e-5 of sum_j |W_ij x_j| for
the types paired with Q8_K activations (measured: under 1e-6), within 5e-4 for those paired with blocks of 32,
whose scale llama.cpp stores as float16 and we as float32 (measured: under 2e-4). One wrong value in a block
misses either bound.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.backends.cpu import kernels

T = GGMLQuantizationType
NEW_TYPES = (T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S)
OLD_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.TQ1_0, T.TQ2_0)

FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_int64)
TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class TypeTraits(ctypes.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", TO_FLOAT),
                ("from_float_ref", FROM_FLOAT)]


class TypeTraitsCpu(ctypes.Structure):  # struct ggml_type_traits_cpu (ggml-cpu.h)
    _fields_ = [("from_float", FROM_FLOAT), ("vec_dot", VEC_DOT), ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


class Ggml:
    """The few ggml entry points these tests call."""

    def __init__(self) -> None:
        import llama_cpp

        lib = Path(llama_cpp.__file__).parent / "lib"
        self.base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu.ggml_cpu_init()
        self.base.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
        self.base.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        self.base.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                  ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]

    def quantize(self, qtype: T, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        rows, cols = x.shape
        block, type_size = GGML_QUANT_SIZES[qtype]
        out = np.zeros((rows, cols // block * type_size), np.uint8)
        x = np.ascontiguousarray(x, np.float32)
        im = None if imatrix is None else np.ascontiguousarray(imatrix, np.float32)
        written = self.base.ggml_quantize_chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0, rows, cols,
                                                None if im is None else im.ctypes.data)
        assert written == out.size
        return out

    def requires_imatrix(self, qtype: T) -> bool:
        return bool(self.base.ggml_quantize_requires_imatrix(int(qtype)))

    def dequantize(self, qtype: T, w: np.ndarray) -> np.ndarray:
        cols = kernels.row_elements(qtype, w.shape[1])
        out = np.zeros((w.shape[0], cols), np.float32)
        to_float = self.base.ggml_get_type_traits(int(qtype)).contents.to_float
        for r in range(w.shape[0]):
            row = np.ascontiguousarray(w[r])
            to_float(row.ctypes.data, out[r].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), cols)
        return out

    def matmul(self, qtype: T, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """x @ W.T with llama.cpp's vec_dot, one row and token at a time."""
        traits = self.cpu.ggml_get_type_traits_cpu(int(qtype)).contents
        act_type = T(traits.vec_dot_type)
        from_float = self.cpu.ggml_get_type_traits_cpu(int(act_type)).contents.from_float  # floats to Q8_0 / Q8_K
        n, cols = x.shape
        block, type_size = GGML_QUANT_SIZES[act_type]
        out = np.zeros((n, w.shape[0]), np.float32)
        result = ctypes.c_float()
        for t in range(n):
            xt = np.ascontiguousarray(x[t], np.float32)
            act = np.zeros(cols // block * type_size, np.uint8)
            from_float(xt.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), act.ctypes.data, cols)
            for r in range(w.shape[0]):
                row = np.ascontiguousarray(w[r])
                traits.vec_dot(cols, ctypes.byref(result), 0, row.ctypes.data, 0, act.ctypes.data, 0, 1)
                out[t, r] = result.value
        return out


@pytest.fixture(scope="module")
def ggml() -> Ggml:
    return Ggml()


def _isas() -> list[str]:
    """Every ISA this CPU runs, or just the NumPy fallback when the extension is off."""
    if not kernels.AVAILABLE:
        return ["numpy"]
    before, usable = kernels.active_isa(), []
    for name in ("scalar", "avx2", "avxvnni", "avx512", "neon", "dotprod"):
        try:
            kernels._ext.set_isa(name)
        except ValueError:  # not this CPU
            continue
        usable.append(name)
    kernels._ext.set_isa(before)
    return usable


@pytest.fixture(params=_isas())
def isa(request):
    """Run the test on one ISA, then restore the one that was active."""
    if request.param == "numpy":
        yield request.param
        return
    before = kernels.active_isa()
    kernels._ext.set_isa(request.param)
    try:
        yield request.param
    finally:
        kernels._ext.set_isa(before)


def llama_weights(ggml: Ggml, qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Weights as llama.cpp's quantizer writes them: heavy-tailed floats, an importance matrix where required."""
    x = rng.standard_t(5, (rows, cols)).astype(np.float32) * rng.uniform(0.005, 0.05, (rows, 1)).astype(np.float32)
    imatrix = rng.uniform(0.1, 2.0, cols).astype(np.float32) if ggml.requires_imatrix(qtype) else None
    return ggml.quantize(qtype, x, imatrix)


def test_only_the_two_smallest_iq2_types_need_an_importance_matrix(ggml):
    assert [t.name for t in NEW_TYPES if ggml.requires_imatrix(t)] == ["IQ2_XXS", "IQ2_XS"]


@pytest.mark.parametrize("qtype", NEW_TYPES + OLD_TYPES, ids=lambda t: t.name)
def test_dequantize_equals_llama_cpp_block_for_block(ggml, qtype):
    rng = np.random.default_rng(int(qtype) + 200)
    w = llama_weights(ggml, qtype, 6, 512, rng)
    want = ggml.dequantize(qtype, w)
    got = kernels.get_rows(w, qtype, np.arange(6))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


_PRODUCT_CASES: dict[T, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}


def product_case(ggml: Ggml, qtype: T):
    """Weights, activations, llama.cpp's product and |W| of one type; computed once for every ISA's test."""
    if qtype not in _PRODUCT_CASES:
        rng = np.random.default_rng(int(qtype) + 300)
        cols = 768  # three super-blocks, 24 blocks of 32
        w = llama_weights(ggml, qtype, 37, cols, rng)
        x = rng.standard_normal((5, cols)).astype(np.float32) * rng.uniform(0.1, 10, (5, 1)).astype(np.float32)
        want = ggml.matmul(qtype, w, x).astype(np.float64)
        _PRODUCT_CASES[qtype] = (w, x, want, np.abs(ggml.dequantize(qtype, w).astype(np.float64)))
    return _PRODUCT_CASES[qtype]


@pytest.mark.parametrize("qtype", NEW_TYPES + OLD_TYPES, ids=lambda t: t.name)
def test_products_match_llama_cpp(ggml, qtype, isa):
    w, x, want, w_abs = product_case(ggml, qtype)
    cols = x.shape[1]
    got = kernels.matmul(w, qtype, x).astype(np.float64)
    magnitude = np.abs(x.astype(np.float64)) @ w_abs.T
    act_block = GGML_QUANT_SIZES[qtype][0]
    allowed = (1e-5 if act_block == 256 else 5e-4) * magnitude
    if isa == "numpy":  # float activations: llama.cpp's own rounding of them, at most half a step each, remains
        amax = np.abs(x.astype(np.float64)).reshape(len(x), -1, act_block).max(axis=-1, keepdims=True)
        half_step = np.broadcast_to(amax / 127 * 0.5001, (len(x), cols // act_block, act_block)).reshape(len(x), cols)
        allowed = allowed + half_step @ w_abs.T
    err = np.abs(got - want)
    worst = np.unravel_index(np.argmax(err / allowed), err.shape)
    assert np.all(err <= allowed), f"{qtype.name} on {isa}: {got[worst]} vs llama.cpp {want[worst]} at {worst}"
