"""The IQ types' prompt-chunk products (kernels_avx512_iq.c: each block decoded once per task for every token)
against the portable C kernels and gguf's dequantizer, for every chunk length from one token up, odd row
counts (a task's rows past its last full group of 16 take the row kernels) and rows over several tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine.backends.cpu import kernels
from tests.engine.test_cpu_kernels import assert_matches, random_weights

T = GGMLQuantizationType
REPO = Path(__file__).resolve().parents[2]
IQ_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_XS)
TOKEN_COUNTS = tuple(range(1, 21)) + (33, 64)
ROWS = (1, 15, 16, 17, 79, 143)  # 143: two full 64-row tasks and a task of 15 rows
COLS = 3 * 256


def _case(qtype: T, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([int(qtype), rows, seed])
    w = random_weights(qtype, rows, COLS, rng)
    x = rng.standard_normal((max(TOKEN_COUNTS), COLS)).astype(np.float32) * rng.uniform(0.1, 10, (max(TOKEN_COUNTS), 1)).astype(np.float32)
    return w, x


def _products(qtype: T, rows: int) -> dict[int, np.ndarray]:
    w, x = _case(qtype, rows, 0)
    return {n: kernels.matmul(w, qtype, x[:n]) for n in TOKEN_COUNTS}


def _scalar_products(tmp_path: Path) -> dict[str, list]:
    """Every case of this file on the portable C kernels, in a child process that selects them."""
    script = (
        "import json, sys\n"
        "from tests.engine.test_cpu_iq_gemm import IQ_TYPES, ROWS, _products\n"
        "from engine.backends.cpu import kernels\n"
        "assert kernels.active_isa() == 'scalar'\n"
        "out = {f'{int(t)}/{r}/{n}': v.tolist() for t in IQ_TYPES for r in ROWS for n, v in _products(t, r).items()}\n"
        "json.dump(out, open(sys.argv[1], 'w'))\n"
    )
    path = tmp_path / "scalar.json"
    env = dict(os.environ, **{kernels.ISA_ENV: "scalar"})
    subprocess.run([sys.executable, "-c", script, str(path)], cwd=REPO, env=env, check=True, timeout=600)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def scalar_products(tmp_path_factory):
    return _scalar_products(tmp_path_factory.mktemp("iq_gemm"))


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_chunk_products_match_the_portable_kernels_and_gguf(qtype, scalar_products):
    for rows in ROWS:
        w, x = _case(qtype, rows, 0)
        for n, got in _products(qtype, rows).items():
            want = np.asarray(scalar_products[f"{int(qtype)}/{rows}/{n}"], dtype=np.float32)
            scale = np.abs(want).max()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * scale, err_msg=f"{qtype.name} rows={rows} n={n}")
            assert_matches(w, qtype, x[:n], got)


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_every_token_of_a_chunk_gets_the_bits_it_gets_alone(qtype):
    """The decoded-tile product (from 9 tokens up) and the row kernels (one token) agree bit for bit."""
    w, x = _case(qtype, 143, 1)
    alone = np.concatenate([kernels.matmul(w, qtype, x[i:i + 1]) for i in range(len(x))])
    for n in (9, 17, 64, len(x)):
        np.testing.assert_array_equal(kernels.matmul(w, qtype, x[:n]), alone[:n], err_msg=f"{qtype.name} n={n}")
