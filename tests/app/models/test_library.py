"""ModelLibrary: every source, broken files, the metadata cache, import and removal rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.builtin_model import BuiltinModel
from app.models import metadata_cache
from app.models.library import LibraryError, ModelLibrary
from tests.app.builtin_parts import install_fake_parts
from tests.app.models.tiny_gguf import parameter_count, write_tiny_gguf
from tests.model_store import model_path


def names(library: ModelLibrary) -> dict[str, object]:
    return {e.name: e for e in library.list()}


def make_hf_cache(root: Path) -> Path:
    """``models--org--name`` with a blob, two snapshots (an old one and the one refs/main names)."""
    repo = root / "models--acme--Tiny-GGUF"
    blob = write_tiny_gguf(repo / "blobs" / "abc123", name="Tiny HF")
    old_blob = write_tiny_gguf(repo / "blobs" / "old456", name="Tiny HF old", seed=1)
    for rev, target in (("rev-old", old_blob), ("rev-main", blob)):
        (repo / "snapshots" / rev).mkdir(parents=True)
        os.symlink(target, repo / "snapshots" / rev / "tiny-q8_0.gguf")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev-main")
    (repo / "snapshots" / "rev-main" / "gone.gguf").symlink_to(repo / "blobs" / "missing")
    return root


@pytest.fixture
def library(tmp_path) -> ModelLibrary:
    return ModelLibrary(tmp_path / "data", scan_dirs=[], builtin=None)


def test_downloaded_models_are_listed_with_their_metadata(library):
    write_tiny_gguf(library.models_dir / "acme" / "Tiny-GGUF" / "tiny.gguf", name="Tiny", n_ctx_train=512,
                    file_type=7)
    (entry,) = library.list()
    assert entry.name == "acme/Tiny-GGUF/tiny.gguf"
    assert (entry.source, entry.repo, entry.owned, entry.broken, entry.supported) == ("downloaded", "acme/Tiny-GGUF", True, False, True)
    info = entry.info
    assert (info.architecture, info.title, info.context_length, info.quantization, info.has_chat_template) == \
        ("llama", "Tiny", 512, "Q8_0", True)
    assert info.parameter_count == parameter_count()
    assert info.runs and info.reasons == [] and info.memory_bytes > 0
    assert entry.file_size == entry.path.stat().st_size


def test_quantization_falls_back_to_the_dominant_tensor_type(library):
    write_tiny_gguf(library.models_dir / "a" / "b" / "x.gguf", file_type=None, chat_template=None)
    (entry,) = library.list()
    assert entry.info.quantization == "F32"
    assert entry.info.has_chat_template is False


def test_a_broken_file_is_listed_with_the_reader_message(library):
    bad = library.models_dir / "acme" / "Bad" / "bad.gguf"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    write_tiny_gguf(library.models_dir / "acme" / "Good" / "good.gguf")
    entries = names(library)
    assert entries["acme/Good/good.gguf"].broken is False
    broken = entries["acme/Bad/bad.gguf"]
    assert broken.broken and not broken.supported
    assert broken.info.error == "metadata count 18446744073709551615 is impossible for a file of 48 bytes"


def test_metadata_is_cached_by_path_size_and_mtime(library, monkeypatch):
    path = write_tiny_gguf(library.models_dir / "a" / "b" / "x.gguf", name="First")
    calls = []
    real = metadata_cache.read_model_info
    monkeypatch.setattr(metadata_cache, "read_model_info", lambda p: calls.append(p) or real(p))
    assert library.list()[0].info.title == "First"
    assert library.list()[0].info.title == "First"
    assert calls == [path]  # the second listing came from the cache file
    write_tiny_gguf(path, name="Second")
    os.utime(path, ns=(1, 1))
    assert library.list()[0].info.title == "Second"
    assert len(calls) == 2


def test_hf_cache_and_lm_studio_are_found_without_copying(tmp_path):
    hf = make_hf_cache(tmp_path / "hf" / "hub")
    lms = tmp_path / "home" / ".lmstudio" / "models"
    write_tiny_gguf(lms / "lmstudio-community" / "Tiny-GGUF" / "Tiny-Q4_K_M.gguf", file_type=15)
    write_tiny_gguf(lms / "someone" / "Big-GGUF" / "big-00001-of-00002.gguf")
    write_tiny_gguf(lms / "someone" / "Big-GGUF" / "big-00002-of-00002.gguf")
    library = ModelLibrary(tmp_path / "data", scan_dirs=[hf, lms, tmp_path / "absent"],
                           builtin=None)
    entries = names(library)
    assert set(entries) == {"hf-cache/acme/Tiny-GGUF/tiny-q8_0.gguf", "hf-cache/acme/Tiny-GGUF/gone.gguf",
                            "lmstudio/lmstudio-community/Tiny-GGUF/Tiny-Q4_K_M.gguf",
                            "lmstudio/someone/Big-GGUF/big-00001-of-00002.gguf"}
    hf_entry = entries["hf-cache/acme/Tiny-GGUF/tiny-q8_0.gguf"]
    assert (hf_entry.source, hf_entry.repo, hf_entry.owned) == ("external", "acme/Tiny-GGUF", False)
    assert hf_entry.info.title == "Tiny HF"  # the refs/main snapshot, not the older one
    assert "broken link" in entries["hf-cache/acme/Tiny-GGUF/gone.gguf"].info.error
    assert "split into 2 files" in entries["lmstudio/someone/Big-GGUF/big-00001-of-00002.gguf"].info.error
    assert entries["lmstudio/lmstudio-community/Tiny-GGUF/Tiny-Q4_K_M.gguf"].info.quantization == "Q4_K_M"
    assert not any(library.data_dir.rglob("*.gguf"))


def test_the_assembled_builtin_model_is_listed_and_cannot_be_removed(tmp_path, monkeypatch):
    gguf = tmp_path / "Builtin.Q4_1.gguf"
    write_tiny_gguf(gguf, name="Builtin")
    whole = gguf.read_bytes()
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    spec = install_fake_parts(site, [whole[:1000], whole[1000:]])
    builtin = BuiltinModel(spec, tmp_path / "builtin")
    library = ModelLibrary(tmp_path / "data", scan_dirs=[], builtin=builtin)
    assert library.list() == []  # not assembled yet: nothing to offer
    builtin.ensure()
    (entry,) = library.list()
    assert (entry.name, entry.source, entry.info.title) == ("builtin/fake.gguf", "builtin", "Builtin")
    assert entry.origin == f"assembled in {tmp_path / 'builtin'}" and not entry.owned
    with pytest.raises(LibraryError, match="ships with Hearth"):
        library.remove(entry.name)
    assert entry.path.exists()


@pytest.mark.slow
def test_the_real_builtin_model_is_qwen25_coder(tmp_path, builtin_model):
    (entry,) = ModelLibrary(tmp_path, scan_dirs=[]).list()
    assert entry.name == "builtin/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" and str(entry.path) == builtin_model
    assert entry.file_size == model_path("qwen25coder").stat().st_size
    assert (entry.info.architecture, entry.info.quantization) == ("qwen2", "Q4_K_M")
    assert entry.info.has_chat_template and entry.supported


def test_import_copy_then_remove_deletes_the_copy_only(library, tmp_path):
    source = write_tiny_gguf(tmp_path / "elsewhere" / "mine.gguf")
    entry = library.import_file(source, mode="copy")
    assert (entry.name, entry.source, entry.owned) == ("imported/mine.gguf", "imported", True)
    assert entry.path.parent == library.imported_dir and entry.path.read_bytes() == source.read_bytes()
    with pytest.raises(LibraryError, match="already in the library"):
        library.import_file(source)
    plan = library.plan_removal(entry.name)
    assert plan.delete == (entry.path,)
    library.remove(entry.name)
    assert not entry.path.exists() and source.exists()
    assert library.list() == []


def test_import_link_is_forgotten_not_deleted(library, tmp_path):
    source = write_tiny_gguf(tmp_path / "elsewhere" / "linked.gguf")
    entry = library.import_file(source, mode="link")
    assert (entry.path, entry.owned) == (source.resolve(), False)
    plan = library.remove(entry.name)
    assert plan.delete == () and "stays where it is" in plan.message
    assert source.exists() and library.list() == []


def test_a_linked_file_that_disappeared_is_listed_as_broken(library, tmp_path):
    source = write_tiny_gguf(tmp_path / "elsewhere" / "linked.gguf")
    library.import_file(source, mode="link")
    source.unlink()
    (entry,) = library.list()
    assert entry.broken and "missing" in entry.info.error


def test_import_refuses_invalid_and_unsupported_files(library, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all, just text" * 10)
    with pytest.raises(LibraryError, match="not a usable GGUF model: not a GGUF file"):
        library.import_file(junk)
    other = write_tiny_gguf(tmp_path / "rwkv7.gguf", arch="rwkv7")
    with pytest.raises(LibraryError, match="rwkv7.gguf won't load: unsupported architecture 'rwkv7'"):
        library.import_file(other, mode="link")
    with pytest.raises(LibraryError, match="is not a file"):
        library.import_file(tmp_path / "nope.gguf")
    assert library.list() == []


def test_remove_deletes_downloads_and_refuses_external_files(tmp_path):
    hf = make_hf_cache(tmp_path / "hub")
    library = ModelLibrary(tmp_path / "data", scan_dirs=[hf], builtin=None)
    downloaded = write_tiny_gguf(library.models_dir / "acme" / "Tiny-GGUF" / "tiny.gguf")
    library.remove("acme/Tiny-GGUF/tiny.gguf")
    assert not downloaded.exists() and not (library.models_dir / "acme").exists()
    with pytest.raises(LibraryError, match="Hearth only deletes files it created"):
        library.remove("hf-cache/acme/Tiny-GGUF/tiny-q8_0.gguf")
    assert (hf / "models--acme--Tiny-GGUF" / "blobs" / "abc123").exists()
    with pytest.raises(LibraryError, match="no model named"):
        library.remove("acme/Tiny-GGUF/tiny.gguf")
