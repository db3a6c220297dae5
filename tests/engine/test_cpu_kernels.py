"""The C kernels against gguf's NumPy dequantizer: every type, awkward sizes, every ISA this CPU runs.

Tolerance for the types whose activations are quantized to 8 bits: each activation x_j is replaced by
d * round(x_j / d) with d = amax(block of x_j) / 127, an error of at most d / 2. The product's error is
then at most sum_j |W_ij| * d_j / 2 (plus float rounding), which the tests compute per output element and
assert; a wrong nibble order, scale or offset misses it by orders of magnitude. Float weight types
(F32, F16, BF16) get float tolerance only.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engine.backends.cpu import kernels

T = GGMLQuantizationType
REPO = Path(__file__).resolve().parents[2]

# Byte offsets of the float16 scale fields in each block; every other byte of a block may take any value.
SCALE_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.TQ1_0: (52,), T.TQ2_0: (64,), T.IQ4_NL: (0,), T.IQ4_XS: (0,), T.MXFP4: (),
    T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,), T.IQ3_S: (0,),
}
# Byte offsets of e8m0 (power-of-two) scale bytes: MXFP4's shared exponent.
E8M0_FIELDS = {T.MXFP4: (0,)}
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
ALL_TYPES = tuple(SCALE_FIELDS) + FLOAT_TYPES
ISA_REQUIREMENTS = {
    "scalar": (), "avx2": ("avx2", "fma", "f16c"), "avxvnni": ("avx2", "fma", "f16c", "avxvnni"),
    "avx512": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni"),
    "neon": ("neon",), "dotprod": ("neon", "dotprod"),
}


def random_weights(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Packed rows (rows, row_bytes): random bytes with sane float16 scales, or quantized floats."""
    if qtype in FLOAT_TYPES:
        packed = quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype).view(np.uint8)
        return packed.reshape(rows, cols * GGML_QUANT_SIZES[qtype][1])
    block, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows, cols // block, type_size), dtype=np.uint8)
    for offset in SCALE_FIELDS[qtype]:
        scales = rng.uniform(0.002, 0.02, (rows, cols // block)) * rng.choice([-1, 1], (rows, cols // block))
        blocks[..., offset:offset + 2] = scales.astype(np.float16)[..., None].view(np.uint8)
    for offset in E8M0_FIELDS.get(qtype, ()):  # 2^-9 .. 2^-5 (stored exponent 118..122; halved by the type)
        blocks[..., offset] = rng.integers(118, 123, (rows, cols // block))
    return blocks.reshape(rows, cols // block * type_size)


def reference(w: np.ndarray, qtype: T, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x @ W.T in float64 and the allowed error of each element."""
    W = dequantize(w, qtype).astype(np.float64).reshape(w.shape[0], -1)
    x64 = x.astype(np.float64)
    rounding = 2e-5 * (np.abs(x64) @ np.abs(W).T) + 1e-30
    if qtype in FLOAT_TYPES:
        return x64 @ W.T, rounding
    act_block = 32 if GGML_QUANT_SIZES[qtype][0] == 32 else 256
    n, cols = x.shape
    amax = np.abs(x64).reshape(n, cols // act_block, act_block).max(axis=-1, keepdims=True)
    half_step = np.broadcast_to(amax / 127 * 0.5001, (n, cols // act_block, act_block)).reshape(n, cols)
    return x64 @ W.T, half_step @ np.abs(W).T + rounding


def assert_matches(w: np.ndarray, qtype: T, x: np.ndarray, got: np.ndarray) -> None:
    want, tol = reference(w, qtype, x)
    err = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(np.argmax(err / tol), err.shape)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(err <= tol), f"{qtype.name}: error {err[worst]:.3g} > allowed {tol[worst]:.3g} at {worst}"


def test_extension_is_built_unless_disabled():
    if os.environ.get(kernels.ISA_ENV) == "numpy":
        assert not kernels.AVAILABLE and kernels.active_isa() == "numpy"
    else:
        assert kernels.AVAILABLE, "the C extension did not import: run `pip install -e . --no-deps`"


def test_requested_isa_is_the_active_one():
    requested = os.environ.get(kernels.ISA_ENV)
    if requested:
        assert kernels.active_isa() == requested
    else:  # the best this CPU runs
        usable = [isa for isa, needs in ISA_REQUIREMENTS.items() if all(kernels.cpu_features()[f] for f in needs)]
        assert kernels.active_isa() == usable[-1]


def test_supported_types_are_the_extension_types():
    assert kernels.SUPPORTED_TYPES == frozenset(int(t) for t in ALL_TYPES)
    if kernels.AVAILABLE:
        assert frozenset(kernels._ext.supported_types()) == kernels.SUPPORTED_TYPES


@pytest.mark.parametrize("n", [1, 2, 7, 13, 64])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_matches_reference(qtype, n):
    rng = np.random.default_rng([int(qtype), n])
    block = GGML_QUANT_SIZES[qtype][0]
    unit = 256 if block == 256 else 32
    for rows, cols in [(1, unit), (3, 3 * unit), (17, unit), (33, 2 * unit), (130, 5 * unit)]:
        if qtype in FLOAT_TYPES:
            cols += 5  # a tail outside the vector width
        w = random_weights(qtype, rows, cols, rng)
        x = rng.standard_normal((n, cols)).astype(np.float32) * rng.uniform(0.1, 10, (n, 1)).astype(np.float32)
        assert_matches(w, qtype, x, kernels.matmul(w, qtype, x))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_get_rows_matches_dequantize(qtype):
    rng = np.random.default_rng(int(qtype))
    unit = 256 if GGML_QUANT_SIZES[qtype][0] == 256 else 32
    w = random_weights(qtype, 9, 2 * unit + (3 if qtype in FLOAT_TYPES else 0), rng)
    ids = np.array([8, 0, 3, 3])
    want = dequantize(w, qtype).astype(np.float32).reshape(w.shape[0], -1)[ids]
    got = kernels.get_rows(w, qtype, ids)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_matmul_writes_into_out_and_accepts_a_row_slice():
    rng = np.random.default_rng(1)
    w = random_weights(T.Q4_K, 40, 512, rng)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    out = np.full((3, 20), np.nan, np.float32)
    result = kernels.matmul(w[10:30], T.Q4_K, x, out=out)
    assert result is out
    np.testing.assert_array_equal(out, kernels.matmul(w, T.Q4_K, x)[:, 10:30])


def test_results_do_not_depend_on_thread_count():
    rng = np.random.default_rng(2)
    w = random_weights(T.Q5_0, 1001, 896, rng)
    x = rng.standard_normal((5, 896)).astype(np.float32)
    before = kernels.get_threads()
    try:
        kernels.set_threads(1)
        one = kernels.matmul(w, T.Q5_0, x)
        kernels.set_threads(3)
        assert kernels.get_threads() == 3
        np.testing.assert_array_equal(kernels.matmul(w, T.Q5_0, x), one)
    finally:
        kernels.set_threads(before)


def test_concurrent_callers_get_their_own_results():
    rng = np.random.default_rng(3)
    w = random_weights(T.Q8_0, 300, 1024, rng)
    xs = [rng.standard_normal((k + 1, 1024)).astype(np.float32) for k in range(4)]
    want = [kernels.matmul(w, T.Q8_0, x) for x in xs]
    got: dict[int, list[np.ndarray]] = {}

    def run(k: int) -> None:
        got[k] = [kernels.matmul(w, T.Q8_0, xs[k]) for _ in range(20)]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        for result in got[k]:
            np.testing.assert_array_equal(result, want[k])


def test_a_forked_child_computes_instead_of_waiting_for_threads_it_lacks():
    rng = np.random.default_rng(8)
    w = random_weights(T.Q4_0, 2000, 512, rng)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    want = kernels.matmul(w, T.Q4_0, x)  # the pool has run in the parent
    pid = os.fork()
    if pid == 0:  # the child: exit status says whether the product matched
        ok = np.array_equal(kernels.matmul(w, T.Q4_0, x), want) and kernels.get_threads() == kernels.default_threads()
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0


def test_bad_arguments_raise_clear_errors():
    rng = np.random.default_rng(4)
    w = random_weights(T.Q8_0, 4, 64, rng)
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(ValueError, match="not supported"):
        kernels.matmul(w, T.IQ1_S, x)
    with pytest.raises(ValueError, match="float32"):
        kernels.matmul(w, T.Q8_0, np.zeros((2, 32), np.float32))
    with pytest.raises(ValueError, match="float32"):
        kernels.matmul(w, T.Q8_0, x.astype(np.float64))
    with pytest.raises(ValueError, match="out"):
        kernels.matmul(w, T.Q8_0, x, out=np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="blocks"):
        kernels.matmul(w[:, :30], T.Q8_0, x)
    square = random_weights(T.F32, 64, 64, rng)
    shared = np.zeros((2, 64), np.float32)
    with pytest.raises(ValueError, match="share memory"):
        kernels.matmul(square, T.F32, shared, out=shared)
    with pytest.raises(IndexError):
        kernels.get_rows(w, T.Q8_0, [4])
    with pytest.raises(ValueError):
        kernels.set_threads(0)


def test_empty_products():
    w = random_weights(T.Q4_0, 0, 64, np.random.default_rng(5))
    assert kernels.matmul(w, T.Q4_0, np.zeros((3, 64), np.float32)).shape == (3, 0)
    w = random_weights(T.Q4_0, 2, 64, np.random.default_rng(5))
    assert kernels.matmul(w, T.Q4_0, np.zeros((0, 64), np.float32)).shape == (0, 2)


def test_unknown_isa_is_refused():
    env = dict(os.environ, **{kernels.ISA_ENV: "sse9"})
    proc = subprocess.run([sys.executable, "-c", "import engine.backends.cpu.kernels"], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "sse9" in proc.stderr and "not supported here" in proc.stderr


def _usable_isas() -> list[str]:
    features = kernels.cpu_features()
    return [isa for isa, needs in ISA_REQUIREMENTS.items() if all(features[f] for f in needs)]


@pytest.mark.slow
def test_every_isa_and_the_numpy_fallback_pass_this_suite():
    """Rerun the fast tests of this file in a subprocess per ISA (scalar included) and with the extension off."""
    if os.environ.get(kernels.ISA_ENV):
        return  # already inside one of these runs
    assert "scalar" in _usable_isas()
    for isa in _usable_isas() + ["numpy"]:
        env = dict(os.environ, **{kernels.ISA_ENV: isa})
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", __file__],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, f"{isa}:\n{proc.stdout[-3000:]}"


@pytest.mark.slow
def test_c_crosscheck_of_every_isa_against_scalar(tmp_path):
    """The C harness (also used for arm64 under qemu) built with this machine's compiler: every ISA agrees
    with the scalar kernels on rows that start at odd addresses."""
    csrc = REPO / "engine/backends/cpu/csrc"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler: the extension itself could not have been built"
    exe = tmp_path / "crosscheck"
    sources = [REPO / "tests/engine/cpu_kernels_crosscheck.c", csrc / "matmul.c", csrc / "pool.c", *csrc.glob("kernels_*.c")]
    subprocess.run([cc, "-O2", "-pthread", f"-I{csrc}", *map(str, sources), "-lm", "-o", str(exe)], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout
    assert f"{len(_usable_isas()) - 1} ISAs checked against scalar, all agree" in proc.stdout


# -- the real test models -------------------------------------------------------------------------------

def _model_tensors(name: str):
    from engine.gguf_file import read_gguf
    from tests.model_store import model_path

    g = read_gguf(model_path(name))
    seen: set[tuple[T, str]] = set()
    for tname, info in g.tensors.items():
        kind = tname.split(".")[-2]
        if len(info.shape) != 2 or (info.qtype, kind) in seen:
            continue
        seen.add((info.qtype, kind))
        yield tname, info.qtype, g.raw(tname)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen25coder"])
def test_real_tensors_match_reference(model):
    rng = np.random.default_rng(6)
    checked = set()
    for tname, qtype, w in _model_tensors(model):
        rows = rng.choice(w.shape[0], size=min(w.shape[0], 96), replace=False)
        sub = np.ascontiguousarray(w[np.sort(rows)])
        cols = kernels.row_elements(qtype, w.shape[1])
        for n in (1, 5):
            x = rng.standard_normal((n, cols)).astype(np.float32)
            assert_matches(sub, qtype, x, kernels.matmul(sub, qtype, x))
        checked.add(qtype)
        if "token_embd" in tname:
            ids = rng.integers(0, w.shape[0], 7)
            want = dequantize(np.ascontiguousarray(w[ids]), qtype).astype(np.float32).reshape(7, -1)
            np.testing.assert_allclose(kernels.get_rows(w, qtype, ids), want, rtol=1e-6, atol=1e-7)
    assert checked  # every model has quantized matrices


@pytest.mark.slow
def test_the_kernel_bench_command_prints_its_numbers():
    from tests.engine.bench_cli import bench_json
    from tests.model_store import model_path

    report = bench_json("kernels", "--model", model_path("qwen25coder"), "--reps", "3", "--tensors",
                        "blk.0.ffn_up.weight")
    timing = report["tensors"]["blk.0.ffn_up.weight"]
    assert timing["type"] == "Q5_0" and timing["shape"] == [4864, 896]
    assert timing["matvec_gbps_1t"]["best"] > 0 and report["decode_pass"]["matrices"] == 169


@pytest.mark.slow
def test_whole_real_matrix_on_every_thread_count():
    """A full-size product (Qwen2.5's Q8_0 output matrix, 151936 rows) through the pool, checked on a sample."""
    from engine.gguf_file import read_gguf
    from tests.model_store import model_path

    g = read_gguf(model_path("qwen25coder"))
    w = g.raw("output.weight")
    x = np.random.default_rng(7).standard_normal((2, 896)).astype(np.float32)
    before = kernels.get_threads()
    try:
        results = []
        for threads in (1, 2):
            kernels.set_threads(threads)
            results.append(kernels.matmul(w, T.Q8_0, x))
    finally:
        kernels.set_threads(before)
    np.testing.assert_array_equal(results[0], results[1])
    sample = np.arange(0, w.shape[0], 997)
    assert_matches(np.ascontiguousarray(w[sample]), T.Q8_0, x, results[0][:, sample])


def _each_token_alone_is_the_batch(w, qtype, x) -> list[np.ndarray]:
    """Each token's product alone against its row of the batched product: the same bits in the C kernels, the same
    values to rounding in the NumPy fallback. Returns the products alone."""
    batched = kernels.matmul(w, qtype, x)
    alones = []
    for i in range(len(x)):
        alone = kernels.matmul(w, qtype, x[i:i + 1])
        if kernels.AVAILABLE:
            np.testing.assert_array_equal(alone, batched[i:i + 1])
        else:
            np.testing.assert_allclose(alone, batched[i:i + 1], rtol=1e-4, atol=1e-4 * np.abs(batched).max())
        alones.append(alone)
    return alones


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_a_token_gets_the_same_products_alone_as_in_any_batch(qtype):
    """Bit for bit in the C kernels, whatever the tile a token lands in: a batched decode step gives each sequence
    the logits it would get alone (130 rows: the 16-row kernels and the rows after them). The NumPy fallback's
    BLAS promises no such thing, only the same values to rounding."""
    rng = np.random.default_rng(int(qtype) + 100)
    unit = 256 if GGML_QUANT_SIZES[qtype][0] == 256 else 32
    w = random_weights(qtype, 130, 3 * unit, rng)
    x = rng.standard_normal((9, 3 * unit)).astype(np.float32)
    _each_token_alone_is_the_batch(w, qtype, x)


ONE_TOKEN_EXTREMES = {  # (block bytes, first code byte, two code bytes at the type's extremes)
    T.Q8_0: (34, 2, (0x80, 0x7F)),  # -128, 127
    T.MXFP4: (17, 1, (0xFF, 0x77)),  # -12 and 12 in both nibbles
    T.Q4_0: (18, 2, (0x00, 0xFF)),  # -8 and 7 in both nibbles
    T.IQ4_NL: (18, 2, (0x00, 0xFF)),  # the table's -127 and 113
}


@pytest.mark.parametrize("qtype", list(ONE_TOKEN_EXTREMES), ids=lambda t: t.name)
@pytest.mark.parametrize("blocks", [1, 2, 3, 8, 17, 97])
def test_one_token_decode_product_is_the_batched_products_bits(qtype, blocks):
    """A one-token product gives each of 3 x 16 rows and a tail the bits the 16-row GEMM gives that token inside a
    9-token batch, for odd and even block counts, with the extreme codes against activations at +-127, and within
    the reference's rounding. On AVX-512 the token runs its own kernels: Q8_0 two blocks of a row per vector,
    summed across lanes; Q4_0 and IQ4_NL eight blocks of 16 rows transposed with their scales (8, 17 and 97
    blocks: whole eights and the blocks after them); MXFP4 the 16-row kernel of small batches."""
    size, first, (low, high) = ONE_TOKEN_EXTREMES[qtype]
    rng = np.random.default_rng(300 + blocks + int(qtype))
    w = random_weights(qtype, 50, 32 * blocks, rng)
    codes = w.reshape(50, blocks, size)[..., first:]
    codes[:8] = low
    codes[8:16] = high
    x = rng.standard_normal((9, 32 * blocks)).astype(np.float32)
    x[1] = np.where(np.arange(32 * blocks) % 2, 1.0, -1.0)  # every activation quantized to +-127
    for i, alone in enumerate(_each_token_alone_is_the_batch(w, qtype, x)):
        assert_matches(w, qtype, x[i:i + 1], alone)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("blocks", [1, 3, 4, 5, 8, 11])
def test_one_token_k_quant_product_is_the_batched_products_bits_for_any_block_count(qtype, blocks):
    """A one-token K-quant product gives each of 37 rows (two 16-row tiles and a tail) the bits the 16-row GEMM
    gives that token inside a 9-token batch, for 1 to 11 super-blocks a row (a kernel that takes super-blocks
    in groups must give their tails the same bits), and within the reference's rounding."""
    rng = np.random.default_rng(400 + blocks + int(qtype))
    w = random_weights(qtype, 37, 256 * blocks, rng)
    x = rng.standard_normal((9, 256 * blocks)).astype(np.float32) * rng.uniform(0.1, 10, (9, 1)).astype(np.float32)
    for i, alone in enumerate(_each_token_alone_is_the_batch(w, qtype, x)):
        assert_matches(w, qtype, x[i:i + 1], alone)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL, T.MXFP4],
                         ids=lambda t: t.name)
def test_prompt_sized_products_equal_one_row_and_one_token_at_a_time(qtype):
    """The GEMM kernels (16 rows against up to 64 tokens, AVX-512) give the same bits as the kernels a decode
    step runs: 37 rows (two whole 16s and a tail) against 70 tokens (a 64-token tile, then 6), each token
    alone, and for the K-quants (whose GEMMs take the one-row kernels' integer sums and float steps, while their
    tail rows run the one-row kernel) each row alone; all of it within the reference's rounding."""
    rng = np.random.default_rng(int(qtype) + 200)
    cols = 3 * 256 + (32 if GGML_QUANT_SIZES[qtype][0] == 32 else 0)
    w = random_weights(qtype, 37, cols, rng)
    x = rng.standard_normal((70, cols)).astype(np.float32) * rng.uniform(0.1, 10, (70, 1)).astype(np.float32)
    full = kernels.matmul(w, qtype, x)
    assert_matches(w, qtype, x, full)
    others = [np.concatenate([kernels.matmul(w, qtype, x[t:t + 1]) for t in range(len(x))])]
    if qtype in (T.Q4_K, T.Q6_K):
        others.append(np.concatenate([kernels.matmul(w[r:r + 1], qtype, x) for r in range(len(w))], axis=1))
    for other in others:
        if kernels.AVAILABLE:
            np.testing.assert_array_equal(other, full)
        else:
            np.testing.assert_allclose(other, full, rtol=1e-4, atol=1e-4 * np.abs(full).max())


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_k_quant_products_at_the_extremes_of_codes_scales_and_activations(qtype):
    """Every code, scale and min at its largest (Q6_K: scales -128) against activations all quantized to 127:
    the integer sums of the 16-row kernels stay exact (no int16 or int32 overflow)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    blocks = np.full((32, 4, type_size), 0xFF, np.uint8)
    if qtype == T.Q6_K:
        blocks[..., 192:208] = 0x80  # int8 scales -128
    for offset in SCALE_FIELDS[qtype]:
        blocks[..., offset:offset + 2] = np.array([0.01], np.float16).view(np.uint8)
    w = blocks.reshape(32, 4 * type_size)
    for sign in (1, -1):
        x = np.full((20, 4 * block), 3.0 * sign, np.float32)
        assert_matches(w, qtype, x, kernels.matmul(w, qtype, x))
        assert_matches(w, qtype, x[:1], kernels.matmul(w, qtype, x[:1]))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_k_quant_products_are_float32_exact_on_exact_activations(qtype):
    """Activations whose 8-bit quantization is exact (integers times 2^-5, each 256 holding a 127): every product,
    one token alone and in a GEMM of 70, is the float64 dot of the dequantized rows to float32 rounding (each
    super-block's sum exact in integers, one rounded step per super-block), far inside assert_matches' bound.
    The NumPy fallback's float32 BLAS rounds more."""
    rng = np.random.default_rng(int(qtype) + 300)
    w = random_weights(qtype, 37, 8 * 256, rng)
    codes = rng.integers(-126, 127, (70, 8 * 256))
    codes[:, ::256] = 127
    x = (codes * 2.0 ** -5).astype(np.float32)
    exact = x.astype(np.float64) @ dequantize(w, qtype).astype(np.float64).reshape(37, -1).T
    for got in (kernels.matmul(w, qtype, x), kernels.matmul(w, qtype, x[:1])):
        error = np.abs(got - exact[:len(got)]).max() / np.abs(exact).max()
        assert error < (4e-7 if kernels.AVAILABLE else 2e-6), error  # the NumPy fallback: float32 BLAS sums
