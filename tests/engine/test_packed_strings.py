"""Packed string arrays and their hash index, which hold the vocabulary and merges of a GGUF tokenizer."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine import packed_strings
from engine.backends.cpu import kernels
from engine.packed_strings import PackedStrings, StringIndex



@pytest.fixture(autouse=True, params=["c", "python"])
def string_path(request, monkeypatch):
    """Every test runs on the C extension's index and on the Python fallback."""
    if request.param == "c":
        assert packed_strings.string_extension() is not None, "the CPU extension is not built"
    else:
        monkeypatch.setattr(packed_strings, "_C", False)
    return request.param


WORDS = ["", "a", "ab", "é", "Ġthe", "\u2581hello", "<|im_end|>", "日本語", "\U0001f600", "a b", "ab"]


def test_elements_read_back_as_the_strings():
    packed = PackedStrings.from_strings(WORDS)
    assert len(packed) == len(WORDS)
    assert list(packed) == WORDS and packed == WORDS and packed != WORDS[:-1]
    assert [packed[i] for i in range(-len(WORDS), len(WORDS))] == WORDS + WORDS
    assert packed[2:5] == WORDS[2:5] and packed[::-3] == WORDS[::-3]
    assert packed.byte_lengths().tolist() == [len(w.encode()) for w in WORDS]
    assert packed.nbytes == sum(len(w.encode()) for w in WORDS) + 4 * (len(WORDS) + 1)
    for outside in (len(WORDS), -len(WORDS) - 1):
        with pytest.raises(IndexError):
            packed[outside]


def test_index_finds_every_string_and_nothing_else():
    rng = random.Random(0)
    words = list(dict.fromkeys("".join(rng.choices("abcĠé ", k=rng.randint(1, 8))) for _ in range(20_000)))
    index = StringIndex(PackedStrings.from_strings(words))
    assert len(index) == len(words) and index.duplicates == 0
    assert all(index[w] == i for i, w in enumerate(words))
    absent = ["z" + w for w in words[:2000]] + ["abcabcabc", "", "é" * 9]
    assert all(index.get(w) is None and w not in index for w in absent)
    assert index.get("missing", -1) == -1 and 5 not in index
    with pytest.raises(KeyError):
        index["missing"]


def test_the_first_of_equal_strings_wins_and_the_rest_are_counted():
    index = StringIndex(PackedStrings.from_strings(WORDS + ["a", "é"]))
    assert index["ab"] == 2 and index["a"] == 1 and index["é"] == 3 and index[""] == 0
    assert index.duplicates == 3 and len(index) == len(WORDS) - 1


def test_an_empty_array_has_an_empty_index():
    packed = PackedStrings(b"", [])
    assert len(packed) == 0 and list(packed) == [] and packed == []
    index = StringIndex(packed)
    assert len(index) == 0 and index.get("a") is None


def test_lone_surrogates_and_non_strings_are_looked_up_like_a_dict():
    index = StringIndex(PackedStrings.from_strings(["a", "\udc80x", "b"]))
    assert index["\udc80x"] == 1 and index.get("\udc80") is None
    assert index.get(b"a") is None and index.get(None, 7) == 7 and 1 not in index


def test_a_long_vocabulary_with_duplicates_keeps_every_first_position(string_path):
    rng = random.Random(1)
    words = ["".join(rng.choices("abcdefgĠé日 ", k=rng.randint(0, 12))) for _ in range(60_000)]
    index = StringIndex(PackedStrings.from_strings(words))
    first = {}
    for i, w in enumerate(words):
        first.setdefault(w, i)
    assert len(index) == len(first) and index.duplicates == len(words) - len(first)
    assert all(index[w] == i for w, i in first.items())
    slots = 1 << (2 * len(words) - 1).bit_length()
    assert index.nbytes == 4 * slots + 4 * len(words)


def test_the_c_utf8_check_agrees_with_pythons_decoder(string_path):
    ext = kernels._ext  # the extension itself, on both parametrizations
    assert ext is not None, "the CPU extension is not built"
    rng = random.Random(2)
    pieces = [b"a", b"\xc3\xa9", b"\xe6\x97\xa5", b"\xf0\x9f\x98\x80", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80",
              b"\xf4\x90\x80\x80", b"\xe0\x80\xaf", b"\xf0\x8f\xbf\xbf", b"\xc3", b"\xff", b"\xef\xbf\xbf"]
    for _ in range(3000):
        element = b"".join(rng.choices(pieces, k=rng.randint(0, 4)))
        cut = rng.randint(0, len(element))  # a character split between two elements is invalid in both
        data, ends = element, np.array([cut, len(element)], np.uint64)
        try:
            data[:cut].decode("utf-8"), data[cut:].decode("utf-8")
            expected = -1
        except UnicodeDecodeError:
            expected = 0 if not _decodes(data[:cut]) else 1
        assert ext.first_invalid_utf8(data, ends.tobytes()) == expected, (data, cut)


def _decodes(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
