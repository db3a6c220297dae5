"""Will a model fit in memory? Estimates for files on disk (the engine's) and on the Hub (before downloading).

No Qt. A remote file's estimate is built without downloading it:

* weights — the file size: the CPU backend memory-maps the GGUF, so once every page has been touched the
  resident weights are the file's bytes;
* KV cache — from the architecture in the file's GGUF header, read with one HTTP ``Range`` request for its
  first ``HEADER_BYTES`` (the architecture keys come before the tokenizer's long arrays in the files llama.cpp's
  converter writes): layers × context × KV heads × (key + value length) × 4 bytes, as the engine keeps float32
  keys and values; Gemma 3's sliding-window layers hold at most the window, as in the engine.
  When the header cannot be read, ``FALLBACK_KV_PER_TOKEN`` is assumed and the estimate is marked rough;
* runtime and scratch — ``OVERHEAD_BASE`` plus ``OVERHEAD_FRACTION`` of the file, an allowance that covers the
  engine's estimate for the three test models (33–77 MiB at 4,096 tokens).
"""

from __future__ import annotations

import dataclasses
import struct

import httpx2
from huggingface_hub import get_session

from engine.memory_estimate import fit_verdict, system_memory

HEADER_BYTES = 512 << 10
OVERHEAD_BASE = 64 << 20
OVERHEAD_FRACTION = 0.08
FALLBACK_KV_PER_TOKEN = 256 << 10  # Llama 3 8B at float32; more than most small models need
KV_BYTES_PER_ELEMENT = 4
GGUF_MAGIC = b"GGUF"

# GGUF value types: fixed sizes (struct format) and the two variable ones (8 string, 9 array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclasses.dataclass(frozen=True)
class FitEstimate:
    """Expected bytes of a loaded model by part, how they were found, and the verdict against memory now."""

    weights: int
    kv_cache: int
    overhead: int
    verdict: str  # "fits", "tight" or "won't fit"
    available: int
    rough: bool = False  # the KV cache is a guess (the header could not be read)

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total": self.total}


def kv_bytes(header: dict, n_ctx: int) -> int | None:
    """KV cache bytes at ``n_ctx`` from GGUF header keys, or None when the keys it needs are missing."""
    arch = header.get("general.architecture")
    if not isinstance(arch, str):
        return None
    layers, heads = header.get(f"{arch}.block_count"), header.get(f"{arch}.attention.head_count")
    kv_heads = header.get(f"{arch}.attention.head_count_kv", heads)
    embd = header.get(f"{arch}.embedding_length")
    if isinstance(kv_heads, list):  # per-layer counts
        kv_heads = max(kv_heads, default=None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, kv_heads, embd)):
        return None
    key = header.get(f"{arch}.attention.key_length", embd // heads)
    value = header.get(f"{arch}.attention.value_length", key)
    window = header.get(f"{arch}.attention.sliding_window", 0)
    positions = layers * n_ctx
    if arch == "gemma3" and isinstance(window, int) and window > 0:  # engine/config.py: 5 of every 6 layers slide
        positions = sum(min(n_ctx, window) if layer % 6 < 5 else n_ctx for layer in range(layers))
    return positions * kv_heads * (key + value) * KV_BYTES_PER_ELEMENT


def remote_estimate(file_size: int, header: dict | None, n_ctx: int, available: int | None = None) -> FitEstimate:
    """The estimate for a file of ``file_size`` bytes whose GGUF header keys are ``header`` (None if unread)."""
    kv = kv_bytes(header, n_ctx) if header else None
    rough = kv is None
    if rough:
        kv = n_ctx * FALLBACK_KV_PER_TOKEN
    overhead = OVERHEAD_BASE + int(OVERHEAD_FRACTION * file_size)
    available = system_memory().available_bytes if available is None else available
    return FitEstimate(file_size, kv, overhead, fit_verdict(file_size + kv + overhead, available), available, rough)


def local_estimate(path: str, n_ctx: int, available: int | None = None) -> FitEstimate:
    """The engine's estimate for a GGUF on disk."""
    from engine.gguf_file import read_gguf
    from engine.memory_estimate import estimate_memory

    with read_gguf(path) as g:
        e = estimate_memory(g, n_ctx)
    available = system_memory().available_bytes if available is None else available
    return FitEstimate(e.weights_bytes, e.kv_cache_bytes, e.overhead_bytes, fit_verdict(e.total_bytes, available),
                       available)


def fetch_header(url: str, token: str | None = None, timeout: float = 30.0) -> dict | None:
    """The GGUF header keys found in the first HEADER_BYTES of the file at ``url``; None when unreadable."""
    headers = {"Range": f"bytes=0-{HEADER_BYTES - 1}", "Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with get_session().stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as r:
            if r.status_code not in (200, 206):
                return None
            data = bytearray()
            for chunk in r.iter_bytes():
                data += chunk
                if len(data) >= HEADER_BYTES:
                    break
    except httpx2.HTTPError:
        return None
    return parse_header_prefix(bytes(data[:HEADER_BYTES]))


def parse_header_prefix(data: bytes) -> dict | None:
    """The metadata keys of a GGUF file's beginning, as far as ``data`` reaches (arrays are skipped)."""
    if len(data) < 24 or data[:4] != GGUF_MAGIC:
        return None
    version, _, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        return None
    out, pos = {}, 24
    try:
        for _ in range(min(n_kv, 1 << 16)):
            key, pos = _string(data, pos)
            kind, = struct.unpack_from("<I", data, pos)
            value, pos = _value(data, pos + 4, kind)
            out[key] = value
    except (struct.error, ValueError, UnicodeDecodeError):
        pass  # the prefix ends here
    return out


def _string(data: bytes, pos: int) -> tuple[str, int]:
    n, = struct.unpack_from("<Q", data, pos)
    end = pos + 8 + n
    if end > len(data):
        raise ValueError("truncated")
    return data[pos + 8:end].decode("utf-8"), end


def _value(data: bytes, pos: int, kind: int):
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack_from(fmt, data, pos)[0], pos + struct.calcsize(fmt)
    if kind == _STRING:
        return _string(data, pos)
    if kind != _ARRAY:
        raise ValueError(f"unknown GGUF type {kind}")
    item, count = struct.unpack_from("<IQ", data, pos)
    pos += 12
    if item in _SCALARS and count <= 4096:  # small numeric arrays (per-layer head counts) are kept
        fmt = "<" + _SCALARS[item][1] * count
        return list(struct.unpack_from(fmt, data, pos)), pos + struct.calcsize(fmt)
    if item in _SCALARS:
        end = pos + count * struct.calcsize(_SCALARS[item])
        if end > len(data):
            raise ValueError("truncated")
        return None, end
    for _ in range(count):  # strings or nested arrays: walk them
        _, pos = _value(data, pos, item)
    return None, pos
