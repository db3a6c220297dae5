"""A validating, memory-mapped GGUF reader.

Every count, length, dimension, type and offset in the file is checked against the file's size before it
is used, so a malformed or hostile file raises ``ModelFormatError`` with a one-line message instead of
crashing, hanging or allocating without bound. The reader never copies tensor data: tensors are views into
a read-only memory map (a backend that keeps a copy of its own ``release``s the mapped pages). Type tables
(block sizes) come from the ``gguf`` package.
"""

from __future__ import annotations

import array
import dataclasses
import mmap
import os
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType
from .packed_strings import PackedStrings, string_extension

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4
MAX_ALIGNMENT = 1 << 16
MAX_KEY_BYTES = (1 << 16) - 1  # the spec's limits on key and tensor-name lengths
MAX_NAME_BYTES = 64

# GGUF value types: id -> (struct format, size); strings (8) and arrays (9) are handled separately,
# booleans (7) are read as bytes and must be 0 or 1.
_SCALAR_TYPES = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<B", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NUMPY_TYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
                6: np.float32, 7: np.uint8, 10: np.uint64, 11: np.int64, 12: np.float64}
_BOOL, _STRING, _ARRAY = 7, 8, 9
_U64 = struct.Struct("<Q")
_MIN_KV_BYTES = 8 + 4 + 1  # empty key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset


class ModelFormatError(ValueError):
    """The file is not a valid GGUF model; the message names the problem in one line."""


class IncompleteHeaderError(ModelFormatError):
    """A header read from the first bytes of a file continues past them; ``needed_bytes`` reach at least further."""

    def __init__(self, message: str, needed_bytes: int):
        super().__init__(message)
        self.needed_bytes = needed_bytes


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in the file. ``shape`` is in GGML order: ``shape[0]`` is the row length."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: mmap.mmap | bytes, size: int):
        self.buf, self.size, self.pos = buf, size, 0
        self.end = min(size, len(buf))  # a header-only view holds the file's first bytes, not all ``size``

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelFormatError(f"{what} runs past the end of the file (needs {n} bytes at offset {self.pos}, file has {self.size})")
        if self.pos + n > self.end:
            raise IncompleteHeaderError(f"{what} runs past the {self.end} bytes read of the file", self.pos + n)

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.scalar("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", 8, what)

    def string(self, what: str, max_len: int | None = None) -> str:
        n = self.u64(f"length of {what}")
        if max_len is not None and n > max_len:
            raise ModelFormatError(f"{what} is {n} bytes long (at most {max_len})")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelFormatError(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def strings(self, count: int, what: str) -> PackedStrings:
        """``count`` strings, packed (vocabularies are ~10^5 long: the C extension splits them with the GIL
        released; without it a Python loop reads the lengths)."""
        if (ext := string_extension()) is not None:
            data, ends, pos = ext.pack_strings(memoryview(self.buf)[:self.end], self.pos, count)
            if ext.first_invalid_utf8(data, ends) >= 0:
                lengths = array.array("Q")
                lengths.frombytes(np.diff(np.frombuffer(ends, np.uint64), prepend=np.uint64(0)).tobytes())
                _check_utf8(data, lengths, what)  # names the element
            ends = np.frombuffer(ends, np.uint64)
            n_read = len(ends)
        else:
            lengths, pos = self._string_lengths(count)
            data = _without_length_prefixes(self.buf, self.pos, pos, lengths)
            _check_utf8(data, lengths, what)
            ends, n_read = np.cumsum(lengths, dtype=np.uint64), len(lengths)
        self.pos = pos
        if n_read < count:  # the split stopped at an element that runs past the end: re-read it for the message
            self.string(f"element {n_read} of {what}")
        return PackedStrings(data, ends)

    def _string_lengths(self, count: int) -> tuple[array.array, int]:
        """The lengths of up to ``count`` (u64 length, bytes) elements from here, and where the last read ends."""
        buf, size, pos = self.buf, self.end, self.pos
        unpack = _U64.unpack_from
        lengths = array.array("Q")
        append = lengths.append
        for _ in range(count):
            if pos + 8 > size:
                break
            (n,) = unpack(buf, pos)
            if pos + 8 + n > size:
                break
            append(n)
            pos += 8 + n
        return lengths, pos


def touch_pages(raw: np.ndarray, page: int = 4096) -> int:
    """Read one byte per ``page`` of ``raw`` (a tensor's bytes in the memory map) so the file is paged in; with the
    CPU extension the page faults happen with the GIL released, so other threads (the GUI) keep running.

    Returns:
        The sum of the bytes read (so the reads are not optimized away).
    """
    from .backends.native import extension  # noqa: PLC0415 - loaded on first use: it selects the CPU ISA

    flat = raw.reshape(-1).view(np.uint8)
    if (ext := extension()) is not None and flat.flags.c_contiguous:
        return ext.touch_pages(flat, page)
    return int(flat[::page].sum(dtype=np.uint64))


def touch_tensors(gguf: GGUFFile) -> int:
    """``touch_pages`` over every tensor byte of ``gguf`` that the backend reads from the map: the weights paged
    in (a load's measurement, a bench's untimed warm-up), without the ranges it ``release``d for copies of its
    own. Returns the sum of the bytes read."""
    return sum(touch_pages(gguf.mapped_bytes()[start:end]) for start, end in gguf.mapped_ranges())


def _without_length_prefixes(buf, start: int, end: int, lengths: array.array) -> bytes:
    """The bytes of ``buf[start:end]``, a run of (u64 length, bytes) elements, without the lengths."""
    if not lengths:
        return b""
    region = np.frombuffer(buf, np.uint8, count=end - start, offset=start)
    runs = np.column_stack([np.full(len(lengths), 8), np.frombuffer(lengths, np.uint64).astype(np.int64)])
    keep = np.repeat(np.tile(np.array([False, True]), len(lengths)), runs.ravel())
    return region[keep].tobytes()


def _check_utf8(data: bytes, lengths: array.array, what: str) -> None:
    """Raise ModelFormatError naming the first element of ``data`` (cut by ``lengths``) that is not UTF-8.

    Each element is valid exactly when the whole is and every non-empty element starts a character (not on a
    continuation byte), so the elements are only decoded one by one to name a bad one.
    """
    sizes = np.frombuffer(lengths, np.uint64).astype(np.int64)
    starts = (np.cumsum(sizes) - sizes)[sizes > 0]
    try:
        data.decode("utf-8")
        if not np.any((np.frombuffer(data, np.uint8)[starts] & 0xC0) == 0x80):
            return
    except UnicodeDecodeError:
        pass
    offset = 0
    for i, n in enumerate(lengths):
        try:
            data[offset:offset + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelFormatError(f"element {i} of {what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        offset += n


class GGUFFile:
    """A parsed GGUF file: ``metadata`` (key -> value), ``tensors`` (name -> TensorInfo) and tensor views."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):
                raise ModelFormatError(f"{self.path} is not a regular file")  # opening a FIFO would block
            self._file = open(self.path, "rb")
        except OSError as e:
            raise ModelFormatError(f"cannot open {self.path}: {e.strerror}") from None
        try:
            self.file_size = os.fstat(self._file.fileno()).st_size
            if self.file_size < 24:
                raise ModelFormatError(f"file is too small to be GGUF ({self.file_size} bytes)")
            self._map = self._map_file()
            self._parse()
        except BaseException:
            self.close()
            raise
        self._release_header_pages()
        self._advise_huge_pages()
        self._array = np.frombuffer(self._map, dtype=np.uint8)
        self._released: list[tuple[int, int]] = []  # byte ranges the backend copied (release)

    def _map_file(self) -> mmap.mmap:
        try:
            return mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise ModelFormatError(f"cannot memory-map {self.path}: {e.strerror}") from None

    def _release_header_pages(self) -> None:
        """Drop the parsed header's pages from this process's resident set (megabytes for a large vocabulary).

        Everything parsed was copied out of the map, and the pages stay in the page cache, so a later read
        of them (a tensor sharing the last page) only maps them again.
        """
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, 0, self.data_offset)

    def _advise_huge_pages(self) -> None:
        """Ask for the weights in 2 MiB pages where the kernel can (Linux: transparent huge pages for files).

        Decode reads gigabytes per token from pages it last touched a token or more ago. Mapped in 4 KiB pages,
        every 4 KiB costs a TLB miss whose page-table walk (under a hypervisor, two nested walks) itself misses
        the cache once the file is several GB. On gpt-oss-20b's 12 GB file (2 threads, a loaded 2-core VM,
        paired in one process) 2 MiB pages decoded 8 % faster than the same pages mapped 4 KiB, and as fast per
        byte as a 4-layer copy (35.4 against 35.9 GB/s), where 4 KiB pages left it 7-14 % below the copy.
        Pages read after this advice enter the page cache as 2 MiB folios (file systems with large folios, e.g.
        ext4 and XFS on Linux 6.x), each mapped by one entry; the bytes cached and resident are the same. The
        token embedding stays in 4 KiB pages: a token reads one row of it, and a 2 MiB page per row would make
        it all resident. A no-op where the advice is unknown or refused.
        """
        if not hasattr(mmap, "MADV_HUGEPAGE"):
            return
        try:
            self._map.madvise(mmap.MADV_HUGEPAGE)
            embd = self.tensors.get("token_embd.weight")
            if embd is not None:
                start = embd.offset // mmap.PAGESIZE * mmap.PAGESIZE
                self._map.madvise(mmap.MADV_NOHUGEPAGE, start, embd.offset + embd.nbytes - start)
        except OSError:
            pass

    # -- parsing ---------------------------------------------------------------------------------------
    def _parse(self) -> None:
        cur = _Cursor(self._map, self.file_size)
        magic = bytes(self._map[0:4])
        if magic != GGUF_MAGIC:
            raise ModelFormatError(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            if struct.unpack("<I", struct.pack(">I", self.version))[0] in SUPPORTED_VERSIONS:
                raise ModelFormatError("big-endian GGUF files are not supported")
            raise ModelFormatError(f"unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        remaining = self.file_size - cur.pos
        if n_kv > remaining // _MIN_KV_BYTES:
            raise ModelFormatError(f"metadata count {n_kv} is impossible for a file of {self.file_size} bytes")
        if n_tensors > remaining // _MIN_TENSOR_INFO_BYTES:
            raise ModelFormatError(f"tensor count {n_tensors} is impossible for a file of {self.file_size} bytes")
        self.metadata = self._read_metadata(cur, n_kv)
        self.alignment = self._alignment()
        infos = [self._read_tensor_info(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors = self._place_tensors(infos)

    def _read_metadata(self, cur: _Cursor, n_kv: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}", MAX_KEY_BYTES)
            if not key:
                raise ModelFormatError(f"metadata key #{i} is empty")
            if key in metadata:
                raise ModelFormatError(f"metadata key {key!r} appears twice")
            vtype = cur.u32(f"type of {key!r}")
            if vtype == _ARRAY:
                metadata[key] = self._read_array(cur, key)
            else:
                metadata[key] = self._read_scalar(cur, vtype, key)
        return metadata

    @staticmethod
    def _read_scalar(cur: _Cursor, vtype: int, key: str) -> Any:
        if vtype == _STRING:
            return cur.string(f"value of {key!r}")
        if vtype not in _SCALAR_TYPES:
            raise ModelFormatError(f"metadata {key!r} has invalid value type {vtype}")
        fmt, size = _SCALAR_TYPES[vtype]
        value = cur.scalar(fmt, size, f"value of {key!r}")
        if vtype == _BOOL:
            if value > 1:
                raise ModelFormatError(f"metadata {key!r} is a boolean stored as {value} (must be 0 or 1)")
            return bool(value)
        return value

    def _read_array(self, cur: _Cursor, key: str) -> np.ndarray | PackedStrings:
        etype = cur.u32(f"element type of {key!r}")
        count = cur.u64(f"length of {key!r}")
        if etype == _STRING:
            if count > (self.file_size - cur.pos) // 8:
                raise ModelFormatError(f"array {key!r} of {count} strings runs past the end of the file")
            return cur.strings(count, repr(key))
        if etype == _ARRAY:
            raise ModelFormatError(f"metadata {key!r} is a nested array, which is not supported")
        if etype not in _SCALAR_TYPES:
            raise ModelFormatError(f"array {key!r} has invalid element type {etype}")
        size = _SCALAR_TYPES[etype][1]
        if count > (self.file_size - cur.pos) // size:
            raise ModelFormatError(f"array {key!r} of {count} elements runs past the end of the file")
        cur.need(count * size, f"array {key!r}")
        values = np.frombuffer(self._map, dtype=_NUMPY_TYPES[etype], count=count, offset=cur.pos).copy()
        cur.pos += count * size
        if etype == _BOOL:
            if count and values.max() > 1:
                raise ModelFormatError(f"array {key!r} holds a boolean that is not 0 or 1")
            return values.astype(np.bool_)
        return values

    def _alignment(self) -> int:
        value = self.metadata.get("general.alignment", 32)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ModelFormatError("general.alignment must be an integer")
        if value <= 0 or value & (value - 1) or value > MAX_ALIGNMENT:
            raise ModelFormatError(f"general.alignment {value} is not a power of two up to {MAX_ALIGNMENT}")
        return value

    def _read_tensor_info(self, cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int, int]:
        name = cur.string(f"name of tensor #{i}", MAX_NAME_BYTES)
        n_dims = cur.u32(f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelFormatError(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(cur.u64(f"dimension {d} of {name!r}") for d in range(n_dims))
        raw_type = cur.u32(f"type of {name!r}")
        offset = cur.u64(f"offset of {name!r}")
        try:
            qtype = GGMLQuantizationType(raw_type)
            block_size, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelFormatError(f"tensor {name!r} has unknown type {raw_type}") from None
        n_elements = 1
        for d in shape:
            if d == 0:
                raise ModelFormatError(f"tensor {name!r} has a zero dimension {shape}")
            n_elements *= d
            if n_elements >= 1 << 62:
                raise ModelFormatError(f"tensor {name!r} has an overflowing shape {shape}")
        if shape[0] % block_size:
            raise ModelFormatError(f"tensor {name!r}: row length {shape[0]} is not a multiple of the {qtype.name} block size {block_size}")
        nbytes = n_elements // block_size * type_size
        return name, shape, qtype, offset, nbytes

    def _place_tensors(self, infos: list) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        for name, shape, qtype, offset, nbytes in infos:
            if name in tensors:
                raise ModelFormatError(f"tensor name {name!r} appears twice")
            if offset % self.alignment:
                raise ModelFormatError(f"tensor {name!r} offset {offset} is not aligned to {self.alignment}")
            start = self.data_offset + offset
            if start + nbytes > self.file_size:
                raise ModelFormatError(f"tensor {name!r} ends past the end of the file (truncated or bad offset)")
            tensors[name] = TensorInfo(name, shape, qtype, start, nbytes)
        ordered = sorted(tensors.values(), key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):
            if a.offset + a.nbytes > b.offset:
                raise ModelFormatError(f"tensors {a.name!r} and {b.name!r} overlap in the file")
        return tensors

    # -- access ----------------------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view, shaped (rows, bytes_per_row)."""
        info = self.tensor(name)
        block_size, type_size = GGML_QUANT_SIZES[info.qtype]
        row_bytes = info.shape[0] // block_size * type_size
        flat = self._array[info.offset:info.offset + info.nbytes]
        return flat.reshape(info.nbytes // row_bytes, row_bytes)

    def release(self, view: np.ndarray) -> None:
        """The backend keeps a copy of ``view`` (tensor bytes from ``raw``) of its own: drop its whole pages from
        this process's mapping (the page cache keeps them; a later read maps them again) and leave it out of
        ``mapped_ranges``, so resident memory holds the weights once.

        The dropped pages are also advised ``MADV_NOHUGEPAGE``: with the weights in 2 MiB page-cache folios
        (``_advise_huge_pages``), reading a small tensor beside them (a norm between two repacked matrices) would
        otherwise map its whole 2 MiB folio, copied pages and all, back into the resident set (Qwen2.5-Coder-0.5B
        Q4_K_M on Linux 6.18: 554 MiB resident against 504 estimated). A range of its own that is not advised huge
        is mapped in 4 KiB pages only, and a neighbour's fault never maps across it."""
        start = view.__array_interface__["data"][0] - self._array.__array_interface__["data"][0]
        end = start + view.nbytes
        if not (view.flags.c_contiguous and 0 <= start <= end <= self._array.size):
            raise ValueError("release takes a contiguous view of this file's tensor bytes")
        self._released.append((start, end))
        page = mmap.PAGESIZE
        first, last = -(-start // page) * page, end // page * page
        if last > first and hasattr(mmap, "MADV_DONTNEED"):
            if hasattr(mmap, "MADV_NOHUGEPAGE"):
                try:
                    self._map.madvise(mmap.MADV_NOHUGEPAGE, first, last - first)
                except OSError:
                    pass  # a kernel without transparent huge pages: nothing to map back
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)

    def mapped_bytes(self) -> np.ndarray:
        """The whole file as a read-only uint8 view of the map (offsets as in ``TensorInfo.offset``)."""
        return self._array

    def mapped_ranges(self) -> list[tuple[int, int]]:
        """The (start, end) byte ranges of the tensors, in file order, that the backend still reads from the map:
        every tensor's bytes less those ``release``d."""
        cuts = sorted(self._released)
        ranges = []
        for info in sorted(self.tensors.values(), key=lambda t: t.offset):
            pos, end = info.offset, info.offset + info.nbytes
            for a, b in cuts:
                if b <= pos or a >= end:
                    continue
                if a > pos:
                    ranges.append((pos, a))
                pos = max(pos, b)
            if pos < end:
                ranges.append((pos, end))
        return ranges

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFormatError(f"the model has no tensor {name!r}") from None

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = dataclasses.MISSING) -> Any:
        """A metadata value checked against ``kind``; missing keys give ``default`` or raise."""
        if key not in self.metadata:
            if default is dataclasses.MISSING:
                raise ModelFormatError(f"the model's metadata has no {key!r}")
            return default
        value = self.metadata[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if int in kinds and isinstance(value, bool) and bool not in kinds:
            raise ModelFormatError(f"metadata {key!r} should be an integer, not a boolean")
        if not isinstance(value, kinds):
            names = "/".join(k.__name__ for k in kinds)
            raise ModelFormatError(f"metadata {key!r} should be {names}, not {type(value).__name__}")
        return value

    def close(self) -> None:
        self._array = None
        if getattr(self, "_map", None) is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # numpy views still alive; the map is released when they are
        self._file.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and validate a GGUF file.

    Args:
        path: the model file.

    Returns:
        The parsed file; close it (or use it as a context manager) to release the memory map.

    Raises:
        ModelFormatError: the file cannot be opened or anything in it is malformed.
    """
    return GGUFFile(path)


class GGUFHeader(GGUFFile):
    """A GGUF file's metadata and tensor table read from its first bytes alone, with no tensor data.

    It answers ``metadata``, ``tensors``, ``get`` and ``tensor`` as a GGUFFile does, with every check of the
    reader (tensors are placed against the whole file's size), so code that reads only those judges a file
    that has not been downloaded. ``raw`` raises: there are no tensor bytes.

    Raises:
        IncompleteHeaderError: the header continues past ``prefix``; read at least ``needed_bytes``.
        ModelFormatError: anything in the header is malformed.
    """

    def __init__(self, prefix: bytes, file_size: int, name: str = "GGUF header"):
        self.path = Path(name)
        self.file_size = file_size
        self._file = None
        self._array = None
        self._map = bytes(prefix[:file_size])
        if file_size < 24:
            raise ModelFormatError(f"file is too small to be GGUF ({file_size} bytes)")
        if len(self._map) < 24:
            raise IncompleteHeaderError(f"only {len(self._map)} bytes of the header were read", 24)
        self._parse()

    def raw(self, name: str) -> np.ndarray:
        raise ModelFormatError(f"only the header of {self.path} was read: tensor {name!r} has no data here")

    def close(self) -> None:
        self._map = None
