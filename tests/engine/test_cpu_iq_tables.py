"""The IQ2/IQ3 grid and sign tables compiled into the C kernels are the gguf package's own."""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine.backends.cpu import gen_iq_tables


def _c_tables() -> dict[str, list[int]]:
    text = gen_iq_tables.SOURCE.read_text(encoding="utf-8")
    found = re.findall(r"const \w+ (\w+)\[(\d+)\] = \{([^}]*)\}", text)
    tables = {name: [int(v, 16) for v in body.replace(",", " ").split()] for name, _, body in found}
    assert all(len(tables[name]) == int(n) for name, n, _ in found)
    return tables


def test_checked_in_tables_are_what_the_generator_writes():
    assert gen_iq_tables.SOURCE.read_text(encoding="utf-8") == gen_iq_tables.render(), (
        "run `python -m engine.backends.cpu.gen_iq_tables`")


@pytest.mark.parametrize("cname,gname", gen_iq_tables.GRIDS)
def test_grids_equal_gguf(cname, gname):
    from gguf import quants

    cls = getattr(quants, gname)
    cls.init_grid()
    want = np.asarray(cls.grid, np.float32).reshape(cls.grid_shape)
    width = want.shape[1]
    words = np.array(_c_tables()[cname], dtype=np.uint64 if width == 8 else np.uint32)
    got = words.view(np.uint8).reshape(-1, width)  # the first value in the lowest byte
    np.testing.assert_array_equal(got.astype(np.float32), want)


def test_sign_tables_equal_gguf_and_each_other():
    from gguf import quants

    tables = _c_tables()
    ksigns = np.frombuffer(quants.IQ2_XXS.ksigns, np.uint8)
    assert tables["hk_ksigns"] == ksigns.tolist()
    factors = np.array(tables["hk_ksigns64"], np.uint64).view(np.int8).reshape(128, 8)
    bits = (ksigns[:, None] >> np.arange(8)) & 1
    np.testing.assert_array_equal(factors, np.where(bits == 1, -1, 1))
    assert np.all(np.unpackbits(ksigns).reshape(128, 8).sum(axis=1) % 2 == 0)  # the eighth bit makes parity even
