"""An LRU cache of session snapshots (KV state) per conversation and model, in a memory tier and a disk tier.

No Qt. The engine restores a snapshot only from a file (``Model.load_session(path)``), so the memory tier is
a folder on a RAM file system (``/dev/shm`` on Linux) under a memory budget; the disk tier is a folder in the
data dir under a disk budget. New snapshots go to memory; the least recently used ones move to disk when
memory is over budget, and the least recently used disk ones are deleted when disk is over budget. Disk
entries survive a restart (their order is kept in the files' modification times); memory entries do not.
Keys are ``(conversation id, model sha256)``: one model's snapshot never restores into another.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

import psutil

from engine.atomic_write import atomic_write
from engine.session import SessionError, check_file

log = logging.getLogger(__name__)

Tier = Literal["memory", "disk"]
SUFFIX = ".hearth"
NAME = re.compile(r"c(\d+)-([0-9a-f]{64})\.hearth")
PARTIAL = re.compile(r"\.c\d+-[0-9a-f]{64}\.hearth\..+\.tmp")  # atomic_write's temp file, left by a kill mid-write
DEFAULT_DISK_BUDGET = 4 << 30
MAX_MEMORY_BUDGET = 512 << 20


@dataclasses.dataclass
class CacheEntry:
    conversation_id: int
    model_sha256: str
    tier: Tier
    path: Path
    size: int


def default_memory_dir(data_dir: Path) -> Path | None:
    """A folder on ``/dev/shm`` private to this data dir, or None where there is no RAM file system."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        return None
    tag = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:16]
    return shm / f"hearth-{os.getuid()}-{tag}"


def default_memory_budget() -> int:
    """A sixteenth of physical memory, at most 512 MiB."""
    return min(MAX_MEMORY_BUDGET, psutil.virtual_memory().total // 16)


class SnapshotCache:
    """Snapshots by (conversation id, model sha256), least recently used evicted first. Thread-safe."""

    def __init__(self, disk_dir: Path, disk_budget: int = DEFAULT_DISK_BUDGET, memory_dir: Path | None = None,
                 memory_budget: int = 0):
        self.dirs: dict[Tier, Path | None] = {"disk": Path(disk_dir), "memory": Path(memory_dir) if memory_dir else None}
        self.budgets: dict[Tier, int] = {"disk": disk_budget, "memory": memory_budget if memory_dir else 0}
        self._entries: collections.OrderedDict[tuple[int, str], CacheEntry] = collections.OrderedDict()  # oldest first
        self.notices: list[str] = []  # for the user: damaged snapshots found at start-up and where they went
        self._lock = threading.RLock()
        self.dirs["disk"].mkdir(parents=True, exist_ok=True)
        if self.dirs["memory"] is not None:  # made on first use, so a run that never parks leaves nothing there
            shutil.rmtree(self.dirs["memory"], ignore_errors=True)  # left by a run that did not close: stale
        self._load_disk()

    # -- queries -------------------------------------------------------------------------------------
    def lookup(self, conversation_id: int, model_sha256: str) -> CacheEntry | None:
        """The snapshot for this conversation and model, marked most recently used; None when there is none."""
        with self._lock:
            entry = self._entries.get((conversation_id, model_sha256))
            if entry is None:
                return None
            if not entry.path.exists():  # deleted behind our back
                del self._entries[(conversation_id, model_sha256)]
                return None
            self._touch(entry)
            return entry

    def entries(self) -> list[CacheEntry]:
        """Every entry, least recently used first."""
        with self._lock:
            return list(self._entries.values())

    def used(self, tier: Tier) -> int:
        with self._lock:
            return sum(e.size for e in self._entries.values() if e.tier == tier)

    # -- changes -------------------------------------------------------------------------------------
    def save(self, conversation_id: int, model_sha256: str, write: Callable[[Path], None],
             tier: Tier = "memory") -> CacheEntry:
        """Store a snapshot: ``write(path)`` writes it (atomically); then the budgets are enforced.

        The memory tier is used when asked for and there is one; if writing there fails (the RAM file system is
        full), the snapshot goes to disk. Exceptions of ``write`` for the disk tier propagate.
        """
        tier = tier if self.dirs["memory"] is not None and self.budgets["memory"] > 0 else "disk"
        with self._lock:
            self.discard(conversation_id, model_sha256)
            path = self._path(tier, conversation_id, model_sha256)
            try:
                path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
                write(path)
            except OSError:
                if tier == "disk":
                    raise
                tier, path = "disk", self._path("disk", conversation_id, model_sha256)
                write(path)
            entry = CacheEntry(conversation_id, model_sha256, tier, path, path.stat().st_size)
            self._entries[(conversation_id, model_sha256)] = entry
            self._enforce_budgets()
            return self._entries.get((conversation_id, model_sha256), entry)

    def persist(self, conversation_id: int, model_sha256: str) -> None:
        """Move the entry to disk if it is in memory, so it survives the end of this run."""
        with self._lock:
            entry = self._entries.get((conversation_id, model_sha256))
            if entry is not None and entry.tier == "memory":
                self._demote(entry)

    def discard(self, conversation_id: int, model_sha256: str | None = None) -> None:
        """Forget (and delete) the conversation's snapshots, of one model or of all."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == conversation_id and model_sha256 in (None, k[1])]:
                self._entries.pop(key).path.unlink(missing_ok=True)

    def retain(self, conversation_ids: Iterable[int]) -> None:
        """Delete the snapshots of every conversation not in ``conversation_ids`` (deleted conversations)."""
        keep = set(conversation_ids)
        with self._lock:
            for conversation_id in {k[0] for k in self._entries} - keep:
                self.discard(conversation_id)

    def close(self) -> None:
        """Delete the memory tier (the disk tier stays for the next run)."""
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.tier == "memory"]:
                del self._entries[key]
            if self.dirs["memory"] is not None:
                shutil.rmtree(self.dirs["memory"], ignore_errors=True)

    # -- internals -----------------------------------------------------------------------------------
    def _path(self, tier: Tier, conversation_id: int, model_sha256: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{64}", model_sha256):
            raise ValueError(f"not a sha256: {model_sha256!r}")
        return self.dirs[tier] / f"c{int(conversation_id)}-{model_sha256}{SUFFIX}"

    def _load_disk(self) -> None:
        for path in self.dirs["disk"].glob(".*.tmp"):  # one app per data dir: no write of ours is under way
            if PARTIAL.fullmatch(path.name):
                path.unlink(missing_ok=True)
        found = []
        for path in self.dirs["disk"].glob(f"*{SUFFIX}"):
            m = NAME.fullmatch(path.name)
            if m is None:
                continue
            try:
                check_file(path)
            except (SessionError, OSError) as e:
                self._move_aside(path, int(m.group(1)), str(e))
                continue
            st = path.stat()
            found.append((st.st_mtime_ns, CacheEntry(int(m.group(1)), m.group(2), "disk", path, st.st_size)))
        for _, entry in sorted(found, key=lambda item: item[0]):
            self._entries[(entry.conversation_id, entry.model_sha256)] = entry
        self._enforce_budgets()

    def _move_aside(self, path: Path, conversation_id: int, reason: str) -> None:
        """Keep a damaged snapshot out of the cache's way (renamed beside it, not deleted) and say so."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = path.with_name(f"{path.name}.damaged-{stamp}")
        try:
            os.replace(path, target)
        except OSError as e:
            log.warning("could not move the damaged snapshot %s aside: %s", path, e)
            return
        self.notices.append(f"The saved state of conversation {conversation_id} was damaged ({reason}); it was "
                            f"moved to {target}. The conversation itself is intact: its next answer reads it again "
                            "from the start.")

    def _touch(self, entry: CacheEntry) -> None:
        self._entries.move_to_end((entry.conversation_id, entry.model_sha256))
        now = time.time_ns()
        os.utime(entry.path, ns=(now, now))  # the order survives a restart (and a move to disk)

    def _enforce_budgets(self) -> None:
        while self.used("memory") > self.budgets["memory"]:
            self._demote(next(e for e in self._entries.values() if e.tier == "memory"))
        while self.used("disk") > self.budgets["disk"]:
            oldest = next(e for e in self._entries.values() if e.tier == "disk")
            self._entries.pop((oldest.conversation_id, oldest.model_sha256)).path.unlink(missing_ok=True)

    def _demote(self, entry: CacheEntry) -> None:
        """Move a memory entry to disk, keeping its place in the LRU order."""
        target = self._path("disk", entry.conversation_id, entry.model_sha256)
        try:
            with open(entry.path, "rb") as src, atomic_write(target) as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
            st = entry.path.stat()
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        except OSError:
            target = None  # the disk is full or unwritable: the snapshot is dropped, only a cache is lost
        entry.path.unlink(missing_ok=True)
        if target is None:
            del self._entries[(entry.conversation_id, entry.model_sha256)]
        else:
            entry.tier, entry.path = "disk", target


class ConversationStates:
    """Which conversation's KV state is live in the model, moving states out to and in from a SnapshotCache.

    Used on the engine thread only, by the worker. A conversation's state is saved when another one takes the
    model (or the model closes) and only if it changed since it was restored; it is restored when its
    conversation comes back and a snapshot for this model is in the cache. A snapshot the engine refuses is
    deleted. Without a cache, this only tracks ownership.
    """

    def __init__(self, cache: SnapshotCache | None):
        self.cache = cache
        self.model = None
        self.owner: int | None = None  # the conversation whose state is in the model
        self.dirty = False  # the live state changed since it was saved or restored
        self._note: dict | None = None  # how the owner's state got in, for the next answer's stats

    def attach(self, model) -> None:
        """A model was loaded: its (empty) state belongs to no conversation."""
        self.model, self.owner, self.dirty, self._note = model, None, False, None

    def detach(self, tier: Tier = "memory") -> None:
        """The model is about to close: save the live state first (for "disk", also when it is cached unchanged
        in memory, so it outlives this run)."""
        if self.park(tier) is None and tier == "disk" and self.cache and self.model and self.owner is not None:
            self.cache.persist(self.owner, self.model.sha256)
        self.model, self.owner = None, None

    def switch(self, conversation_id: int | None) -> dict | None:
        """Make ``conversation_id`` the owner: save the outgoing state, restore the incoming one if cached.

        Returns what was restored ({"restored_from": tier, "restored_tokens": n}) or None.
        """
        if self.model is None or conversation_id is None or conversation_id == self.owner:
            return None
        self.park()
        self.owner, self.dirty, self._note = conversation_id, False, None
        entry = self.cache.lookup(conversation_id, self.model.sha256) if self.cache else None
        if entry is None:
            return None
        try:
            session = self.model.load_session(entry.path)
        except (SessionError, OSError) as e:
            log.info("snapshot of conversation %s not restored: %s", conversation_id, e)
            self.cache.discard(conversation_id, self.model.sha256)
            return None
        self._note = {"restored_from": entry.tier, "restored_tokens": len(session.tokens)}
        return self._note

    def park(self, tier: Tier = "memory") -> CacheEntry | None:
        """Save the owner's live state into the cache if it changed; None when nothing was saved."""
        if self.cache is None or self.model is None or self.owner is None or not self.dirty:
            return None
        model = self.model
        try:
            entry = self.cache.save(self.owner, model.sha256, lambda path: model.save_session(path), tier)
        except (SessionError, OSError) as e:
            log.warning("could not keep the state of conversation %s: %s", self.owner, e)
            return None
        self.dirty = False
        return entry

    def changed(self, conversation_id: int | None, note: dict | None = None) -> None:
        """The live state now belongs to ``conversation_id`` and is not saved (an answer, a restore from a file)."""
        if conversation_id != self.owner:
            self.owner, self._note = conversation_id, None
        self.dirty = conversation_id is not None
        if note is not None:
            self._note = note

    def take_note(self) -> dict | None:
        """How the owner's state was restored, once: the next answer's stats carry it."""
        note, self._note = self._note, None
        return note
