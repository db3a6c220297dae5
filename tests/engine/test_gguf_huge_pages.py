"""The model map asks for 2 MiB pages for the weights and keeps the token embedding in 4 KiB pages (Linux)."""

from __future__ import annotations

import mmap
import sys

import gguf
import numpy as np
import pytest

from engine.gguf_file import read_gguf

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="madvise flags are read from /proc/self/smaps")


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping of this process that holds ``address``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside = lo <= address < hi
            elif inside and head[0] == "VmFlags:":
                return set(head[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "pages.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.ones((1024, 1024), np.float32))  # 4 MiB
    w.add_tensor("blk.0.ffn_down.weight", np.ones((2048, 1024), np.float32))  # 8 MiB
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_weights_are_advised_huge_pages_and_the_embedding_is_not(model_file):
    with read_gguf(model_file) as g:
        embd, ffn = g.raw("token_embd.weight"), g.raw("blk.0.ffn_down.weight")
        assert "hg" in _vm_flags(ffn.ctypes.data + mmap.PAGESIZE)  # its first page may hold the embedding's end
        assert "hg" in _vm_flags(ffn.ctypes.data + ffn.nbytes - 1)
        for address in (embd.ctypes.data, embd.ctypes.data + embd.nbytes - 1):
            flags = _vm_flags(address)
            assert "nh" in flags and "hg" not in flags
        assert np.array_equal(np.frombuffer(ffn.tobytes(), np.float32), np.ones(2048 * 1024, np.float32))


def test_touch_pages_reads_one_byte_per_page_on_both_paths(implementation):
    from engine.gguf_file import touch_pages

    raw = np.random.default_rng(0).integers(0, 256, (97, 1031)).astype(np.uint8)
    raw.flags.writeable = False  # as the memory map's views are
    assert touch_pages(raw, 7) == int(raw.reshape(-1)[::7].sum()) > 0
    assert touch_pages(raw) == int(raw.reshape(-1)[::4096].sum())


def test_touch_tensors_reads_every_tensor_of_a_file(tiny_model_path):
    from engine.gguf_file import read_gguf, touch_pages, touch_tensors

    with read_gguf(tiny_model_path) as g:
        assert touch_tensors(g) == sum(touch_pages(g.raw(name)) for name in g.tensors) > 0
