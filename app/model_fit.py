"""Will a model run here, and fit in memory? The verdict for files on disk and on the Hub (before downloading).

No Qt. Both come from the engine's ``engine.compatibility.check`` on the file's GGUF header (metadata and
tensor table): the architecture, the tokenizer, every required tensor and its shape, the tensor types the
backend this machine would use can hold, and that backend's memory estimate (weights, KV cache, runtime).
A mixture-of-experts model's weights count all its experts (all resident); ``active_weights`` is what one
token reads. When only the memory-mapped weights do not fit in the free memory, the verdict is ``"paged"``:
it runs, with the OS page cache reading the weights from the file as needed, more slowly (the summary says so).

A Hub file's header is read with HTTP ``Range`` requests: the first ``HEADER_BYTES``, then more, doubling,
while the header continues past what was read (a large vocabulary comes before the tensor table), up to
``MAX_HEADER_BYTES``. Nothing past the header is fetched. When the header cannot be read (network, a server
that ignores ranges past the cap, a header over the cap), the verdict is unknown (``runs`` None) and the
memory a rough guess: the file size, ``FALLBACK_KV_PER_TOKEN`` per position and ``OVERHEAD_BASE`` plus
``OVERHEAD_FRACTION`` of the file.
"""

from __future__ import annotations

import dataclasses
import os

import httpx2
from huggingface_hub import get_session

from engine.compatibility import Compatibility, check
from engine.gguf_file import GGUFFile, GGUFHeader, IncompleteHeaderError, ModelFormatError
from engine.memory_estimate import fit_verdict, paging_note, system_memory

HEADER_BYTES = 1 << 20
MAX_HEADER_BYTES = 32 << 20
OVERHEAD_BASE = 64 << 20
OVERHEAD_FRACTION = 0.08
FALLBACK_KV_PER_TOKEN = 256 << 10  # Llama 3 8B at float32; more than most small models need


class HeaderUnavailable(Exception):
    """The GGUF header of a remote file could not be read; the message says why."""


@dataclasses.dataclass(frozen=True)
class FitEstimate:
    """Whether a model runs here, why not, its expected bytes by part and the verdict against memory now."""

    weights: int
    kv_cache: int
    overhead: int
    verdict: str  # memory: "fits", "tight", "paged" (runs from the page cache, slower) or "won't fit"
    available: int
    rough: bool = False  # the memory is a guess (the header could not be read or describes no model)
    runs: bool | None = None  # None: unknown, the header could not be read
    reasons: tuple[str, ...] = ()  # why it will not load (one line each), or why it could not be judged
    backend: str | None = None
    architecture: str | None = None
    active_weights: int | None = None  # weight bytes one token reads (a sparse model's chosen experts); None: all
    mapped: int = 0  # weight bytes that stay pages of the memory-mapped file

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead

    def summary(self) -> str:
        """One line for a person: "Runs here · needs 3.1 GB", "Won't load: <reason>", "Won't fit · needs …"."""
        return verdict_summary(self.to_dict())

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "reasons": list(self.reasons), "total": self.total}


def gb_text(n: float) -> str:
    """Bytes for people: "3.1 GB", "420 MB", "0.2 MB"."""
    if n >= 1e8:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.0f} MB" if n >= 1e7 else f"{n / 1e6:.1f} MB"


def verdict_summary(e: dict) -> str:
    """``FitEstimate.summary`` of an estimate as a dict (what crosses threads and signals)."""
    need = ("≈ " if e.get("rough") else "") + gb_text(e["total"])
    if e.get("runs") is False:
        return f"Won't load: {e['reasons'][0]}" if e.get("reasons") else "Won't load"
    if e.get("runs") is None:
        return f"Not checked ({e['reasons'][0]}) · needs {need}" if e.get("reasons") else f"Not checked · needs {need}"
    if e["verdict"] == "won't fit":
        return f"Won't fit · needs {need}, {gb_text(e['available'])} free"
    if e["verdict"] == "paged":
        return f"Runs here, slowly · needs {need}; {paging_note(e.get('mapped', 0), e['available'])}"
    sparse = e.get("active_weights") is not None and e["active_weights"] < e["weights"]
    reads = f" · reads {gb_text(e['active_weights'])} per token (all experts resident)" if sparse else ""
    if e["verdict"] == "tight":
        return f"Runs here, tight · needs {need} of {gb_text(e['available'])} free{reads}"
    return f"Runs here · needs {need}{reads}"


def judged_estimate(gguf: GGUFFile, file_size: int, n_ctx: int, available: int | None = None) -> FitEstimate:
    """The verdict and memory of a parsed file or header (see ``engine.compatibility.check``)."""
    verdict = check(gguf, "auto", n_ctx, estimates="judged")
    estimate = verdict.memory.get(verdict.backend)
    available = system_memory().available_bytes if available is None else available
    if estimate is None:  # the header describes no model the engine runs: memory only roughly
        return _rough(file_size, n_ctx, available, runs=False, reasons=verdict.reasons, judged=verdict)
    return FitEstimate(estimate.weights_bytes, estimate.kv_cache_bytes, estimate.overhead_bytes,
                       fit_verdict(estimate.total_bytes, available, estimate.mapped_bytes), available,
                       runs=verdict.runs, reasons=verdict.reasons, backend=verdict.backend,
                       architecture=verdict.architecture, active_weights=estimate.active_weights_bytes,
                       mapped=estimate.mapped_bytes)


def unknown_estimate(file_size: int, n_ctx: int, why: str, available: int | None = None) -> FitEstimate:
    """A rough estimate for a file whose header could not be read; ``why`` says what went wrong."""
    available = system_memory().available_bytes if available is None else available
    return _rough(file_size, n_ctx, available, runs=None, reasons=(why,))


def malformed_estimate(file_size: int, n_ctx: int, error: str, available: int | None = None) -> FitEstimate:
    """A file whose header is malformed: it will not load."""
    available = system_memory().available_bytes if available is None else available
    return _rough(file_size, n_ctx, available, runs=False, reasons=(f"not a valid GGUF model: {error}",))


def _rough(file_size: int, n_ctx: int, available: int, runs: bool | None, reasons: tuple[str, ...],
           judged: Compatibility | None = None) -> FitEstimate:
    kv, overhead = n_ctx * FALLBACK_KV_PER_TOKEN, OVERHEAD_BASE + int(OVERHEAD_FRACTION * file_size)
    return FitEstimate(file_size, kv, overhead, fit_verdict(file_size + kv + overhead, available), available,
                       rough=True, runs=runs, reasons=tuple(reasons), backend=judged.backend if judged else None,
                       architecture=judged.architecture if judged else None)


def local_estimate(path: str, n_ctx: int, available: int | None = None) -> FitEstimate:
    """The verdict for a GGUF on disk; a malformed file gives ``runs`` False and the reader's reason."""
    from engine.gguf_file import read_gguf

    try:
        with read_gguf(path) as g:
            return judged_estimate(g, g.file_size, n_ctx, available)
    except ModelFormatError as e:
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        return malformed_estimate(size, n_ctx, str(e), available)


def remote_estimate(url: str, file_size: int, n_ctx: int, token: str | None = None,
                    available: int | None = None) -> FitEstimate:
    """The verdict for a file on the Hub, from its header alone (``fetch_header``)."""
    try:
        header = fetch_header(url, file_size, token)
    except HeaderUnavailable as e:
        return unknown_estimate(file_size, n_ctx, str(e), available)
    except ModelFormatError as e:
        return malformed_estimate(file_size, n_ctx, str(e), available)
    return judged_estimate(header, file_size, n_ctx, available)


def fetch_header(url: str, file_size: int, token: str | None = None, timeout: float = 30.0,
                 first: int = HEADER_BYTES, cap: int = MAX_HEADER_BYTES) -> GGUFHeader:
    """The GGUF header of the ``file_size``-byte file at ``url``, read with Range requests, doubling from
    ``first`` bytes while the header continues, up to ``cap``.

    Raises:
        HeaderUnavailable: the server could not be read, or the header is longer than ``cap``.
        ModelFormatError: the header is malformed (the file will not load).
    """
    data = bytearray()
    want = min(first, file_size)
    while True:
        chunk = _read_range(url, len(data), want, token, timeout)
        if not chunk:
            raise HeaderUnavailable(f"the Hub sent no bytes from offset {len(data)} of the file")
        data += chunk
        try:
            return GGUFHeader(bytes(data), file_size, name=url.rsplit("/", 1)[-1])
        except IncompleteHeaderError as e:
            if len(data) >= min(cap, file_size):
                raise HeaderUnavailable(f"the GGUF header is longer than the {gb_text(cap)} read") from None
            want = min(max(2 * len(data), e.needed_bytes), cap, file_size)


def _read_range(url: str, start: int, stop: int, token: str | None, timeout: float) -> bytes:
    """Bytes ``[start, stop)`` of the file at ``url``; a server that ignores ``Range`` is read up to ``stop`` only."""
    headers = {"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = bytearray()
    try:
        with get_session().stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as r:
            if r.status_code not in (200, 206):
                raise HeaderUnavailable(f"the Hub answered {r.status_code} when the header was read")
            skip = start if r.status_code == 200 else 0  # the whole file from byte 0
            for chunk in r.iter_bytes():
                data += chunk
                if len(data) >= skip + stop - start:
                    break
    except httpx2.HTTPError as e:
        raise HeaderUnavailable(f"the header could not be read: {e}") from None
    return bytes(data[skip:skip + stop - start])
