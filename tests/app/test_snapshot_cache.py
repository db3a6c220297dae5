"""The snapshot cache on its own (tiers, budgets, LRU order, restart), then through the real worker and model."""

import os

import pytest

from app.snapshot_cache import SnapshotCache

A, B = "a" * 64, "b" * 64
KB = 1024


def writer(size, content=b"x"):
    def write(path):
        path.write_bytes(content * size)
    return write


def session_writer(size):
    """Writes a well-formed snapshot container of about ``size`` bytes (the cache checks files at start-up)."""
    import numpy as np
    from safetensors.numpy import save

    def write(path):
        path.write_bytes(save({"tokens": np.zeros(size // 4, np.int32)},
                              metadata={"format": "hearth-session", "version": "1"}))
    return write


@pytest.fixture
def dirs(tmp_path):
    return tmp_path / "disk", tmp_path / "shm"


def test_new_snapshots_go_to_memory_and_the_oldest_move_to_disk(dirs):
    disk, shm = dirs
    cache = SnapshotCache(disk, disk_budget=100 * KB, memory_dir=shm, memory_budget=25 * KB)
    for conv in (1, 2, 3):
        cache.save(conv, A, writer(10 * KB, bytes([48 + conv])))
    assert [(e.conversation_id, e.tier) for e in cache.entries()] == [(1, "disk"), (2, "memory"), (3, "memory")]
    assert sorted(p.name for p in disk.iterdir()) == [f"c1-{A}.hearth"] and len(list(shm.iterdir())) == 2
    assert cache.lookup(1, A).path.read_bytes() == b"1" * 10 * KB  # moved intact
    assert cache.used("memory") == 20 * KB and cache.used("disk") == 10 * KB


def test_the_least_recently_used_is_evicted_from_disk(dirs):
    disk, _ = dirs
    cache = SnapshotCache(disk, disk_budget=30 * KB)
    for conv in (1, 2, 3):
        cache.save(conv, A, writer(10 * KB))
    assert cache.lookup(1, A) is not None  # 1 is now the most recently used
    cache.save(4, A, writer(10 * KB))
    assert [e.conversation_id for e in cache.entries()] == [3, 1, 4]
    assert not (disk / f"c2-{A}.hearth").exists()
    assert cache.lookup(2, A) is None


def test_keys_are_conversation_and_model(dirs):
    disk, _ = dirs
    cache = SnapshotCache(disk)
    cache.save(1, A, writer(10))
    assert cache.lookup(1, B) is None and cache.lookup(2, A) is None and cache.lookup(1, A).model_sha256 == A
    cache.save(1, B, writer(10))
    cache.discard(1, A)
    assert cache.lookup(1, A) is None and cache.lookup(1, B) is not None
    with pytest.raises(ValueError):
        cache.save(1, "../../etc", writer(1))


def test_a_snapshot_larger_than_memory_goes_to_disk(dirs):
    disk, shm = dirs
    cache = SnapshotCache(disk, memory_dir=shm, memory_budget=5 * KB)
    entry = cache.save(1, A, writer(8 * KB))
    assert entry.tier == "disk" and entry.path.parent == disk and list(shm.iterdir()) == []


def test_a_full_memory_file_system_falls_back_to_disk(dirs):
    disk, shm = dirs
    cache = SnapshotCache(disk, memory_dir=shm, memory_budget=1 << 20)

    def write(path):
        if path.parent == shm:
            raise OSError(28, "No space left on device")
        path.write_bytes(b"state")
    assert cache.save(1, A, write).tier == "disk"


def test_disk_entries_and_their_order_survive_a_restart_and_memory_does_not(dirs):
    disk, shm = dirs
    cache = SnapshotCache(disk, memory_dir=shm, memory_budget=15 * KB)
    for conv in (1, 2, 3):
        cache.save(conv, A, session_writer(10 * KB), tier="disk" if conv < 3 else "memory")
    os.utime(disk / f"c1-{A}.hearth", ns=(1, 1))  # make the order independent of the clock's resolution
    os.utime(disk / f"c2-{A}.hearth", ns=(2, 2))
    cache.lookup(1, A)
    again = SnapshotCache(disk, memory_dir=shm, memory_budget=15 * KB)  # a new run; the old never closed
    assert [(e.conversation_id, e.tier) for e in again.entries()] == [(2, "disk"), (1, "disk")]
    assert not shm.exists()  # the stale memory tier is gone; a new one is made on first use


def test_retain_drops_deleted_conversations_and_close_empties_memory(dirs):
    disk, shm = dirs
    cache = SnapshotCache(disk, memory_dir=shm, memory_budget=1 << 20)
    for conv in (1, 2, 3):
        cache.save(conv, A, writer(10), tier="disk" if conv == 1 else "memory")
    cache.retain([1, 3])
    assert [e.conversation_id for e in cache.entries()] == [1, 3]
    cache.close()
    assert [e.conversation_id for e in cache.entries()] == [1] and not shm.exists()
    assert (disk / f"c1-{A}.hearth").exists()


def test_files_that_are_not_snapshots_are_left_alone(dirs):
    disk, _ = dirs
    disk.mkdir()
    (disk / "notes.txt").write_text("mine")
    (disk / "c1-short.hearth").write_text("not ours")
    cache = SnapshotCache(disk, disk_budget=0)
    assert cache.entries() == [] and (disk / "notes.txt").exists() and (disk / "c1-short.hearth").exists()


# -- through the real worker and the built-in model ----------------------------------------------------------
@pytest.fixture
def real_host(qtbot, tmp_path):
    from app.engine_host import EngineHost

    hosts = []

    def make(cache=None):
        host = EngineHost(snapshots=cache)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.shutdown()


@pytest.fixture(scope="module")
def tokenizer_model(small_model):
    """The small model loaded in the test process, only to count tokens the way the worker does."""
    import engine.model

    model = engine.model.load(small_model, n_ctx=2048)
    yield model
    model.close()


def answer(qtbot, host, model_path, conversation_id, messages, max_tokens=8):
    from PySide6.QtCore import QObject

    replies = []
    connection = host.tokens.connect(lambda rid, text: replies.append(text))
    with qtbot.waitSignal(host.finished, timeout=300000) as finished:
        host.generate(model_path, 2048, messages, {"max_tokens": max_tokens, "temperature": 0.0,
                                                   "conversation_id": conversation_id})
    QObject.disconnect(connection)
    return "".join(replies), finished.args[1]


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.slow
def test_a_saved_state_restores_into_a_fresh_worker_without_reprocessing(qtbot, real_host, small_model,
                                                                          tokenizer_model, tmp_path):
    history = [{"role": "system", "content": "You answer in one short sentence."},
               {"role": "user", "content": "Why is the sky blue? Explain it to a child, please."}]
    first = real_host()
    reply, _ = answer(qtbot, first, small_model, 1, history)
    history.append({"role": "assistant", "content": reply})
    path = str(tmp_path / "tea.hearth")
    with qtbot.waitSignal(first.state_saved, timeout=300000) as saved:
        first.save_state(1, small_model, 2048, path, history, {"title": "sky"})
    assert saved.args[2]["tokens"] == len(tokenizer_model.chat_ids(history)) and saved.args[2]["bytes"] > 0
    fresh = real_host()
    with qtbot.waitSignal(fresh.state_restored, timeout=300000) as restored:
        fresh.restore_state(7, small_model, 2048, path)
    assert restored.args[:2] == [7, path]
    follow_up = history + [{"role": "user", "content": "And at sunset?"}]
    _, stats = answer(qtbot, fresh, small_model, 7, follow_up)
    history_ids = tokenizer_model.chat_ids(history, add_generation_prompt=False)
    expected = common_prefix(tokenizer_model.chat_ids(history), tokenizer_model.chat_ids(follow_up))
    assert expected >= len(history_ids)  # the whole history is reused, plus the next turn's first marker
    assert stats["cached_tokens"] == expected and stats["restored_from"] == "file"
    print(f"\nrestored {restored.args[2]['tokens']} tokens; the next answer reused {stats['cached_tokens']} of "
          f"{stats['prompt_tokens']} prompt tokens")


@pytest.mark.slow
def test_switching_a_b_a_restores_a_from_the_cache(qtbot, real_host, small_model, tokenizer_model, tmp_path):
    cache = SnapshotCache(tmp_path / "disk", memory_dir=tmp_path / "shm", memory_budget=64 << 20)
    host = real_host(cache)
    a = [{"role": "user", "content": "List three fruits that are red."}]
    b = [{"role": "system", "content": "Reply in French."}, {"role": "user", "content": "Good morning!"}]
    reply_a, _ = answer(qtbot, host, small_model, 1, a)
    answer(qtbot, host, small_model, 2, b)
    assert [(e.conversation_id, e.tier) for e in cache.entries()] == [(1, "memory")]  # A parked when B came
    a2 = a + [{"role": "assistant", "content": reply_a}, {"role": "user", "content": "And yellow ones?"}]
    _, stats = answer(qtbot, host, small_model, 1, a2)
    without_cache = common_prefix(tokenizer_model.chat_ids(b), tokenizer_model.chat_ids(a2))
    assert stats["restored_from"] == "memory"
    assert stats["cached_tokens"] >= len(tokenizer_model.chat_ids(a)) > without_cache
    assert {e.conversation_id for e in cache.entries()} == {1, 2}  # B parked in turn
    print(f"\nA -> B -> A: the second answer in A reused {stats['cached_tokens']} of {stats['prompt_tokens']} "
          f"prompt tokens (without the cache: {without_cache})")


@pytest.mark.slow
def test_a_snapshot_the_engine_refuses_is_deleted_and_the_answer_still_comes(qtbot, real_host, small_model,
                                                                              tmp_path):
    cache = SnapshotCache(tmp_path / "disk")
    host = real_host(cache)
    with qtbot.waitSignal(host.loaded, timeout=300000) as loaded:
        host.load(small_model, 2048)
    sha = loaded.args[0]["sha256"]
    cache.save(3, sha, lambda path: path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage"), tier="disk")
    _, stats = answer(qtbot, host, small_model, 3, [{"role": "user", "content": "Hi"}], max_tokens=2)
    assert "restored_from" not in stats and stats["generated_tokens"] >= 1
    assert cache.lookup(3, sha) is None and list((tmp_path / "disk").glob("*.hearth")) == []


class StubModel:
    """Just enough of engine.model.Model for ConversationStates: writes and reads named snapshots."""

    sha256 = A

    def __init__(self):
        self.live = None

    def save_session(self, path, conversation=None):
        path.write_text(self.live)

    def load_session(self, path):
        self.live = path.read_text()
        return type("Session", (), {"tokens": [1] * len(self.live)})()


def test_states_park_the_outgoing_conversation_and_restore_the_incoming_one(dirs):
    from app.snapshot_cache import ConversationStates

    disk, shm = dirs
    states, model = ConversationStates(SnapshotCache(disk, memory_dir=shm, memory_budget=1 << 20)), StubModel()
    states.attach(model)
    assert states.switch(1) is None  # nothing cached yet
    model.live = "state of 1"
    states.changed(1)
    assert states.switch(2) is None and model.live == "state of 1"  # 1 parked; 2 has no snapshot
    model.live = "state of 2"
    states.changed(2)
    assert states.switch(1) == {"restored_from": "memory", "restored_tokens": 10} and model.live == "state of 1"
    assert states.take_note() == {"restored_from": "memory", "restored_tokens": 10} and states.take_note() is None
    states.detach(tier="disk")  # unchanged since restored, but only in memory: it goes to disk for the next run
    assert {(e.conversation_id, e.tier) for e in states.cache.entries()} == {(1, "disk"), (2, "memory")}
