"""Arrays of strings packed into one UTF-8 buffer, and a hash index over them.

A GGUF vocabulary holds 10^5 token texts and as many BPE merges. As Python ``str`` objects in lists and
dicts they cost about 70 bytes each and a dict entry more (about 40 MB for Qwen 2.5's); packed, a string
costs its UTF-8 bytes plus a 4-byte offset, and the index 4 bytes per slot plus a 4-byte hash tag per string.
Elements are decoded when read. The CPU extension (``strings.c``) builds and probes the index in C with the
GIL released, so loading a vocabulary does not pause other threads; without it the same index is built in Python.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

_C = None  # the CPU extension once loaded, False when it is unavailable; tests set False to force the fallback


def string_extension():
    """The C extension's string functions (``pack_strings``, ``StringTable``), or None without it."""
    global _C
    if _C is None:
        from .backends.native import extension  # noqa: PLC0415 - loaded on first use: it selects the CPU ISA

        ext = extension()
        _C = ext if ext is not None and hasattr(ext, "StringTable") else False
    return _C or None


_SLOTS_PER_STRING = 2  # hash-table slots per string: probes stay short (load factor at most 1/2)


def _offset_array(ends: np.ndarray | Sequence[int], total: int) -> array.array:
    """Offsets ``0, ends...`` as 4-byte ints when they fit, else 8-byte; an array.array reads as Python ints."""
    typecode, dtype = ("I", np.uint32) if total < 1 << 32 else ("Q", np.uint64)
    out = array.array(typecode, [0])
    out.frombytes(np.asarray(ends, dtype).tobytes())
    return out


class PackedStrings(Sequence[str]):
    """An immutable sequence of strings stored as one UTF-8 ``bytes`` and the offsets between them."""

    __slots__ = ("_data", "_offsets")

    def __init__(self, data: bytes, ends: np.ndarray | Sequence[int]):
        """Element ``i`` is ``data[ends[i - 1]:ends[i]]`` (from 0 for the first) decoded as UTF-8.

        The caller guarantees each element is valid UTF-8 (the GGUF reader checks it while parsing).
        """
        self._data = data
        self._offsets = _offset_array(ends, len(data))

    @classmethod
    def from_strings(cls, strings: Iterable[str]) -> PackedStrings:
        encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
        return cls(b"".join(encoded), list(itertools.accumulate(map(len, encoded))))

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        offsets, n = self._offsets, len(self._offsets) - 1
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} strings")
        index %= n
        return self._data[offsets[index]:offsets[index + 1]].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        data, offsets = self._data, self._offsets
        for i in range(len(offsets) - 1):
            yield data[offsets[i]:offsets[i + 1]].decode("utf-8", "surrogatepass")

    def __eq__(self, other) -> bool:
        if isinstance(other, PackedStrings):
            return self._data == other._data and self._offsets == other._offsets
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(repr(s) for s in self[:3])
        return f"PackedStrings([{shown}{', ...' if len(self) > 3 else ''}], {len(self)} strings)"

    def byte_lengths(self) -> np.ndarray:
        """(n,) the UTF-8 length of each element."""
        return np.diff(np.frombuffer(self._offsets, np.uint32 if self._offsets.itemsize == 4 else np.uint64))

    @property
    def nbytes(self) -> int:
        """The bytes this array holds: the UTF-8 buffer and the offsets."""
        return len(self._data) + self._offsets.itemsize * len(self._offsets)


def _tag(h: int) -> int:
    """32 bits of a hash that the slot (its low bits, up to 2^31 slots) does not use: most probes of another
    string stop at the tag, without decoding it."""
    return (h >> 32) & 0xFFFFFFFF


class StringIndex:
    """The position of each distinct string of a PackedStrings, by open addressing on a hash of the string.

    Reads like a read-only ``dict[str, int]`` (``get``, ``in``, ``[]``); of equal strings the first
    position is kept, and ``duplicates`` counts the others. With the CPU extension the table lives in C
    (a byte hash of the UTF-8, built with the GIL released, ``get`` one C call); without it, in Python
    arrays keyed on ``hash(str)``.
    """

    __slots__ = ("_data", "_offsets", "_tags", "_slots", "_mask", "_size", "_table", "duplicates", "get")

    def __init__(self, strings: PackedStrings):
        ext = string_extension()
        if ext is not None:
            self._table = ext.StringTable(strings._data, strings._offsets)
            self._size, self.duplicates = self._table.size, self._table.duplicates
            self.get = self._table.get  # get(text, default=None): the tokenizers call it once per candidate merge
            return
        self._table = None
        self.get = self._get
        n = len(strings)
        n_slots = 1 << max(3, (_SLOTS_PER_STRING * n - 1).bit_length())  # a power of two: probes wrap by masking
        self._data, self._offsets, self._mask = strings._data, strings._offsets, n_slots - 1
        self._tags = array.array("I", bytes(4 * n))  # (n,) each string's hash bits above the slot bits
        self._slots = array.array("i", [-1]) * n_slots  # (n_slots,) string position, -1 where free
        self._size, self.duplicates = 0, 0
        for i, text in enumerate(strings):
            h = hash(text)
            found, slot = self._probe(text, h)
            if found >= 0:
                self.duplicates += 1
            else:
                self._tags[i], self._slots[slot] = _tag(h), i
                self._size += 1

    def _probe(self, text: str, h: int) -> tuple[int, int]:
        """(position of ``text``, its slot), or (-1, the free slot where it would go); ``h`` is its hash."""
        pos, mask, slots, tags, tag = h & self._mask, self._mask, self._slots, self._tags, _tag(h)
        data, offsets = self._data, self._offsets
        while (j := slots[pos]) >= 0:
            if tags[j] == tag and data[offsets[j]:offsets[j + 1]].decode("utf-8", "surrogatepass") == text:
                return j, pos
            pos = (pos + 1) & mask
        return -1, pos

    def _get(self, text: str, default=None):
        """The fallback's ``get``; _probe inlined: the tokenizers call this once per candidate merge."""
        if not isinstance(text, str):
            return default
        h = hash(text)
        mask, slots = self._mask, self._slots
        pos = h & mask
        j = slots[pos]
        if j < 0:
            return default
        tags, tag, data, offsets = self._tags, (h >> 32) & 0xFFFFFFFF, self._data, self._offsets
        while j >= 0:
            if tags[j] == tag and data[offsets[j]:offsets[j + 1]].decode("utf-8", "surrogatepass") == text:
                return j
            pos = (pos + 1) & mask
            j = slots[pos]
        return default

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.get(text) is not None

    def __getitem__(self, text: str) -> int:
        j = self.get(text)
        if j is None:
            raise KeyError(text)
        return j

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        """The bytes of the table and the tags (the strings belong to the PackedStrings)."""
        if self._table is not None:
            return self._table.nbytes
        return self._slots.itemsize * len(self._slots) + self._tags.itemsize * len(self._tags)
