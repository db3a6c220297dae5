"""Malformed GGUF files are refused with a ModelFormatError that names the problem, quickly and in bounded memory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.config import ModelConfig
from engine.gguf_file import GGUFFile, ModelFormatError, read_gguf
from engine.packed_strings import PackedStrings
from tests.engine.conftest import CASE_CPU_SECONDS, CASE_MAX_BYTES, CaseGuard
from tests.engine.gguf_builders import (
    ARRAY, BOOL, FLOAT32, FLOAT64, INT32, STRING, UINT8, UINT16, UINT32, UINT64, Q, RawGGUF, array, kv,
    small_valid, string, tensor_info, tiny_vocab, u32, u64, write_tiny_llama,
)
from tests.model_store import model_path

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
ARCH = kv("general.architecture", STRING, "llama")
ALIGN = kv("general.alignment", UINT32, 32)
# small_valid()'s tensors: (name, GGML shape, type), at relative offsets 0, 64 and 192 of a 320-byte data section
A, B, C = ("a.weight", (8, 2), Q.F32), ("b.weight", (32, 3), Q.Q8_0), ("c.weight", (64,), Q.F16)
GOOD = small_valid().to_bytes()


def with_kvs(*kvs: bytes) -> bytes:
    """small_valid() with these metadata pairs after general.architecture."""
    return small_valid(kvs=[ARCH, *kvs]).to_bytes()


def with_infos(*infos: bytes) -> bytes:
    """small_valid() with these tensor-info records over its data section."""
    return small_valid(infos=list(infos)).to_bytes()


def bare(*kvs: bytes, **fields) -> bytes:
    """A file that ends right after these metadata pairs (no tensors, no padding), so 'one byte past EOF' is exact."""
    return RawGGUF(kvs=list(kvs), alignment=1, **fields).to_bytes()


def key_and_type(key: str, vtype: int) -> bytes:
    return string(key) + u32(vtype)


def read_all(path: Path) -> dict[str, tuple[int, ...]]:
    """Open, touch every tensor's bytes, close; returns the raw() shape of each tensor."""
    with read_gguf(path) as f:
        return {name: f.raw(name).shape for name in f.tensors}


def assert_rejected(guard: CaseGuard, path: Path, data: bytes, match: str, label: str) -> None:
    path.write_bytes(data)
    outcome = guard.run(label, lambda: read_all(path))
    assert isinstance(outcome.error, ModelFormatError), f"{label}: expected ModelFormatError, got {outcome.error!r}"
    assert re.search(match, str(outcome.error)), f"{label}: message {str(outcome.error)!r} does not match {match!r}"


def cases(*params: tuple[str, bytes, str]) -> list:
    return [pytest.param(data, match, id=name) for name, data, match in params]


# -- header ------------------------------------------------------------------------------------------------
HEADER = cases(
    ("empty_file", b"", r"too small to be GGUF \(0 bytes\)"),
    ("one_byte", b"G", r"too small to be GGUF \(1 bytes\)"),
    ("magic_only", b"GGUF", r"too small to be GGUF \(4 bytes\)"),
    ("header_one_byte_short", GOOD[:23], r"too small to be GGUF \(23 bytes\)"),
    ("magic_GGML", b"GGML" + GOOD[4:], r"not a GGUF file \(magic b'GGML'"),
    ("magic_lowercase", b"gguf" + GOOD[4:], r"not a GGUF file"),
    ("magic_zeros", bytes(4) + GOOD[4:], r"not a GGUF file"),
    ("version_0", small_valid(version=0).to_bytes(), r"unsupported GGUF version 0\b"),
    ("version_1", small_valid(version=1).to_bytes(), r"unsupported GGUF version 1\b"),
    ("version_4", small_valid(version=4).to_bytes(), r"unsupported GGUF version 4\b"),
    ("version_u32_max", small_valid(version=U32_MAX).to_bytes(), rf"unsupported GGUF version {U32_MAX}"),
    ("big_endian_v3", small_valid(version=0x03000000).to_bytes(), r"big-endian"),
    ("big_endian_v2", small_valid(version=0x02000000).to_bytes(), r"big-endian"),
    ("big_endian_header", b"GGUF" + (3).to_bytes(4, "big") + (3).to_bytes(8, "big") + (2).to_bytes(8, "big") + GOOD[24:],
     r"big-endian"),
)


@pytest.mark.parametrize("data, match", HEADER)
def test_bad_header(data: bytes, match: str, tmp_path: Path, case_guard: CaseGuard, request: pytest.FixtureRequest):
    assert_rejected(case_guard, tmp_path / "m.gguf", data, match, request.node.callspec.id)


SYSFS_FILE = Path("/sys/kernel/uevent_seqnum")  # a regular file of 4096 bytes that cannot be memory-mapped
NOT_A_FILE = [("missing", r"cannot open .*No such file"), ("directory", r"is not a regular file"),
              ("fifo", r"is not a regular file")] + ([("unmappable", r"cannot memory-map")] if SYSFS_FILE.exists() else [])


@pytest.mark.timeout(10)  # a reader that opens the FIFO blocks forever
@pytest.mark.parametrize("kind, match", NOT_A_FILE)
def test_not_a_model_file(kind: str, match: str, tmp_path: Path, case_guard: CaseGuard):
    path = SYSFS_FILE if kind == "unmappable" else tmp_path / "model.gguf"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    outcome = case_guard.run(kind, lambda: read_gguf(path))
    assert isinstance(outcome.error, ModelFormatError) and re.search(match, str(outcome.error)), outcome.error


# -- counts ------------------------------------------------------------------------------------------------
COUNTS = cases(
    ("n_tensors_2^63", small_valid(n_tensors=2**63).to_bytes(), rf"tensor count {2**63} is impossible"),
    ("n_tensors_u64_max", small_valid(n_tensors=U64_MAX).to_bytes(), rf"tensor count {U64_MAX} is impossible"),
    ("n_kv_2^63", small_valid(n_kv=2**63).to_bytes(), rf"metadata count {2**63} is impossible"),
    ("n_kv_u64_max", small_valid(n_kv=U64_MAX).to_bytes(), rf"metadata count {U64_MAX} is impossible"),
    ("n_kv_one_too_many", bare(ARCH, n_kv=2), r"metadata key #1 runs past the end of the file"),
    ("n_tensors_one_too_many", bare(ARCH, n_tensors=1), r"name of tensor #0 runs past the end of the file"),
)


@pytest.mark.parametrize("data, match", COUNTS)
def test_impossible_counts(data: bytes, match: str, tmp_path: Path, case_guard: CaseGuard, request: pytest.FixtureRequest):
    assert_rejected(case_guard, tmp_path / "m.gguf", data, match, request.node.callspec.id)


# -- strings -----------------------------------------------------------------------------------------------
STRINGS = cases(
    ("key_length_u64_max", with_kvs(string("k", length=U64_MAX) + u32(UINT8) + b"\1"),
     rf"metadata key #1 is {U64_MAX} bytes long \(at most 65535\)"),
    ("key_length_2^16", with_kvs(string("k" * 2**16) + u32(UINT8) + b"\1"), r"metadata key #1 is 65536 bytes long"),
    ("key_past_eof", bare(string("key_of_15_bytes", length=16)), r"metadata key #0 runs past the end of the file"),
    ("key_not_utf8", with_kvs(kv(b"\xff\xfe", UINT8, 1)), r"metadata key #1 is not valid UTF-8"),
    ("value_length_u64_max", with_kvs(key_and_type("k", STRING) + string("v", length=U64_MAX)),
     r"value of 'k' runs past the end of the file"),
    ("value_length_2^63", with_kvs(key_and_type("k", STRING) + string("v", length=2**63)), r"value of 'k' runs past the end"),
    ("value_one_past_eof", bare(key_and_type("k", STRING) + string("abc", length=4)), r"value of 'k' runs past the end"),
    ("value_not_utf8", with_kvs(kv("k", STRING, b"\xc3\x28")), r"value of 'k' is not valid UTF-8"),
    ("string_array_count_u64_max", with_kvs(key_and_type("k", ARRAY) + array(STRING, ["a", "b"], length=U64_MAX)),
     rf"array 'k' of {U64_MAX} strings runs past the end"),
    ("string_array_count_wraps_x8", with_kvs(key_and_type("k", ARRAY) + array(STRING, ["a"], length=2**61)),
     rf"array 'k' of {2**61} strings runs past the end"),
    ("string_array_one_too_many", bare(key_and_type("k", ARRAY) + array(STRING, ["abcdefgh", "abcdefgh"], length=3)),
     r"element 2 of 'k' runs past the end"),
    ("string_element_length_u64_max", with_kvs(key_and_type("k", ARRAY) + u32(STRING) + u64(2) + string("a")
                                                + string("b", length=U64_MAX)), r"element 1 of 'k' runs past the end"),
    ("string_element_one_past_eof", bare(key_and_type("k", ARRAY) + u32(STRING) + u64(2) + string("a")
                                         + string("bc", length=3)), r"element 1 of 'k' runs past the end"),
    ("string_element_not_utf8", with_kvs(key_and_type("k", ARRAY) + array(STRING, ["a", b"\xed\xa0\x80"])),
     r"element 1 of 'k' is not valid UTF-8"),
    # each element alone is cut mid-character, yet the elements run together are valid UTF-8 ("é")
    ("string_elements_split_a_character", with_kvs(key_and_type("k", ARRAY) + array(STRING, ["a", b"\xc3", b"\xa9"])),
     r"element 1 of 'k' is not valid UTF-8 \(unexpected end of data at byte 0\)"),
    ("string_element_starts_mid_character", with_kvs(key_and_type("k", ARRAY) + array(STRING, [b"a\xc3", b"\xa9b"])),
     r"element 0 of 'k' is not valid UTF-8"),
    ("string_element_not_utf8_then_eof", bare(key_and_type("k", ARRAY) + u32(STRING) + u64(3) + string("a")
                                              + string(b"\xff") + string("bc", length=3)),
     r"element 1 of 'k' is not valid UTF-8"),
)


@pytest.mark.parametrize("data, match", STRINGS)
def test_bad_strings(data: bytes, match: str, tmp_path: Path, case_guard: CaseGuard, request: pytest.FixtureRequest):
    assert_rejected(case_guard, tmp_path / "m.gguf", data, match, request.node.callspec.id)


# -- arrays and value types --------------------------------------------------------------------------------
def array_kv(etype: int, values: list, length: int | None = None) -> bytes:
    return key_and_type("k", ARRAY) + array(etype, values, length)


ARRAYS = cases(
    ("u8_count_u64_max", with_kvs(array_kv(UINT8, [1, 2], U64_MAX)), rf"array 'k' of {U64_MAX} elements runs past"),
    ("u16_count_wraps_x2", with_kvs(array_kv(UINT16, [1], 2**63)), rf"array 'k' of {2**63} elements runs past"),
    ("u32_count_wraps_x4", with_kvs(array_kv(UINT32, [1], 2**62)), rf"array 'k' of {2**62} elements runs past"),
    ("u64_count_wraps_x8", with_kvs(array_kv(UINT64, [1], 2**61)), rf"array 'k' of {2**61} elements runs past"),
    ("f64_one_past_eof", bare(array_kv(FLOAT64, [1.0, 2.0], 3)), r"array 'k' of 3 elements runs past the end"),
    ("nested_array", with_kvs(key_and_type("k", ARRAY) + u32(ARRAY) + u64(1) + array(UINT8, [1])), r"'k' is a nested array"),
    ("element_type_13", with_kvs(key_and_type("k", ARRAY) + u32(13) + u64(1) + b"\1"), r"'k' has invalid element type 13"),
    ("element_type_u32_max", with_kvs(key_and_type("k", ARRAY) + u32(U32_MAX) + u64(1) + b"\1"),
     rf"'k' has invalid element type {U32_MAX}"),
    ("element_type_byte_swapped", with_kvs(key_and_type("k", ARRAY) + u32(0x08000000) + u64(0)),
     r"invalid element type 134217728"),
    ("bool_array_holds_2", with_kvs(key_and_type("k", ARRAY) + u32(BOOL) + u64(3) + b"\0\1\2"),
     r"array 'k' holds a boolean that is not 0 or 1"),
)
VALUE_TYPES = cases(
    ("type_13", with_kvs(key_and_type("k", 13) + b"\1"), r"'k' has invalid value type 13"),
    ("type_255", with_kvs(key_and_type("k", 255) + b"\1"), r"'k' has invalid value type 255"),
    ("type_u32_max", with_kvs(key_and_type("k", U32_MAX) + b"\1"), rf"'k' has invalid value type {U32_MAX}"),
    ("type_byte_swapped_array", with_kvs(key_and_type("k", 0x09000000) + b"\1"), r"invalid value type 150994944"),
    ("bool_2", with_kvs(key_and_type("k", BOOL) + b"\2"), r"'k' is a boolean stored as 2"),
    ("bool_255", with_kvs(key_and_type("k", BOOL) + b"\xff"), r"'k' is a boolean stored as 255"),
    ("u64_value_past_eof", bare(key_and_type("k", UINT64) + b"\1\2\3\4"), r"value of 'k' runs past the end"),
    ("type_past_eof", bare(string("k" * 8) + b"\1\0"), r"type of 'kkkkkkkk' runs past the end"),
)


@pytest.mark.parametrize("data, match", ARRAYS + VALUE_TYPES)
def test_bad_values(data: bytes, match: str, tmp_path: Path, case_guard: CaseGuard, request: pytest.FixtureRequest):
    assert_rejected(case_guard, tmp_path / "m.gguf", data, match, request.node.callspec.id)


# -- keys --------------------------------------------------------------------------------------------------
KEYS = cases(
    ("empty_key", with_kvs(kv("", UINT8, 1)), r"metadata key #1 is empty"),
    ("duplicate_key", with_kvs(kv("general.architecture", STRING, "llama")), r"'general.architecture' appears twice"),
    ("duplicate_key_other_type", with_kvs(kv("x", UINT8, 1), kv("x", STRING, "y")), r"metadata key 'x' appears twice"),
)


@pytest.mark.parametrize("data, match", KEYS)
def test_bad_keys(data: bytes, match: str, tmp_path: Path, case_guard: CaseGuard, request: pytest.FixtureRequest):
    assert_rejected(case_guard, tmp_path / "m.gguf", data, match, request.node.callspec.id)


# -- tensor infos ------------------------------------------------------------------------------------------
def first_tensor(name: str | bytes = "a.weight", shape=(8, 2), qtype: int = Q.F32, offset: int = 0, n_dims=None) -> bytes:
    """small_valid() with its first tensor-info record replaced."""
    return with_infos(tensor_info(name, shape, qtype, offset, n_dims), tensor_info(*B, 64), tensor_info(*C, 192))


TENSORS = cases(
    ("n_dims_0", first_tensor(shape=()), r"'a.weight' has 0 dimensions"),
    ("n_dims_5", first_tensor(shape=(8, 2, 1, 1, 1)), r"'a.weight' has 5 dimensions"),
    ("n_dims_u32_max", first_tensor(n_dims=U32_MAX), rf"'a.weight' has {U32_MAX} dimensions"),
    ("zero_dim_first", first_tensor(shape=(0, 2)), r"'a.weight' has a zero dimension"),
    ("zero_dim_last", first_tensor(shape=(8, 2, 0)), r"'a.weight' has a zero dimension"),
    ("dims_product_2^64", first_tensor(shape=(2**32, 2**32)), r"'a.weight' has an overflowing shape"),
    ("dims_product_2^64_in_4d", first_tensor(shape=(2**16,) * 4), r"overflowing shape"),
    ("dim_2^63", first_tensor(shape=(2**63, 2)), r"overflowing shape"),
    ("dim_u64_max", first_tensor(shape=(U64_MAX,)), r"overflowing shape"),
    ("all_dims_u64_max", first_tensor(shape=(U64_MAX,) * 4), r"overflowing shape"),
    ("huge_but_representable", first_tensor(shape=(2**31, 2**30)), r"'a.weight' ends past the end of the file"),
    ("row_33_of_q8_0", first_tensor(shape=(33, 3), qtype=Q.Q8_0), r"row length 33 is not a multiple of the Q8_0 block size 32"),
    ("row_16_of_q4_0", first_tensor(shape=(16, 4), qtype=Q.Q4_0), r"row length 16 is not a multiple of the Q4_0 block size 32"),
    ("row_32_of_q4_k", first_tensor(shape=(32, 2), qtype=Q.Q4_K), r"Q4_K block size 256"),
    *[(f"type_{t}", first_tensor(qtype=t), rf"'a.weight' has unknown type {t}\b")
      for t in (4, 5, 31, 36, 42, 1000, 2**31, U32_MAX)],
    ("duplicate_name", with_infos(tensor_info(*A, 0), tensor_info("a.weight", *B[1:], 64), tensor_info(*C, 192)),
     r"tensor name 'a.weight' appears twice"),
    ("name_65_bytes", first_tensor(name="n" * 65), r"name of tensor #0 is 65 bytes long \(at most 64\)"),
    ("name_length_u64_max", with_infos(string("a", length=U64_MAX)), rf"name of tensor #0 is {U64_MAX} bytes long"),
    ("name_not_utf8", first_tensor(name=b"a\x80"), r"name of tensor #0 is not valid UTF-8"),
    ("shape_past_eof", bare(ARCH, n_tensors=1) + string("t") + u32(2) + u64(8), r"dimension 1 of 't' runs past the end"),
)


@pytest.mark.parametrize("data, match", TENSORS)
def test_bad_tensor_infos(data: bytes, match: str, tmp_path: Path, case_guard: CaseGuard, request: pytest.FixtureRequest):
    assert_rejected(case_guard, tmp_path / "m.gguf", data, match, request.node.callspec.id)


# -- tensor offsets ----------------------------------------------------------------------------------------
def offsets(a: int, b: int, c: int) -> bytes:
    return with_infos(tensor_info(*A, a), tensor_info(*B, b), tensor_info(*C, c))


OFFSETS = cases(
    ("same_offset", offsets(0, 0, 192), r"tensors 'a.weight' and 'b.weight' overlap"),
    ("partial_overlap", offsets(0, 64, 160), r"tensors 'b.weight' and 'c.weight' overlap"),
    ("misaligned_1", offsets(1, 64, 192), r"'a.weight' offset 1 is not aligned to 32"),
    ("misaligned_16", offsets(0, 80, 192), r"'b.weight' offset 80 is not aligned to 32"),
    ("wraps_u64_max", offsets(0, 64, U64_MAX), rf"'c.weight' offset {U64_MAX} is not aligned"),
    ("wraps_aligned", offsets(0, 64, 2**64 - 32), r"'c.weight' ends past the end of the file"),
    ("past_eof", offsets(0, 64, 320), r"'c.weight' ends past the end of the file"),
    ("data_one_byte_short", GOOD[:-1], r"'c.weight' ends past the end of the file"),
)


@pytest.mark.parametrize("data, match", OFFSETS)
def test_bad_offsets(data: bytes, match: str, tmp_path: Path, case_guard: CaseGuard, request: pytest.FixtureRequest):
    assert_rejected(case_guard, tmp_path / "m.gguf", data, match, request.node.callspec.id)


# -- general.alignment -------------------------------------------------------------------------------------
def alignment(vtype: int, v) -> bytes:
    return small_valid(kvs=[ARCH, kv("general.alignment", vtype, v)]).to_bytes()


ALIGNMENTS = cases(
    *[(f"alignment_{v}", alignment(UINT32, v), rf"general.alignment {v} is not a power of two")
      for v in (0, 3, 13, 2**17, 2**31, U32_MAX)],
    ("alignment_negative", alignment(INT32, -32), r"general.alignment -32 is not a power of two"),
    ("alignment_string", alignment(STRING, "32"), r"general.alignment must be an integer"),
    ("alignment_float", alignment(FLOAT32, 32.0), r"general.alignment must be an integer"),
    ("alignment_bool", alignment(BOOL, True), r"general.alignment must be an integer"),
    ("alignment_array", alignment(ARRAY, (UINT32, [32])), r"general.alignment must be an integer"),
)


@pytest.mark.parametrize("data, match", ALIGNMENTS)
def test_bad_alignment(data: bytes, match: str, tmp_path: Path, case_guard: CaseGuard, request: pytest.FixtureRequest):
    assert_rejected(case_guard, tmp_path / "m.gguf", data, match, request.node.callspec.id)


# -- truncation --------------------------------------------------------------------------------------------
TRUNCATED = r"runs past the end of the file|ends past the end of the file|too small to be GGUF|is impossible for a file"


def tiny_model_boundaries(path: Path) -> tuple[list[tuple[str, int]], int]:
    """(name, offset) of every field, tensor-info and tensor-data boundary, found by gguf-py's reader; and
    the end of the last tensor's data (a cut at or after it leaves a valid file)."""
    reader = gguf.GGUFReader(path)
    fields = list(reader.fields.values()) + [t.field for t in reader.tensors]
    out = [(f.name, f.offset) for f in fields] + [(f"end of {f.name}", f.offset + sum(p.nbytes for p in f.parts)) for f in fields]
    out += [(f"data of {t.name}", t.data_offset) for t in reader.tensors]
    out += [(f"end of data of {t.name}", t.data_offset + t.n_bytes) for t in reader.tensors]
    return sorted(set(out), key=lambda b: b[1]), max(t.data_offset + t.n_bytes for t in reader.tensors)


def small_boundaries() -> tuple[list[tuple[str, int]], int]:
    spec = small_valid()
    data_start = len(GOOD) - len(spec.data)
    tensor_ends = [("end of a", data_start + 64), ("end of b", data_start + 64 + 102), ("start of c", data_start + 192)]
    return spec.boundaries() + tensor_ends, len(GOOD)


def assert_cuts(guard: CaseGuard, data: bytes, path: Path, cuts: list[tuple[str, int]], valid_from: int) -> None:
    """Each cut below ``valid_from`` must be refused as truncated; each cut at or after it must open."""
    for name, cut in cuts:
        label = f"cut at {cut} ({name})"
        if cut < valid_from:
            assert_rejected(guard, path, data[:cut], TRUNCATED, label)
        else:
            path.write_bytes(data[:cut])
            outcome = guard.run(label, lambda: read_all(path))
            assert outcome.error is None, f"{label}: a file with all its tensor data was refused: {outcome.error}"


def test_truncated_at_every_section_boundary_of_small_file(tmp_path: Path, case_guard: CaseGuard):
    cuts, valid_from = small_boundaries()
    assert {"version", "metadata #1", "tensor info #2", "end of b"} <= {name for name, _ in cuts}
    assert_cuts(case_guard, GOOD, tmp_path / "t.gguf", cuts, valid_from)


def test_truncated_at_every_section_boundary_of_tiny_model(tiny_model_path: Path, tmp_path: Path, case_guard: CaseGuard):
    cuts, valid_from = tiny_model_boundaries(tiny_model_path)
    data = tiny_model_path.read_bytes()
    assert len(cuts) > 100 and valid_from <= len(data)
    assert_cuts(case_guard, data, tmp_path / "t.gguf", cuts, valid_from)


def test_truncated_at_every_byte_of_first_256(tiny_model_path: Path, tmp_path: Path, case_guard: CaseGuard):
    data = tiny_model_path.read_bytes()
    for cut in range(256):
        assert_rejected(case_guard, tmp_path / "t.gguf", data[:cut], TRUNCATED, f"cut at byte {cut}")


# -- metadata of the wrong type, seen by ModelConfig -------------------------------------------------------
CONFIG_METADATA = [
    pytest.param({"llama.block_count": "two"}, r"'llama.block_count' should be int, not str", id="block_count_string"),
    pytest.param({"llama.embedding_length": 64.0}, r"'llama.embedding_length' should be int, not float", id="n_embd_float"),
    pytest.param({"llama.attention.head_count": [4, 4]}, r"'llama.attention.head_count' should be int, not ndarray",
                 id="head_count_array"),
    pytest.param({"llama.context_length": True}, r"'llama.context_length' should be an integer, not a boolean",
                 id="context_length_bool"),
    pytest.param({"general.architecture": (7, gguf.GGUFValueType.UINT32)}, r"'general.architecture' should be str, not int",
                 id="architecture_int"),
    pytest.param({"llama.attention.layer_norm_rms_epsilon": "1e-5"},
                 r"'llama.attention.layer_norm_rms_epsilon' should be float, not str", id="rms_eps_string"),
    pytest.param({"llama.rope.freq_base": [1.0]}, r"'llama.rope.freq_base' should be float, not ndarray", id="rope_base_array"),
    pytest.param({"llama.block_count": None}, r"metadata has no 'llama.block_count'", id="block_count_missing"),
    pytest.param({"llama.block_count": 0}, r"block_count = 0 is out of range", id="block_count_0"),
    pytest.param({"llama.attention.head_count": U32_MAX}, rf"head_count = {U32_MAX} is out of range", id="head_count_u32_max"),
    pytest.param({"llama.attention.head_count_kv": 3}, r"head_count 4 is not a multiple of head_count_kv 3", id="kv_heads_3"),
    pytest.param({"general.architecture": "gpt2"}, r"unsupported architecture 'gpt2'", id="architecture_gpt2"),
]


@pytest.mark.parametrize("metadata, match", CONFIG_METADATA)
def test_wrong_metadata_type_refused_by_config(metadata: dict, match: str, tmp_path: Path, case_guard: CaseGuard,
                                               request: pytest.FixtureRequest):
    path = write_tiny_llama(tmp_path / "m.gguf", metadata=metadata)

    def load() -> ModelConfig:
        with read_gguf(path) as f:
            return ModelConfig.from_gguf(f)

    outcome = case_guard.run(request.node.callspec.id, load)
    assert isinstance(outcome.error, ModelFormatError), f"expected ModelFormatError, got {outcome.error!r}"
    assert re.search(match, str(outcome.error)), f"message {str(outcome.error)!r} does not match {match!r}"


# -- valid files open ----------------------------------------------------------------------------------------
VALID = [
    pytest.param(RawGGUF().to_bytes(), {}, id="empty_model_24_bytes"),
    pytest.param(small_valid(version=2).to_bytes(), {"general.alignment": 32}, id="version_2"),
    pytest.param(small_valid(kvs=[ARCH, kv("general.alignment", UINT32, 1)], alignment=1).to_bytes(),
                 {"general.alignment": 1}, id="alignment_1"),
    pytest.param(small_valid(kvs=[ARCH, kv("general.alignment", UINT32, 64)], alignment=64).to_bytes(),
                 {"general.alignment": 64}, id="alignment_64"),
    pytest.param(small_valid(kvs=[ARCH, kv("general.alignment", UINT64, 32)]).to_bytes(),
                 {"general.alignment": 32}, id="alignment_as_u64"),
    pytest.param(with_kvs(kv("s", STRING, ""), kv("t", BOOL, True), kv("f", BOOL, False), kv("n", INT32, -5),
                          kv("x", FLOAT64, 0.5)), {"s": "", "t": True, "f": False, "n": -5, "x": 0.5}, id="scalars"),
    pytest.param(bare(array_kv(UINT8, [])), {"k": []}, id="empty_u8_array_at_eof"),
    pytest.param(bare(array_kv(STRING, [])), {"k": []}, id="empty_string_array_at_eof"),
    pytest.param(bare(array_kv(BOOL, [True, False])), {"k": [True, False]}, id="bool_array"),
    pytest.param(with_kvs(array_kv(STRING, ["", "é", "<|im_end|>"])), {"k": ["", "é", "<|im_end|>"]}, id="string_array"),
    pytest.param(offsets(128, 192, 0), {}, id="tensors_out_of_order"),
    pytest.param(with_infos(tensor_info("n" * 64, *A[1:], 0), tensor_info(*B, 64), tensor_info(*C, 192)), {},
                 id="tensor_name_64_bytes"),
    pytest.param(with_infos(tensor_info("a.weight", (4, 2, 1, 2), Q.F32, 0), tensor_info(*B, 64), tensor_info(*C, 192)), {},
                 id="4d_tensor"),
]


@pytest.mark.parametrize("data, expected", VALID)
def test_valid_edge_cases_open(data: bytes, expected: dict, tmp_path: Path, case_guard: CaseGuard,
                               request: pytest.FixtureRequest):
    path = tmp_path / "v.gguf"
    path.write_bytes(data)

    def load() -> dict:
        with read_gguf(path) as f:
            return {k: v.tolist() if isinstance(v, np.ndarray) else list(v) if isinstance(v, PackedStrings) else v
                    for k, v in f.metadata.items()}

    outcome = case_guard.run(request.node.callspec.id, load)
    assert outcome.error is None, f"a valid file was refused: {outcome.error}"
    for key, value in expected.items():
        assert outcome.value[key] == value and type(outcome.value[key]) is type(value)


def test_tiny_model_matches_gguf_reader(tiny_model_path: Path):
    reader = gguf.GGUFReader(tiny_model_path)
    with read_gguf(tiny_model_path) as f:
        assert [t.name for t in reader.tensors] == list(f.tensors)
        for t in reader.tensors:
            info = f.tensor(t.name)
            assert (info.shape, info.qtype, info.offset, info.nbytes) == (tuple(t.shape.tolist()), t.tensor_type,
                                                                            t.data_offset, t.n_bytes)
            block_size, type_size = gguf.GGML_QUANT_SIZES[info.qtype]
            assert f.raw(t.name).shape == (info.n_elements // info.shape[0], info.shape[0] // block_size * type_size)
            assert f.raw(t.name).tobytes() == t.data.tobytes()
        assert f.metadata["tokenizer.ggml.tokens"] == tiny_vocab()[0]


def test_tiny_model_is_a_llama_config(tiny_model_path: Path):
    with read_gguf(tiny_model_path) as f:
        config = ModelConfig.from_gguf(f)
        tokens, types, merges = tiny_vocab()
        assert (config.arch, config.n_layers, config.n_embd, config.n_heads, config.n_kv_heads, config.n_ff) == (
            "llama", 2, 64, 4, 2, 128)
        assert (config.head_dim, config.n_vocab, config.n_ctx_train, config.tied_embeddings) == (16, len(tokens), 256, True)
        assert f.get("tokenizer.ggml.model", str) == "gpt2" and f.get("tokenizer.ggml.merges", PackedStrings) == merges
        control = [tokens[i] for i in np.flatnonzero(f.metadata["tokenizer.ggml.token_type"] == 3)]
        assert control == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        assert tokens[f.get("tokenizer.ggml.eos_token_id", int)] == "<|im_end|>"
        assert "<|im_start|>" in f.get("tokenizer.chat_template", str)


# -- real models -------------------------------------------------------------------------------------------
REAL_TENSOR_COUNTS = {"smollm2": 272, "gemma3": 236, "qwen25coder": 291}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_TENSOR_COUNTS))
def test_real_model_opens_with_packed_tensors(name: str):
    with read_gguf(model_path(name)) as f:
        assert len(f.tensors) == REAL_TENSOR_COUNTS[name]
        for info in f.tensors.values():
            block_size, type_size = gguf.GGML_QUANT_SIZES[info.qtype]
            raw = f.raw(info.name)
            assert raw.shape == (info.n_elements // info.shape[0], info.shape[0] // block_size * type_size)
            assert raw.base is not None and not raw.flags.writeable  # a view into the map, not a copy
        # llama.cpp's layout: tensors follow one another, each padded to the alignment, up to the end of the file
        padded = sum(-(-t.nbytes // f.alignment) * f.alignment for t in f.tensors.values())
        assert f.data_offset + padded - f.file_size in range(0, f.alignment)
        assert ModelConfig.from_gguf(f).n_vocab == len(f.metadata["tokenizer.ggml.tokens"])


@pytest.mark.slow
def test_smollm2_matches_gguf_reader():
    path = model_path("smollm2")
    reader = gguf.GGUFReader(path)
    with read_gguf(path) as f:
        for t in reader.tensors:
            info = f.tensor(t.name)
            assert (info.shape, info.qtype, info.offset, info.nbytes) == (tuple(t.shape.tolist()), t.tensor_type,
                                                                            t.data_offset, t.n_bytes)
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template", "llama.block_count"):
            assert f.metadata[key] == reader.fields[key].contents(), key


# -- a few worst cases, measured in a fresh process ----------------------------------------------------------
_CHILD = """
import json, sys, time
import psutil
from engine.gguf_file import ModelFormatError, read_gguf

LINUX = sys.platform.startswith("linux")

def peak_rss():  # Linux: this process's own high-water mark (ru_maxrss includes the parent's, inherited over fork)
    if not LINUX:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

if LINUX:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current RSS
rss_start = psutil.Process().memory_info().rss
start, cpu_start = time.perf_counter(), time.process_time()
try:
    read_gguf(sys.argv[1]).close()
    error = None
except ModelFormatError as e:
    error = str(e)
cpu_seconds, seconds = time.process_time() - cpu_start, time.perf_counter() - start
print(json.dumps({"cpu_seconds": cpu_seconds, "seconds": seconds, "additional_peak_bytes": max(0, peak_rss() - rss_start),
                  "error": error}))
"""

N_STRINGS = 400_000  # a 4 MB file of two-byte strings: each costs 10 bytes in the file and ~50 as a Python str


def many_strings_then_eof() -> bytes:
    body = string("ab") * N_STRINGS
    return bare(key_and_type("k", ARRAY) + u32(STRING) + u64(N_STRINGS + 1) + body)


WORST = [
    pytest.param(lambda: small_valid(n_kv=U64_MAX).to_bytes(), r"metadata count .* is impossible", id="n_kv_u64_max"),
    pytest.param(lambda: with_kvs(array_kv(STRING, ["a"], U64_MAX)), r"strings runs past the end", id="string_array_u64_max"),
    pytest.param(many_strings_then_eof, rf"element {N_STRINGS} of 'k' runs past the end", id="400k_strings_then_eof"),
    pytest.param(lambda: first_tensor(shape=(2**31, 2**30)), r"ends past the end", id="2^61_element_tensor"),
    *[pytest.param(lambda name=name: model_path(name), None, id=name, marks=pytest.mark.slow)
      for name in ("smollm2", "gemma3", "qwen25coder")],
]


@pytest.mark.parametrize("make, match", WORST)
def test_worst_cases_in_a_fresh_process(make, match: str | None, tmp_path: Path):
    """Honest peak memory: the child's peak RSS minus its RSS before the open; CPU time, as the machine may be shared."""
    made = make()
    path = made if isinstance(made, Path) else tmp_path / "w.gguf"
    if not isinstance(made, Path):
        path.write_bytes(made)
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path)], cwd=repo, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    if match is None:
        assert result["error"] is None, result["error"]
    else:
        assert result["error"] is not None and re.search(match, result["error"]), result["error"]
    assert result["cpu_seconds"] < CASE_CPU_SECONDS, result
    assert result["additional_peak_bytes"] < CASE_MAX_BYTES, result
