"""Damaged state files at start-up: the registry of imported models, the model metadata cache and KV snapshots.

Each is truncated or garbled as a crash or a bad disk would leave it; the app still starts, keeps what is readable,
moves the damaged file aside (kept, never deleted) with a notice naming where it went, and loses nothing else.
(The database and the download state files have their own tests in test_store.py and models/test_downloads.py.)
"""

from __future__ import annotations

import json

import pytest

from app.models.json_files import write_json
from app.models.library import ModelLibrary
from app.models.metadata_cache import CACHE_VERSION, MetadataCache
from app.snapshot_cache import SnapshotCache
from app.store import DB_FILENAME, ConversationStore
from engine.compatibility import engine_signature
from tests.app.models.tiny_gguf import write_tiny_gguf
from tests.engine.gguf_builders import write_tiny_llama

from .fake_engine import FakeFactory, FakeModel

DAMAGE = {
    "truncated": lambda b: b[: len(b) * 2 // 3],
    "garbled": lambda b: b"\x00\xff\xfe" + b[3:],
}


def registry_of(library: ModelLibrary) -> list[str]:
    return [r["path"] for r in library._registry()]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_registry_of_imported_models_is_moved_aside_and_its_readable_records_kept(tmp_path, how):
    data = tmp_path / "data"
    models = [write_tiny_gguf(tmp_path / f"m{i}.gguf", name=f"Model {i}") for i in range(3)]
    library = ModelLibrary(data, scan_dirs=[], builtin=None)
    for path in models:
        library.import_file(path, mode="link")
    registry = data / "imported.json"
    damaged = DAMAGE[how](registry.read_bytes())
    registry.write_bytes(damaged)

    again = ModelLibrary(data, scan_dirs=[], builtin=None)  # the next start
    (notice,) = again.check_registry()
    (moved,) = data.glob("imported.json.damaged-*")
    assert moved.read_bytes() == damaged and str(moved) in notice and "damaged" in notice
    kept = [str(p) for p in models[:2]] if how == "truncated" else [str(p) for p in models]
    assert registry_of(again) == kept  # truncated: the cut third record is gone, the two before it stay
    assert f"{len(kept)} imported model(s)" in notice
    assert [e.path for e in again.list()] == [p.resolve() for p in models[: len(kept)]]
    assert json.loads(registry.read_text()) == [r for r in again._registry()]  # rewritten whole
    assert ModelLibrary(data, scan_dirs=[], builtin=None).check_registry() == []  # once, not at every start


def test_a_registry_that_is_not_json_at_all_starts_empty_and_imports_still_work(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "imported.json").write_bytes(b"\x89PNG\r\n\x1a\n not a registry")
    library = ModelLibrary(data, scan_dirs=[], builtin=None)
    (notice,) = library.check_registry()
    assert "0 imported model(s)" in notice and len(list(data.glob("imported.json.damaged-*"))) == 1
    entry = library.import_file(write_tiny_gguf(tmp_path / "m.gguf", name="M"), mode="link")
    assert entry.name == "imported/m.gguf" and registry_of(library) == [str((tmp_path / "m.gguf").resolve())]


@pytest.mark.parametrize("stored", [
    [1, 2],
    {"version": CACHE_VERSION, "engine": "SIG", "files": ["not", "a", "dict"]},
    {"version": CACHE_VERSION, "engine": "SIG", "files": {"PATH": {"size": 0, "mtime_ns": 0, "info": "a string"}}},
    {"version": CACHE_VERSION, "engine": "SIG", "files": {"PATH": {"size": 0, "mtime_ns": 0, "info": {"x": 1}}}},
], ids=["a-list", "files-not-a-dict", "info-not-a-dict", "unknown-info-field"])
def test_a_metadata_cache_of_the_wrong_shape_is_rebuilt_from_the_files(tmp_path, stored):
    path = write_tiny_gguf(tmp_path / "m.gguf", name="Cached")
    text = json.dumps(stored).replace('"SIG"', json.dumps(engine_signature())).replace("PATH", str(path))
    if "mtime_ns" in text:  # the damaged record matches the file's size and time, so only its shape is wrong
        st = path.stat()
        text = text.replace('"size": 0', f'"size": {st.st_size}').replace('"mtime_ns": 0', f'"mtime_ns": {st.st_mtime_ns}')
    cache_path = tmp_path / "cache.json"
    cache_path.write_text(text)
    info = MetadataCache(cache_path).lookup([path])[path]
    assert info.error is None and info.title == "Cached"
    assert json.loads(cache_path.read_text())["files"][str(path)]["info"]["title"] == "Cached"


@pytest.fixture(scope="module")
def snapshot_bytes(tmp_path_factory) -> tuple[bytes, str]:
    """A real snapshot of a tiny model and the model's sha256."""
    import engine.model

    folder = tmp_path_factory.mktemp("snap")
    model = engine.model.load(write_tiny_llama(folder / "tiny.gguf"), backend="numpy")
    try:
        model.next_token_logits([3, 4, 5, 6, 7])
        model.save_session(folder / "s.hearth")
        return (folder / "s.hearth").read_bytes(), model.sha256
    finally:
        model.close()


@pytest.mark.parametrize("how", [*DAMAGE, "cut-in-header", "empty"])
def test_a_damaged_snapshot_is_moved_aside_with_a_notice_and_the_others_stay(tmp_path, snapshot_bytes, how):
    good, sha = snapshot_bytes
    damage = {**DAMAGE, "cut-in-header": lambda b: b[:40], "empty": lambda b: b""}[how]
    folder = tmp_path / "snapshots"
    folder.mkdir()
    (folder / f"c1-{sha}.hearth").write_bytes(good)
    (folder / f"c2-{sha}.hearth").write_bytes(damage(good))
    (folder / f"c3-{sha}.hearth").write_bytes(good)
    cache = SnapshotCache(folder)
    assert sorted(e.conversation_id for e in cache.entries()) == [1, 3]
    (moved,) = folder.glob(f"c2-{sha}.hearth.damaged-*")
    assert moved.read_bytes() == damage(good)
    (notice,) = cache.notices
    assert str(moved) in notice and "conversation 2" in notice
    assert (folder / f"c1-{sha}.hearth").read_bytes() == good == (folder / f"c3-{sha}.hearth").read_bytes()
    again = SnapshotCache(folder)  # the next start: nothing more to report
    assert sorted(e.conversation_id for e in again.entries()) == [1, 3] and again.notices == []


def test_the_app_starts_with_every_damaged_state_file_and_names_each_in_its_notice(qtbot, make_session, tmp_path,
                                                                                     snapshot_bytes):
    data = tmp_path / "data"
    store = ConversationStore(data / DB_FILENAME)
    conv = store.create_conversation("kept")
    store.add_message(conv.id, "user", "hello")
    store.add_message(conv.id, "assistant", "hi there")
    store.close()
    write_json(data / "imported.json", [{"path": str(tmp_path / "gone.gguf"), "mode": "link"}])
    (data / "imported.json").write_bytes((data / "imported.json").read_bytes()[:-5])
    good, sha = snapshot_bytes
    (data / "snapshots").mkdir()
    (data / "snapshots" / f"c{conv.id}-{sha}.hearth").write_bytes(good[: len(good) // 2])
    (data / "model-metadata-cache.json").write_bytes(b"{\"version\": 2, \"files\": {")  # a cache: rebuilt, no notice
    session = make_session(engine_factory=FakeFactory(FakeModel(["Hi"])))
    bar = session.window.notice_bar
    qtbot.waitUntil(bar.isVisible, timeout=20000)
    (registry_moved,) = data.glob("imported.json.damaged-*")
    (snapshot_moved,) = (data / "snapshots").glob("*.damaged-*")
    assert str(registry_moved) in bar.label.text() and str(snapshot_moved) in bar.label.text()
    assert [c.title for c in session.store.conversations()] == ["kept"]
    assert [m.content for m in session.store.messages(conv.id)] == ["hello", "hi there"]
