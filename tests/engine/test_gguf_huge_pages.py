"""The model map asks for 2 MiB pages for the weights and keeps the token embedding in 4 KiB pages (Linux)."""

from __future__ import annotations

import mmap
import os
import sys

import gguf
import numpy as np
import pytest

from engine.gguf_file import read_gguf, touch_pages

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


def _present_pages(view: np.ndarray, whole: bool = True) -> int:
    """How many pages under ``view`` (whole ones only, or every one it touches) this process has mapped
    (/proc/self/pagemap's bit 63)."""
    page = mmap.PAGESIZE
    start, end = view.ctypes.data, view.ctypes.data + view.nbytes
    first, last = (-(-start // page), end // page) if whole else (start // page, -(-end // page))
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first) * 8), np.uint64)
    return int(np.count_nonzero(entries >> np.uint64(63)))


def test_reading_a_small_tensor_does_not_map_its_released_neighbours_back(tmp_path):
    """A norm between two matrices the backend copied: reading it must not map the copied pages back into the
    resident set, as one 2 MiB page-cache folio mapped whole would."""
    path = tmp_path / "norm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.ffn_up.weight", np.ones((2048, 1024), np.float32))  # 8 MiB
    w.add_tensor("blk.1.attn_norm.weight", np.ones(1024, np.float32))
    w.add_tensor("blk.1.ffn_up.weight", np.ones((2048, 1024), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # the page cache as a load leaves it where the file system has large folios: filled through a map advised huge
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        m.madvise(mmap.MADV_HUGEPAGE)
        touch_pages(np.frombuffer(m, np.uint8))
    with read_gguf(path) as g:
        up0, norm, up1 = g.raw("blk.0.ffn_up.weight"), g.raw("blk.1.attn_norm.weight"), g.raw("blk.1.ffn_up.weight")
        g.release(up0)
        g.release(up1)
        touch_pages(norm)
        assert _present_pages(up0) == 0 and _present_pages(up1) == 0, (_present_pages(up0), _present_pages(up1))
        assert _present_pages(norm, whole=False) >= 1
