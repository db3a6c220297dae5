"""Ollama's model store in the library: manifests name GGUF blobs, listed read-only and never copied."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from app.models import library as library_module
from app.models.library import LibraryError, ModelLibrary
from tests.app.models.tiny_gguf import write_tiny_gguf

MODEL = "application/vnd.ollama.image.model"


def _blob(store: Path, name: str, seed: int = 0) -> str:
    tmp = write_tiny_gguf(store / "tmp" / name, name=name, seed=seed)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    (store / "blobs").mkdir(parents=True, exist_ok=True)
    tmp.rename(store / "blobs" / f"sha256-{digest}")
    return digest


def _manifest(store: Path, where: str, layers: list[dict] | str) -> None:
    path = store / "manifests" / where
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = layers if isinstance(layers, str) else json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64},
        "layers": layers})
    path.write_text(doc)


def make_ollama_store(store: Path) -> Path:
    tiny = _blob(store, "Tiny Ollama")
    other = _blob(store, "Other Ollama", seed=1)
    _manifest(store, "registry.ollama.ai/library/tiny/latest", [
        {"mediaType": MODEL, "digest": f"sha256:{tiny}", "size": 1},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 1}])
    _manifest(store, "registry.ollama.ai/someone/other/q4", [{"mediaType": MODEL, "digest": f"sha256:{other}"}])
    _manifest(store, "registry.ollama.ai/library/gone/latest", [{"mediaType": MODEL, "digest": "sha256:" + "a" * 64}])
    _manifest(store, "registry.ollama.ai/library/sneaky/latest", [{"mediaType": MODEL, "digest": "sha256:../../x"}])
    _manifest(store, "registry.ollama.ai/library/garbage/latest", "{not json")
    _manifest(store, "registry.ollama.ai/library/nomodel/latest", [{"mediaType": "text/plain", "digest": "x"}])
    return store


def test_ollama_models_are_listed_from_their_manifests_without_copying(tmp_path):
    store = make_ollama_store(tmp_path / "ollama" / "models")
    library = ModelLibrary(tmp_path / "data", scan_dirs=[store], builtin=None)
    entries = {e.name: e for e in library.list()}
    assert set(entries) == {"ollama/tiny:latest", "ollama/someone/other:q4", "ollama/gone:latest"}
    tiny = entries["ollama/tiny:latest"]
    assert (tiny.source, tiny.origin, tiny.owned, tiny.broken) == ("external", "Ollama", False, False)
    assert tiny.path.parent == store / "blobs" and tiny.info.title == "Tiny Ollama"
    assert entries["ollama/someone/other:q4"].info.title == "Other Ollama"
    assert "missing" in entries["ollama/gone:latest"].info.error
    assert {p.name for p in library.data_dir.rglob("*") if p.is_file()} <= {"model-metadata-cache.json"}
    with pytest.raises(LibraryError, match="belongs to Ollama"):
        library.plan_removal("ollama/tiny:latest")


def test_ollama_models_environment_variable_names_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "elsewhere"))
    assert tmp_path / "elsewhere" in library_module.default_scan_dirs()
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))
    assert tmp_path / "home" / ".ollama" / "models" in library_module.default_scan_dirs()
