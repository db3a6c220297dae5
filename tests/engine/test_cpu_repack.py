"""The 16-row layouts of Q4_0, IQ4_NL, Q4_K, Q8_0 and Q6_K (kernels.repack16): the same products, bit for bit, as
the file layout; refused where it does not apply; still right (by the portable kernel) if the ISA changes after
repacking."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.backends.cpu import kernels
from engine.backends.cpu.decoder import CpuDecoder
from engine.ggml_types import GGML_QUANT_SIZES as BLOCK  # type -> (elements, bytes) of a block

AVX512 = kernels.active_isa() == "avx512"


TYPES = [Q.Q4_0, Q.IQ4_NL, Q.Q4_K, Q.Q8_0, Q.Q6_K]


def packed(qtype: int, rows: int, nb: int, seed: int = 0) -> np.ndarray:
    """Random blocks whose float16 scales (Q4_K: d and dmin; Q6_K: d, its last two bytes) are ordinary numbers
    (0.4-1.0)."""
    rng = np.random.default_rng(seed)
    size = BLOCK[qtype][1]
    w = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    for high_byte in {Q.Q4_K: (1, 3), Q.Q6_K: (size - 1,)}.get(qtype, (1,)):
        w[:, :, high_byte] = rng.integers(0x36, 0x3c, (rows, nb))
    return w.reshape(rows, nb * size)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows, nb", [(16, 1), (16, 3), (48, 8), (32, 17), (16, 97)])
def test_repacked_products_are_the_file_layouts_bits(qtype, rows, nb):
    w = packed(qtype, rows, nb)
    repacked = kernels.repack16(w, qtype)
    if not AVX512:  # only the AVX-512 kernels read the layout: elsewhere nothing is copied
        assert repacked is None
        return
    w16, q16 = repacked
    assert w16.shape == w.shape and q16 == kernels.repack16_type(qtype, rows) and q16 not in kernels.SUPPORTED_TYPES
    rng = np.random.default_rng(nb)
    for n in (1, 2, 3, 4, 5, 8, 17, 70):  # one token, the 16-row kernels' tiles, the GEMM
        x = rng.standard_normal((n, nb * BLOCK[qtype][0]), dtype=np.float32)
        want, got = kernels.matmul(w, qtype, x), kernels.matmul(w16, q16, x)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), n


@pytest.fixture
def restore_stream_prefetch():
    default = kernels.stream_prefetch()
    yield default
    kernels.stream_prefetch(default)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("ahead", [0, 64, 4096, 1 << 20])
def test_the_stream_prefetch_does_not_change_a_product(qtype, ahead, restore_stream_prefetch):
    """One-token products over a repacked matrix prefetch their stream some bytes ahead (a page by default on
    Intel, none elsewhere): the prefetches, even past the matrix's end, change no bit."""
    w = packed(qtype, 48, 19)
    repacked = kernels.repack16(w, qtype)
    if not AVX512:
        return
    x = np.random.default_rng(ahead).standard_normal((3, 19 * BLOCK[qtype][0]), dtype=np.float32)
    want = kernels.matmul(w, qtype, x)
    assert kernels.stream_prefetch(ahead) == ahead == kernels.stream_prefetch()
    for n in (1, 2, 3):
        got = kernels.matmul(*repacked, x[:n])
        assert np.array_equal(got.view(np.uint32), want[:n].view(np.uint32)), n


def test_the_stream_prefetch_default_follows_the_cpu_and_refuses_bad_values(restore_stream_prefetch):
    cpuinfo = Path("/proc/cpuinfo")  # the vendor as Linux reports it; elsewhere no x86 CI runs
    intel = kernels.AVAILABLE and cpuinfo.exists() and "GenuineIntel" in cpuinfo.read_text()
    assert restore_stream_prefetch == (4096 if intel else 0)
    for bad in (-64, 100, (1 << 20) + 64):
        with pytest.raises(ValueError, match="multiple of 64"):
            kernels.stream_prefetch(bad)
    assert kernels.stream_prefetch() == restore_stream_prefetch


@pytest.mark.parametrize("qtype", TYPES)
def test_a_repacked_rows_values_are_the_file_layouts(qtype):
    """A tied embedding is repacked with the output: a token's row is read back from its group."""
    w = packed(qtype, 48, 131)  # more blocks than the row is put back together at a time
    ids = [0, 15, 16, 17, 31, 47, 5]
    want = kernels.get_rows(w, qtype, ids)
    repacked = kernels.repack16(w, qtype)
    if not AVX512:
        assert repacked is None
        return
    got = kernels.get_rows(*repacked, ids)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_repack_is_refused_where_it_does_not_apply():
    assert kernels.repack16(packed(Q.Q4_0, 17, 2), Q.Q4_0) is None  # not whole groups of 16 rows
    assert kernels.repack16(np.zeros((16, 22), np.uint8), Q.Q5_0) is None  # no 16-row layout for the type
    assert kernels.repack16_type(Q.Q4_0, 0) is None
    if not AVX512:
        assert kernels.repack16_type(Q.Q4_0, 16) is None
        return
    with pytest.raises(ValueError, match="out must be"):
        kernels.repack16(packed(Q.Q4_0, 16, 2), Q.Q4_0, np.zeros((16, 35), np.uint8))
    w16, q16 = kernels.repack16(packed(Q.Q4_0, 32, 4), Q.Q4_0)
    with pytest.raises(ValueError, match="groups of 16 rows"):
        kernels.matmul(w16[:24], q16, np.ones((1, 128), np.float32))


def test_the_decoders_copies_each_start_on_a_cache_line():
    """The decoder's copies share one allocation; each starts on a 64-byte line even after a copy whose size is not
    a multiple of 64 (16 rows of one Q4_0 block: 288 bytes), so the paired layouts' vectors lie on lines (hk.h)."""
    mats = [SimpleNamespace(qtype=q, blocks=packed(q, rows, nb, seed), nbytes=rows * nb * BLOCK[q][1])
            for seed, (q, rows, nb) in enumerate([(Q.Q4_0, 16, 1), (Q.Q8_0, 16, 3), (Q.Q6_K, 48, 1), (Q.Q4_0, 32, 4)])]
    released = []
    copies = CpuDecoder._repack(mats, released.append)
    if not AVX512:  # nothing is copied where no kernel reads the layout
        assert copies == {} and released == []
        return
    assert [id(b) for b in released] == [id(m.blocks) for m in mats]
    for m in mats:
        w16, q16 = copies[id(m)]
        assert w16.ctypes.data % 64 == 0
        assert np.array_equal(w16, kernels.repack16(m.blocks, m.qtype)[0]) and q16 == kernels.repack16_type(m.qtype, 16)


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("isa", ["scalar", "avx2"])
def test_another_isa_still_reads_a_repacked_matrix(isa, qtype):
    """A matrix repacked under AVX-512, then the ISA switched: the portable 16-row kernel reads it (its own
    float order, so close, not the same bits). Elsewhere nothing is repacked to begin with."""
    w = packed(qtype, 32, 9)
    repacked = kernels.repack16(w, qtype)
    if not AVX512:
        assert repacked is None
        return
    w16, q16 = repacked
    x = np.random.default_rng(3).standard_normal((3, 9 * BLOCK[qtype][0]), dtype=np.float32)
    before = kernels.active_isa()
    kernels._ext.set_isa(isa)
    try:
        want, got = kernels.matmul(w, qtype, x), kernels.matmul(w16, q16, x)
        assert kernels.repack16(w, qtype) is None
    finally:
        kernels._ext.set_isa(before)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
