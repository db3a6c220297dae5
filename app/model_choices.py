"""The models the app can offer: the model library's entries as plain rows for the Models page, each with a clean
display name and, for a model without a chat template, the base-model label; then the models of the remote
endpoints the user added, each with its endpoint and what it supports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.remote import is_remote_ref, parse_remote_ref

from .builtin_model import BUILTIN_MODEL_NAME
from .model_names import display_name

METADATA_CACHE_FILE = "model-metadata-cache.json"  # the model library's cache of GGUF facts, in the data dir


@dataclasses.dataclass(frozen=True)
class ModelChoice:
    name: str
    path: str
    detail: str  # architecture, size, quantization, context, where it lives
    usable: bool
    problem: str | None = None
    base_model: bool = False  # no chat template: a text-completion model, not a chat model


BASE_MODEL_LABEL = "base model — text completion"
CAPABILITY_NAMES = {"streaming": "streaming", "tools": "tools", "json_schema": "JSON schema", "logprobs": "logprobs",
                    "anthropic_messages": "Anthropic Messages"}


@dataclasses.dataclass(frozen=True)
class _Named:
    name: str


@dataclasses.dataclass(frozen=True)
class RemoteRemoval:
    """What removing a remote model does: the endpoint and its key are forgotten (shaped like a RemovalPlan)."""

    entry: _Named
    endpoint_id: str
    message: str


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


class ModelChoices:
    """Lists and adds models through ``app.models.library.ModelLibrary`` (or only the built-in model without it)."""

    def __init__(self, data_dir: Path, builtin: Path | None, scan_dirs: list[Path] | None = None, remote=None):
        self.data_dir = data_dir
        self.builtin = builtin
        self.scan_dirs = scan_dirs
        self.remote = remote  # app.models.remote_endpoints.RemoteEndpoints, or None

    def _library(self):
        from .models.library import ModelLibrary
        return ModelLibrary(self.data_dir, scan_dirs=self.scan_dirs)

    def list(self) -> list[ModelChoice]:
        try:
            rows = [self._row(e) for e in self._library().list()]
        except ImportError:
            rows = [ModelChoice(f"{BUILTIN_MODEL_NAME} (built-in)", str(self.builtin), "built in", True)] \
                if self.builtin else []
        return rows + self.remote_rows()

    def remote_rows(self) -> list[ModelChoice]:
        """A row per model of each remote endpoint; an endpoint that could not be listed shows its problem."""
        if self.remote is None:
            return []
        rows = []
        for entry in self.remote.models():
            caps = [label for key, label in CAPABILITY_NAMES.items() if getattr(entry.capabilities, key)]
            probed = entry.model_id in entry.endpoint.capabilities
            detail = " · ".join(["Remote", entry.endpoint.base_url,
                                 ", ".join(caps) if probed else "not probed yet"]
                                + (["self-signed allowed"] if entry.endpoint.allow_self_signed else []))
            rows.append(ModelChoice(f"{entry.model_id} (remote)", entry.ref, detail, True,
                                    entry.endpoint.problem or None))
        return rows

    def add_remote(self, base_url: str, api_key: str | None, headers_text: str, allow_self_signed: bool):
        """Add a remote endpoint (lists and probes it: network I/O, call it off the GUI thread); returns it."""
        from .models.remote_endpoints import parse_headers
        return self.remote.add(base_url, api_key or None, parse_headers(headers_text), allow_self_signed)

    def add_file(self, path: str) -> ModelChoice:
        """Add a GGUF in place (linked, not copied); raises the library's error with a readable message.

        A valid GGUF the engine cannot run is added too, unusable, with the reason on its row.
        """
        return self._row(self._library().import_file(Path(path), mode="link", keep_unrunnable=True))

    def is_base_model(self, path: str | None) -> bool:
        """Whether the GGUF at ``path`` is a base model: readable, but without a chat template (read once, cached)."""
        if not path or is_remote_ref(path) or (self.builtin is not None and Path(path) == self.builtin):
            return False
        from .models.metadata_cache import MetadataCache
        info = MetadataCache(self.data_dir / METADATA_CACHE_FILE).lookup([Path(path)])[Path(path)]
        return info.error is None and not info.has_chat_template

    def plan_removal(self, path: str):
        """What removing the model at ``path`` would do (a ``RemovalPlan``); raises LibraryError when refused."""
        if is_remote_ref(path):
            endpoint = self.remote.get(parse_remote_ref(path)[0])
            return RemoteRemoval(_Named(endpoint.base_url), endpoint.id,
                                 f"forget this remote endpoint, its key and its {len(endpoint.models)} models")
        library = self._library()
        return library.plan_removal(self._name_of(library, path))

    def remove(self, path: str):
        """Remove the model at ``path`` as planned: delete the file if Hearth owns it, else forget it."""
        if is_remote_ref(path):
            return self.remote.remove(parse_remote_ref(path)[0])
        library = self._library()
        return library.remove(self._name_of(library, path))

    @staticmethod
    def _name_of(library, path: str) -> str:
        from .models.library import LibraryError
        for entry in library.list():
            if str(entry.path) == path:
                return entry.name
        raise LibraryError(f"{path} is not in the model library")

    @staticmethod
    def _row(entry) -> ModelChoice:
        info = entry.info
        parts = [p for p in (info.architecture, info.quantization, _size(entry.file_size),
                             f"{info.context_length:,} ctx" if info.context_length else None,
                             entry.origin or entry.source) if p]
        if entry.supported and info.memory_bytes:
            parts.insert(0, f"Runs here · needs {_size(info.memory_bytes)}")
        base = info.error is None and not info.has_chat_template
        if base:
            parts.insert(0, BASE_MODEL_LABEL)
        name = f"{BUILTIN_MODEL_NAME} (built-in)" if entry.source == "builtin" else \
            display_name(info.title, entry.path.name, entry.repo)
        return ModelChoice(name, str(entry.path), " · ".join(parts), entry.supported, entry.problem, base)
