"""Salvage from a damaged conversation database: every row SQLite can still read is copied into the fresh one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

TABLES = ("conversations", "messages", "app_settings")  # parents first: messages refer to conversations


def salvage(damaged: Path, fresh: sqlite3.Connection) -> dict[str, int]:
    """Copy the readable rows of ``damaged`` into ``fresh`` (same tables, current schema).

    A table that scans cleanly is copied whole; otherwise row by row by rowid, skipping rows on damaged pages.
    Messages whose conversation was lost go into a conversation titled "Recovered conversation <id>".

    Returns:
        Rows copied per table (absent when the file could not be opened at all).
    """
    try:
        old = sqlite3.connect(f"file:{damaged}?mode=ro", uri=True)
        old.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError:
        return {}
    copied = {}
    try:
        for table in TABLES:
            columns = _shared_columns(old, fresh, table)
            if columns:
                copied[table] = _copy(old, fresh, table, columns)
    finally:
        old.close()
    return copied


def _shared_columns(old: sqlite3.Connection, fresh: sqlite3.Connection, table: str) -> list[str]:
    try:
        theirs = {row[1] for row in old.execute(f"PRAGMA table_info({table})")}
    except sqlite3.DatabaseError:
        return []
    return [row[1] for row in fresh.execute(f"PRAGMA table_info({table})") if row[1] in theirs]


def _readable_rows(old: sqlite3.Connection, table: str, columns: list[str]):
    names = ", ".join(columns)
    try:
        yield from old.execute(f"SELECT {names} FROM {table}").fetchall()
        return
    except sqlite3.DatabaseError:
        pass
    try:
        last = old.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
    except sqlite3.DatabaseError:
        try:
            last = old.execute("SELECT max(seq) FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()[0] or 0
        except sqlite3.DatabaseError:
            return  # neither the table's end nor its counter is readable
    for rowid in range(1, last + 1):
        try:
            row = old.execute(f"SELECT {names} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is not None:
            yield row


def _copy(old: sqlite3.Connection, fresh: sqlite3.Connection, table: str, columns: list[str]) -> int:
    marks, n = ", ".join("?" * len(columns)), 0
    fresh.execute("BEGIN")
    try:
        for row in _readable_rows(old, table, columns):
            if table == "messages":
                _ensure_conversation(fresh, row[columns.index("conversation_id")], row[columns.index("created_at")])
            try:
                fresh.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", tuple(row))
                n += 1
            except sqlite3.DatabaseError:
                continue  # a row whose values the damage mangled (a broken constraint): left out
        fresh.execute("COMMIT")
    except BaseException:
        fresh.execute("ROLLBACK")
        raise
    return n


def _ensure_conversation(fresh: sqlite3.Connection, conversation_id, created_at) -> None:
    if fresh.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
        fresh.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
                      (conversation_id, f"Recovered conversation {conversation_id}", created_at, created_at))
