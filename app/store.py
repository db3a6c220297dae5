"""The conversation store: SQLite in WAL mode, every finished message in its own durable transaction.

No Qt here. The GUI thread owns the one connection. A reply that is still streaming is written through a
``ReplyWriter``, which saves the text at most ``interval`` seconds apart, so a crash or a kill loses at most
the last moments of that reply and never a message the user already saw finish.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from engine.reasoning import ReasoningSplitter

from .chat_settings import ChatSettings
from .store_recovery import salvage

DB_FILENAME = "conversations.db"
DEFAULT_SETTINGS_KEY = "default_chat_settings"  # app_settings key of the settings new conversations start from
MESSAGE_STATES = ("complete", "streaming", "stopped", "interrupted", "error")


class StoreError(RuntimeError):
    """The store cannot be opened or written; the message says why."""


@dataclasses.dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    model_path: str | None
    settings: ChatSettings


@dataclasses.dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    seq: int  # position in the conversation; gaps are left by deleted messages
    role: str  # "user", "assistant" (system prompts live in the settings)
    content: str
    state: str  # one of MESSAGE_STATES
    stats: dict  # per-answer numbers (tokens, thinking_tokens, prefill_s, decode_tps, ...), {} for user messages
    created_at: float
    thinking: str = ""  # the model's reasoning before its answer ("Thinking"), kept apart from ``content``
    reply_to: int | None = None  # for an answer: the id of the user message it answers (None in old databases)
    alternative: int = 0  # which of its turn's answers this is, from 0 (regenerating keeps the earlier ones)
    alternatives: int = 1  # how many answers its turn has


def _v1(db: sqlite3.Connection) -> None:
    # AUTOINCREMENT: ids are never reused, so a view keyed by message id cannot mistake a new answer for an old one
    _run_script(db, """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            model_path TEXT,
            settings TEXT NOT NULL DEFAULT '{}'
        );
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'complete',
            stats TEXT NOT NULL DEFAULT '{}',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX messages_by_conversation ON messages(conversation_id, seq);
    """)


def _v2(db: sqlite3.Connection) -> None:
    # soft delete (for undo) and app-wide settings such as the last open conversation
    _run_script(db, """
        ALTER TABLE conversations ADD COLUMN deleted_at REAL;
        CREATE TABLE app_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """)


def _v3(db: sqlite3.Connection) -> None:
    # a reply's reasoning, kept apart from its answer; older messages have none
    _run_script(db, "ALTER TABLE messages ADD COLUMN thinking TEXT NOT NULL DEFAULT ''")


def _v4(db: sqlite3.Connection) -> None:
    # regenerating keeps earlier answers as alternatives: all answers of a turn share ``reply_to`` (the question's
    # id) and one of them is ``active`` (shown, and sent to the model); older answers are active and stand alone
    _run_script(db, """
        ALTER TABLE messages ADD COLUMN reply_to INTEGER;
        ALTER TABLE messages ADD COLUMN active INTEGER NOT NULL DEFAULT 1;
        CREATE INDEX messages_by_reply ON messages(reply_to)
    """)


def _run_script(db: sqlite3.Connection, script: str) -> None:
    # statement by statement: executescript() would commit the migration's transaction half-way
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_v1, _v2, _v3, _v4)  # MIGRATIONS[i]: version i -> i + 1
SCHEMA_VERSION = len(MIGRATIONS)


def check_integrity(path: Path) -> str | None:
    """None when the database at ``path`` is sound (or absent), else what SQLite found wrong."""
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(path)
        try:
            rows = db.execute("PRAGMA integrity_check").fetchall()
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        return str(e)
    problems = [r[0] for r in rows if r[0] != "ok"]
    return "; ".join(problems[:5]) or None


def quarantine(path: Path, clock: Callable[[], float] = time.time) -> Path:
    """Move a damaged database (and its WAL and shared-memory files) aside; return the new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(clock()))
    target = path.with_name(f"{path.stem}.damaged-{stamp}{path.suffix}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(str(path) + suffix)
        if src.exists():
            src.rename(Path(str(target) + suffix))
    return target


class ConversationStore:
    """Conversations, their messages and per-conversation settings in one SQLite file."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.clock = clock
        self.db = sqlite3.connect(self.path, isolation_level=None)  # autocommit; transactions are explicit
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.execute("PRAGMA busy_timeout=5000")
        self._migrate()

    @classmethod
    def open(cls, path: str | Path) -> tuple[ConversationStore, str | None]:
        """Open the store, first checking the file; a damaged file is moved aside and a fresh one started with
        every row that could still be read from it (``app.store_recovery.salvage``).

        Returns:
            The store and, when a damaged file was moved aside, a message for the user saying where it went.
        """
        path = Path(path)
        problem = check_integrity(path)
        notice = None
        moved = quarantine(path) if problem else None
        store = cls(path)
        if moved is not None:
            copied = salvage(moved, store.db)
            kept = (f"{copied.get('conversations', 0):,} conversations and {copied.get('messages', 0):,} messages "
                    f"that could still be read were kept in a new one")
            notice = f"The conversation database was damaged ({problem}). It was moved to {moved}; {kept}."
        store.purge_deleted()
        store.mark_interrupted()
        return store, notice

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} was written by a newer Hearth (schema {version} > {SCHEMA_VERSION})")
        for step in range(version, SCHEMA_VERSION):
            with self._transaction():
                MIGRATIONS[step](self.db)
                self.db.execute(f"PRAGMA user_version = {step + 1}")

    def _transaction(self):
        return _Transaction(self.db)

    def close(self) -> None:
        self.db.close()

    # -- conversations -------------------------------------------------------------------------------
    def create_conversation(self, title: str = "New chat", model_path: str | None = None,
                            settings: ChatSettings | None = None) -> Conversation:
        now = self.clock()
        settings_json = json.dumps((settings or ChatSettings()).to_dict())
        with self._transaction():
            cur = self.db.execute(
                "INSERT INTO conversations (title, created_at, updated_at, model_path, settings) VALUES (?,?,?,?,?)",
                (title, now, now, model_path, settings_json))
        return self.conversation(cur.lastrowid)

    def import_conversation(self, title: str, model_path: str | None, settings: ChatSettings,
                            messages: list[tuple], created_at: float,
                            updated_at: float) -> Conversation:
        """Add a whole conversation in one transaction: messages as role, content, state, stats, created_at and
        optionally thinking and an answer's alternatives (content, state, stats, created_at, thinking; oldest first,
        kept hidden before the answer, which is shown)."""
        messages = [(*m[:5], m[5] if len(m) > 5 else "", m[6] if len(m) > 6 else ()) for m in messages]
        for _, _, state, _, _, _, alternatives in messages:
            _check_state(state)
            for alternative in alternatives:
                _check_state(alternative[1])
        with self._transaction():
            cur = self.db.execute(
                "INSERT INTO conversations (title, created_at, updated_at, model_path, settings) VALUES (?,?,?,?,?)",
                (title, created_at, updated_at, model_path, json.dumps(settings.to_dict())))
            conversation_id, seq, question = cur.lastrowid, 0, None
            for role, content, state, stats, at, thinking, alternatives in messages:
                reply_to = question if role == "assistant" else None
                rows = [(*alternative, 0) for alternative in alternatives] if reply_to is not None else []
                for row_content, row_state, row_stats, row_at, row_thinking, active in \
                        [*rows, (content, state, stats, at, thinking, 1)]:
                    row = self.db.execute(
                        "INSERT INTO messages (conversation_id, seq, role, content, state, stats, created_at,"
                        " updated_at, thinking, reply_to, active) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (conversation_id, seq, role, row_content, row_state, json.dumps(row_stats), row_at, row_at,
                         row_thinking, reply_to, active))
                    seq += 1
                if role == "user":
                    question = row.lastrowid
        return self.conversation(conversation_id)

    def conversation(self, conversation_id: int) -> Conversation:
        row = self.db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return _conversation(row)

    def conversations(self, query: str = "") -> list[Conversation]:
        """Conversations not deleted, most recently active first; ``query`` matches titles and message text."""
        sql = "SELECT * FROM conversations c WHERE deleted_at IS NULL"
        args: tuple = ()
        if query.strip():
            pattern = "%" + query.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += (" AND (c.title LIKE ?1 ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
                    " WHERE m.conversation_id = c.id AND m.content LIKE ?1 ESCAPE '\\'))")
            args = (pattern,)
        rows = self.db.execute(sql + " ORDER BY updated_at DESC, id DESC", args).fetchall()
        return [_conversation(r) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        self._update_conversation(conversation_id, "title = ?", (title.strip() or "Untitled",), touch=False)

    def set_settings(self, conversation_id: int, settings: ChatSettings) -> None:
        self._update_conversation(conversation_id, "settings = ?", (json.dumps(settings.to_dict()),), touch=False)

    def set_model_path(self, conversation_id: int, model_path: str | None) -> None:
        self._update_conversation(conversation_id, "model_path = ?", (model_path,), touch=False)

    def delete_conversation(self, conversation_id: int) -> None:
        """Hide the conversation; ``undo_delete`` brings it back until the store is next opened."""
        self._update_conversation(conversation_id, "deleted_at = ?", (self.clock(),), touch=False)

    def undo_delete(self, conversation_id: int) -> None:
        self._update_conversation(conversation_id, "deleted_at = NULL", (), touch=False)

    def purge_deleted(self) -> int:
        """Remove deleted conversations for good; returns how many."""
        with self._transaction():
            return self.db.execute("DELETE FROM conversations WHERE deleted_at IS NOT NULL").rowcount

    def _update_conversation(self, conversation_id: int, assignment: str, args: tuple, touch: bool = True) -> None:
        with self._transaction():
            cur = self.db.execute(f"UPDATE conversations SET {assignment} WHERE id = ?", (*args, conversation_id))
            if cur.rowcount == 0:
                raise KeyError(conversation_id)
            if touch:
                self.db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (self.clock(), conversation_id))

    # -- messages ------------------------------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        """The conversation as shown: each turn with its shown answer (earlier alternatives left out)."""
        rows = self.db.execute(MESSAGE_SELECT + " WHERE m.conversation_id = ? AND m.active = 1 ORDER BY m.seq",
                               (conversation_id,)).fetchall()
        return [_message(r) for r in rows]

    def message(self, message_id: int) -> Message:
        row = self.db.execute(MESSAGE_SELECT + " WHERE m.id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(message_id)
        return _message(row)

    # -- alternatives: the answers of one turn ---------------------------------------------------------------
    def alternatives(self, message_id: int) -> list[Message]:
        """Every answer of ``message_id``'s turn, oldest first (just the message when it has none)."""
        message = self.message(message_id)
        if message.reply_to is None:
            return [message]
        rows = self.db.execute(MESSAGE_SELECT + " WHERE m.conversation_id = ? AND m.reply_to = ? ORDER BY m.id",
                               (message.conversation_id, message.reply_to)).fetchall()
        return [_message(r) for r in rows]

    def keep_answers_as_alternatives(self, conversation_id: int, user_message_id: int) -> int:
        """Before answering ``user_message_id`` again: its shown answers (with text) become hidden alternatives of
        its turn; returns how many. Answers without text (failed, stopped at once) are not kept."""
        user = self.message(user_message_id)
        with self._transaction():
            return self.db.execute(
                "UPDATE messages SET active = 0, reply_to = ? WHERE conversation_id = ? AND seq > ? AND active = 1"
                " AND role = 'assistant' AND state != 'error' AND (content != '' OR thinking != '')",
                (user.id, conversation_id, user.seq)).rowcount

    def show_alternative(self, message_id: int) -> None:
        """Show ``message_id`` in its turn instead of the answer shown now."""
        message = self.message(message_id)
        if message.reply_to is None:
            return
        with self._transaction():
            self.db.execute("UPDATE messages SET active = (id = ?) WHERE conversation_id = ? AND reply_to = ?",
                            (message.id, message.conversation_id, message.reply_to))

    def recent_replies(self, limit: int = 50) -> list[tuple[Message, str]]:
        """The latest answers that carry stats, across conversations not deleted, newest first, each with its
        conversation's title."""
        rows = self.db.execute(
            "SELECT m.*, c.title AS conversation_title FROM messages m JOIN conversations c ON c.id = m.conversation_id"
            " WHERE m.role = 'assistant' AND m.stats != '{}' AND c.deleted_at IS NULL ORDER BY m.id DESC LIMIT ?",
            (limit,)).fetchall()
        return [(_message(r), r["conversation_title"]) for r in rows]

    def add_message(self, conversation_id: int, role: str, content: str, state: str = "complete",
                    stats: dict | None = None, thinking: str = "", reply_to: int | None = None) -> Message:
        """Append a message in its own transaction; it is on disk when this returns. ``reply_to``: for an answer,
        the user message it answers (the key of its turn's alternatives)."""
        _check_state(state)
        now = self.clock()
        with self._transaction():
            seq = self.db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE conversation_id = ?",
                                  (conversation_id,)).fetchone()[0]
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, seq, role, content, state, stats, created_at, updated_at,"
                " thinking, reply_to) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (conversation_id, seq, role, content, state, json.dumps(stats or {}), now, now, thinking, reply_to))
            self.db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        return self.message(cur.lastrowid)

    def update_message(self, message_id: int, content: str | None = None, state: str | None = None,
                       stats: dict | None = None, thinking: str | None = None) -> None:
        """Change a message's text, state, stats or thinking in one transaction."""
        sets, args = ["updated_at = ?"], [self.clock()]
        if content is not None:
            sets.append("content = ?")
            args.append(content)
        if thinking is not None:
            sets.append("thinking = ?")
            args.append(thinking)
        if state is not None:
            _check_state(state)
            sets.append("state = ?")
            args.append(state)
        if stats is not None:
            sets.append("stats = ?")
            args.append(json.dumps(stats))
        with self._transaction():
            cur = self.db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*args, message_id))
            if cur.rowcount == 0:
                raise KeyError(message_id)

    def delete_message(self, message_id: int) -> None:
        """Delete a message; when it was its turn's shown answer, the newest other alternative is shown instead."""
        row = self.db.execute("SELECT conversation_id, reply_to, active FROM messages WHERE id = ?",
                              (message_id,)).fetchone()
        with self._transaction():
            self.db.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            if row is not None and row["active"] and row["reply_to"] is not None:
                self.db.execute("UPDATE messages SET active = 1 WHERE id = (SELECT MAX(id) FROM messages"
                                " WHERE conversation_id = ? AND reply_to = ?)", (row["conversation_id"], row["reply_to"]))

    def delete_messages_after(self, conversation_id: int, seq: int, shown_only: bool = False) -> int:
        """Delete every message after position ``seq`` (to regenerate or resend from there); returns how many.
        ``shown_only`` keeps the hidden alternatives."""
        with self._transaction():
            return self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND seq > ?"
                                   + (" AND active = 1" if shown_only else ""), (conversation_id, seq)).rowcount

    def mark_interrupted(self) -> int:
        """Mark replies left 'streaming' by a previous run that ended abruptly; returns how many."""
        with self._transaction():
            return self.db.execute("UPDATE messages SET state = 'interrupted' WHERE state = 'streaming'").rowcount

    def begin_reply(self, conversation_id: int, interval: float = 0.5,
                    clock: Callable[[], float] = time.monotonic,
                    splitter: ReasoningSplitter | None = None, reply_to: int | None = None) -> ReplyWriter:
        """Start an assistant reply (to the user message ``reply_to``) that will stream in; see ``ReplyWriter``."""
        message = self.add_message(conversation_id, "assistant", "", state="streaming", reply_to=reply_to)
        return ReplyWriter(self, message.id, interval, clock, splitter)

    # -- app settings --------------------------------------------------------------------------------
    def setting(self, key: str, default=None):
        row = self.db.execute("SELECT value FROM app_settings WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_setting(self, key: str, value) -> None:
        with self._transaction():
            self.db.execute("INSERT INTO app_settings (key, value) VALUES (?, ?)"
                            " ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, json.dumps(value)))

    def default_settings(self) -> ChatSettings:
        """The settings a new conversation starts from (the "Default settings" page); ChatSettings() until edited."""
        stored = self.setting(DEFAULT_SETTINGS_KEY)
        return ChatSettings.from_dict(stored) if isinstance(stored, dict) else ChatSettings()

    def set_default_settings(self, settings: ChatSettings) -> None:
        self.set_setting(DEFAULT_SETTINGS_KEY, settings.clamped().to_dict())


class ReplyWriter:
    """Saves a streaming reply so that no streamed text is older than ``interval`` seconds unsaved.

    ``append`` writes when ``interval`` has passed since the last write; between pieces, a timer calls
    ``flush_due`` (ChatController: every FLUSH_TICK_S) so text that no later piece follows is saved in time too.
    The streamed text goes through a ``ReasoningSplitter``: ``text`` is the answer and ``thinking`` the model's
    reasoning, saved apart (a splitter without a syntax, the default, makes everything answer).
    """

    def __init__(self, store: ConversationStore, message_id: int, interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic, splitter: ReasoningSplitter | None = None):
        self.store = store
        self.message_id = message_id
        self.interval = interval
        self.clock = clock
        self.splitter = splitter or ReasoningSplitter(None)
        self.text = ""
        self.thinking = ""
        self.in_thinking = False  # the reply is inside its thinking now
        self._saved = ("", "")
        self._saved_at = clock()
        self._unsaved_since: float | None = None  # when the oldest text not yet on disk arrived

    def append(self, piece: str) -> bool:
        """Add streamed text; write it out when ``interval`` has passed since the last write. True if written."""
        self.splitter.feed(piece)
        self._take_split()
        if (self.text, self.thinking) == self._saved:
            return False
        if self._unsaved_since is None:
            self._unsaved_since = self.clock()
        if self.clock() - self._saved_at < self.interval:
            return False
        self.save()
        return True

    def flush_due(self, max_age: float) -> bool:
        """Write the text if its oldest unsaved part arrived ``max_age`` seconds ago or more. True if written."""
        if self._unsaved_since is None or self.clock() - self._unsaved_since < max_age:
            return False
        self.save()
        return True

    def save(self) -> None:
        self.store.update_message(self.message_id, content=self.text, thinking=self.thinking)
        self._saved, self._saved_at, self._unsaved_since = (self.text, self.thinking), self.clock(), None

    def finish(self, state: str = "complete", stats: dict | None = None) -> None:
        """Write the whole text with its final state in one transaction."""
        self.splitter.finish()
        self._take_split()
        self.store.update_message(self.message_id, content=self.text, state=state, stats=stats or {},
                                  thinking=self.thinking)
        self._saved, self._unsaved_since = (self.text, self.thinking), None

    def _take_split(self) -> None:
        split = self.splitter.split()
        self.text, self.thinking, self.in_thinking = split.answer, split.thinking, split.in_thinking


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (or ``ROLLBACK`` on an exception) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        return False


def _check_state(state: str) -> None:
    if state not in MESSAGE_STATES:
        raise ValueError(f"unknown message state {state!r}")


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(row["id"], row["title"], row["created_at"], row["updated_at"], row["model_path"],
                        ChatSettings.from_dict(json.loads(row["settings"] or "{}")))


MESSAGE_SELECT = (  # a message with its place among its turn's answers
    "SELECT m.*, (SELECT COUNT(*) FROM messages a WHERE a.conversation_id = m.conversation_id"
    " AND a.reply_to = m.reply_to) AS n_alternatives, (SELECT COUNT(*) FROM messages a"
    " WHERE a.conversation_id = m.conversation_id AND a.reply_to = m.reply_to AND a.id < m.id) AS alternative"
    " FROM messages m")


def _message(row: sqlite3.Row) -> Message:
    return Message(row["id"], row["conversation_id"], row["seq"], row["role"], row["content"], row["state"],
                   json.loads(row["stats"] or "{}"), row["created_at"], row["thinking"], row["reply_to"],
                   *((row["alternative"], max(1, row["n_alternatives"])) if "alternative" in row.keys() else ()))
