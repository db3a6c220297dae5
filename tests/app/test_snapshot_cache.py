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
        cache.save(conv, A, writer(10 * KB), tier="disk" if conv < 3 else "memory")
    os.utime(disk / f"c1-{A}.hearth", ns=(1, 1))  # make the order independent of the clock's resolution
    os.utime(disk / f"c2-{A}.hearth", ns=(2, 2))
    cache.lookup(1, A)
    again = SnapshotCache(disk, memory_dir=shm, memory_budget=15 * KB)  # a new run; the old never closed
    assert [(e.conversation_id, e.tier) for e in again.entries()] == [(2, "disk"), (1, "disk")]
    assert list(shm.iterdir()) == []


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
