"""What the model manager shows about a GGUF file, read once with ``read_gguf`` and cached by path, size and mtime.

The facts include the engine's verdict (``engine.compatibility.check``: does it run here, why not, the memory it
needs at ``VERDICT_N_CTX``); the cache is dropped whenever what the engine supports changes.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from pathlib import Path

from gguf import GGMLQuantizationType, LlamaFileType

from engine.gguf_file import GGUFFile, ModelFormatError, read_gguf

from .json_files import read_json, write_json

CACHE_VERSION = 2
VERDICT_N_CTX = 4096  # the context the library's memory figure assumes (the engine's default)


@dataclasses.dataclass(frozen=True)
class ModelFileInfo:
    """Facts about one GGUF file; ``error`` holds the reason when it cannot be read as a model."""

    architecture: str | None = None
    title: str | None = None  # general.name
    parameter_count: int | None = None
    quantization: str | None = None
    context_length: int | None = None
    has_chat_template: bool = False
    error: str | None = None
    runs: bool = False  # the engine's verdict for the backend this machine uses
    reasons: tuple[str, ...] | list[str] = ()  # why it will not load, one line each
    memory_bytes: int | None = None  # the estimate at VERDICT_N_CTX on that backend
    backend: str | None = None


def read_model_info(path: Path) -> ModelFileInfo:
    """Read the facts from the file itself; a malformed or unreadable file gives an info with ``error`` set."""
    try:
        with read_gguf(path) as g:
            return _info_from(g)
    except ModelFormatError as e:
        return ModelFileInfo(error=str(e))
    except OSError as e:
        return ModelFileInfo(error=f"cannot read {path}: {e.strerror or e}")


def _info_from(g: GGUFFile) -> ModelFileInfo:
    from engine.compatibility import check

    arch = g.get("general.architecture", str, None)
    verdict = check(g, "auto", VERDICT_N_CTX, estimates="judged")
    return ModelFileInfo(
        architecture=arch,
        title=g.get("general.name", str, None),
        parameter_count=sum(t.n_elements for t in g.tensors.values()),
        quantization=quantization_name(g),
        context_length=g.get(f"{arch}.context_length", int, None) if arch else None,
        has_chat_template=any(k == "tokenizer.chat_template" or k.startswith("tokenizer.chat_template.")
                              for k in g.metadata),
        runs=verdict.runs, reasons=list(verdict.reasons), memory_bytes=verdict.memory_bytes, backend=verdict.backend,
    )


def quantization_name(g: GGUFFile) -> str | None:
    """``general.file_type`` by name (``Q4_K_M``), else the tensor type holding most of the weight bytes."""
    file_type = g.metadata.get("general.file_type")
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            kind = LlamaFileType(file_type)
        except ValueError:
            kind = None
        if kind is not None and kind is not LlamaFileType.GUESSED:
            return kind.name.removeprefix("MOSTLY_").removeprefix("ALL_")
    by_type: collections.Counter[GGMLQuantizationType] = collections.Counter()
    for t in g.tensors.values():
        if len(t.shape) >= 2:
            by_type[t.qtype] += t.nbytes
    return by_type.most_common(1)[0][0].name if by_type else None


class MetadataCache:
    """``ModelFileInfo`` per path in a JSON file, valid while the file's size and mtime are unchanged."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()

    def lookup(self, files: list[Path], prune: bool = False) -> dict[Path, ModelFileInfo]:
        """Info for every file, parsing only new or changed ones.

        With ``prune`` the cache forgets every file not asked for (a full listing passes it).
        """
        from engine.compatibility import engine_signature

        signature = engine_signature()
        with self._lock:
            stored = read_json(self.path, {})  # only a cache: an unreadable one is rebuilt from the files
            valid = (isinstance(stored, dict) and stored.get("version") == CACHE_VERSION
                     and stored.get("engine") == signature and isinstance(stored.get("files"), dict))
            old = {k: r for k, r in stored["files"].items() if _usable(r)} if valid else {}
            new, result = ({} if prune else dict(old)), {}
            for path in files:
                key = str(path)
                try:
                    st = os.stat(path)
                except OSError as e:  # deleted or unreadable since it was found
                    result[path] = ModelFileInfo(error=f"cannot read {path}: {e.strerror or e}")
                    continue
                record = old.get(key)
                if not (record and record["size"] == st.st_size and record["mtime_ns"] == st.st_mtime_ns):
                    record = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                              "info": dataclasses.asdict(read_model_info(path))}
                new[key] = record
                result[path] = ModelFileInfo(**record["info"])
            if new != old:
                write_json(self.path, {"version": CACHE_VERSION, "engine": signature, "files": new})
            return result


def _usable(record: object) -> bool:
    """A cached record of the shape ``lookup`` writes; anything else (a hand-edited or damaged cache) is re-read."""
    if not (isinstance(record, dict) and isinstance(record.get("size"), int)
            and isinstance(record.get("mtime_ns"), int) and isinstance(record.get("info"), dict)):
        return False
    try:
        ModelFileInfo(**record["info"])
    except TypeError:
        return False
    return True
