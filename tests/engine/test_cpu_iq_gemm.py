"""The IQ types' prompt-chunk products (kernels_x86_iq_gemm.inc: each block decoded once per task for every
token) on every ISA this CPU runs, against the portable C kernels and gguf's dequantizer: chunks of 1 to 12, 17
and 40 tokens (the products start at 9), odd row counts (a task's rows past its last full group take the row kernels), rows over
several tasks, and each token's bits alone against its bits in a chunk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine.backends.cpu import kernels
from tests.engine.test_cpu_kernels import ISA_REQUIREMENTS, assert_matches, random_weights

T = GGMLQuantizationType
REPO = Path(__file__).resolve().parents[2]
IQ_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_XS)
TOKEN_COUNTS = tuple(range(1, 13)) + (17, 40)
ROWS = (1, 17, 143)  # 17: a group and a row; 143: two full 64-row tasks and a task of 15 rows
COLS = 3 * 256
X86_ISAS = ("scalar", "avx2", "avxvnni", "avx512")


def _case(qtype: T, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([int(qtype), rows, seed])
    w = random_weights(qtype, rows, COLS, rng)
    n = max(TOKEN_COUNTS)
    x = rng.standard_normal((n, COLS)).astype(np.float32) * rng.uniform(0.1, 10, (n, 1)).astype(np.float32)
    return w, x


def _write_products(path: str) -> None:
    """In a child process with one ISA selected: every case's products, stacked in one .npz."""
    out = {}
    for qtype in IQ_TYPES:
        for rows in ROWS:
            w, x = _case(qtype, rows, 0)
            for n in TOKEN_COUNTS:
                out[f"{qtype.name}/{rows}/{n}"] = kernels.matmul(w, qtype, x[:n])
            alone = np.concatenate([kernels.matmul(w, qtype, x[i:i + 1]) for i in range(len(x))])
            out[f"{qtype.name}/{rows}/alone"] = alone
    np.savez(path, isa=kernels.active_isa(), **out)


def _usable_isas() -> list[str]:
    features = kernels.cpu_features()
    return [isa for isa in X86_ISAS if all(features[f] for f in ISA_REQUIREMENTS[isa])]


@pytest.fixture(scope="module")
def products(tmp_path_factory) -> dict[str, dict]:
    """Each usable ISA's products, computed in a child process that selects it."""
    tmp = tmp_path_factory.mktemp("iq_gemm")
    results = {}
    for isa in _usable_isas():
        path = tmp / f"{isa}.npz"
        script = f"from tests.engine.test_cpu_iq_gemm import _write_products; _write_products({str(path)!r})"
        env = dict(os.environ, **{kernels.ISA_ENV: isa})
        subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True, timeout=600)
        with np.load(path) as f:
            results[isa] = {k: f[k] for k in f.files}
        assert str(results[isa]["isa"]) == isa
    return results


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_chunk_products_match_the_portable_kernels_and_gguf(qtype, products):
    scalar = products["scalar"]
    for isa, got_all in products.items():
        for rows in ROWS:
            w, x = _case(qtype, rows, 0)
            for n in TOKEN_COUNTS:
                key = f"{qtype.name}/{rows}/{n}"
                got, want = got_all[key], scalar[key]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max(), err_msg=f"{isa} {key}")
                assert_matches(w, qtype, x[:n], got)


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_every_token_of_a_chunk_gets_the_bits_it_gets_alone(qtype, products):
    """The decoded-tile product (from 9 tokens up) and the row kernels (one token) agree bit for bit."""
    for isa, got_all in products.items():
        for rows in ROWS:
            alone = got_all[f"{qtype.name}/{rows}/alone"]
            for n in TOKEN_COUNTS:
                np.testing.assert_array_equal(got_all[f"{qtype.name}/{rows}/{n}"], alone[:n], err_msg=f"{isa} {qtype.name} rows={rows} n={n}")
