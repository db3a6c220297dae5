"""The conversation store: schema migrations, durable messages, periodic reply saves, integrity recovery."""

import sqlite3

import pytest

from app.chat_settings import ChatSettings
from app.store import SCHEMA_VERSION, ConversationStore, check_integrity


class FakeClock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def store(tmp_path):
    s, notice = ConversationStore.open(tmp_path / "c.db")
    assert notice is None
    yield s
    s.close()


def test_new_database_is_at_the_current_schema_in_wal_mode(store):
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_migrates_a_version_1_database_keeping_its_data(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created_at REAL NOT NULL,
            updated_at REAL NOT NULL, model_path TEXT, settings TEXT NOT NULL DEFAULT '{}');
        CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL REFERENCES conversations(id)
            ON DELETE CASCADE, seq INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'complete', stats TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL,
            updated_at REAL NOT NULL);
        CREATE INDEX messages_by_conversation ON messages(conversation_id, seq);
        INSERT INTO conversations VALUES (1, 'Old chat', 1, 1, NULL, '{"temperature": 0.2, "bogus": 1}');
        INSERT INTO messages VALUES (1, 1, 0, 'user', 'hi there', 'complete', '{}', 1, 1);
        PRAGMA user_version = 1;
    """)
    db.close()
    store, notice = ConversationStore.open(path)
    assert notice is None
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    (conv,) = store.conversations()
    assert conv.title == "Old chat" and conv.settings.temperature == 0.2
    assert [m.content for m in store.messages(conv.id)] == ["hi there"]
    store.set_setting("last", conv.id)  # the table added by version 2
    assert store.setting("last") == conv.id
    store.close()


def test_refuses_a_database_from_a_newer_version(tmp_path):
    path = tmp_path / "new.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(RuntimeError, match="newer"):
        ConversationStore(path)


def test_messages_are_committed_one_by_one_and_visible_to_another_connection(store):
    conv = store.create_conversation("t")
    store.add_message(conv.id, "user", "one")
    other = sqlite3.connect(store.path)
    assert other.execute("SELECT content FROM messages").fetchall() == [("one",)]
    store.add_message(conv.id, "assistant", "two", stats={"generated_tokens": 3})
    assert other.execute("SELECT content FROM messages ORDER BY seq").fetchall() == [("one",), ("two",)]
    other.close()
    assert store.messages(conv.id)[1].stats == {"generated_tokens": 3}


def test_streaming_reply_is_saved_at_most_interval_apart(store):
    conv = store.create_conversation("t")
    clock = FakeClock()
    writer = store.begin_reply(conv.id, interval=0.5, clock=clock)
    saved = lambda: store.message(writer.message_id).content  # noqa: E731
    assert writer.append("Hel") is False and saved() == ""
    clock.t += 0.3
    assert writer.append("lo") is False and saved() == ""
    clock.t += 0.3
    assert writer.append(",") is True and saved() == "Hello,"
    clock.t += 0.1
    writer.append(" world")
    assert saved() == "Hello," and store.message(writer.message_id).state == "streaming"
    writer.finish("complete", {"generated_tokens": 4})
    done = store.message(writer.message_id)
    assert (done.content, done.state, done.stats) == ("Hello, world", "complete", {"generated_tokens": 4})


def test_text_with_no_later_piece_is_saved_once_it_is_old_enough(store):
    conv = store.create_conversation("t")
    clock = FakeClock()
    writer = store.begin_reply(conv.id, interval=0.5, clock=clock)
    saved = lambda: store.message(writer.message_id).content  # noqa: E731
    assert writer.flush_due(0.35) is False  # nothing to save
    clock.t += 0.2
    writer.append("Hel")
    clock.t += 0.3
    assert writer.flush_due(0.35) is False and saved() == ""  # 0.3 s old
    clock.t += 0.06
    assert writer.flush_due(0.35) is True and saved() == "Hel"  # no later piece was needed
    assert writer.flush_due(0.35) is False  # nothing new since
    clock.t += 0.1
    writer.append("lo")
    clock.t += 0.34
    assert writer.flush_due(0.35) is False and saved() == "Hel"
    clock.t += 0.02
    assert writer.flush_due(0.35) is True and saved() == "Hello"


def test_a_reply_left_streaming_is_marked_interrupted_on_the_next_open(tmp_path):
    store, _ = ConversationStore.open(tmp_path / "c.db")
    conv = store.create_conversation("t")
    writer = store.begin_reply(conv.id, interval=0.0)
    writer.append("partial answer")
    store.close()  # no finish(): the app died
    store, _ = ConversationStore.open(tmp_path / "c.db")
    (msg,) = store.messages(conv.id)
    assert (msg.content, msg.state) == ("partial answer", "interrupted")
    store.close()


def test_search_matches_titles_and_content_and_escapes_wildcards(store):
    a = store.create_conversation("Rust lifetimes")
    b = store.create_conversation("Dinner")
    store.add_message(b.id, "user", "A recipe with 100% butter")
    store.create_conversation("other")
    assert [c.id for c in store.conversations("rust")] == [a.id]
    assert [c.id for c in store.conversations("RECIPE")] == [b.id]
    assert [c.id for c in store.conversations("100%")] == [b.id]
    assert store.conversations("1_0") == []
    assert len(store.conversations("")) == 3


def test_delete_can_be_undone_until_the_store_is_reopened(tmp_path):
    store, _ = ConversationStore.open(tmp_path / "c.db")
    keep, gone = store.create_conversation("keep"), store.create_conversation("gone")
    store.add_message(gone.id, "user", "bye")
    store.delete_conversation(gone.id)
    assert [c.id for c in store.conversations()] == [keep.id]
    store.undo_delete(gone.id)
    assert {c.id for c in store.conversations()} == {keep.id, gone.id}
    store.delete_conversation(gone.id)
    store.close()
    store, _ = ConversationStore.open(tmp_path / "c.db")
    with pytest.raises(KeyError):
        store.conversation(gone.id)
    assert store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0  # cascaded
    store.close()


def test_rename_settings_model_and_truncation(store):
    conv = store.create_conversation("a", model_path="/m.gguf")
    store.rename(conv.id, "  ")
    store.set_settings(conv.id, ChatSettings(temperature=0.1, n_ctx=2048))
    store.set_model_path(conv.id, "/other.gguf")
    got = store.conversation(conv.id)
    assert (got.title, got.settings.temperature, got.settings.n_ctx, got.model_path) == \
        ("Untitled", 0.1, 2048, "/other.gguf")
    for i in range(4):
        store.add_message(conv.id, "user" if i % 2 == 0 else "assistant", str(i))
    second = store.messages(conv.id)[1]
    assert store.delete_messages_after(conv.id, second.seq) == 2
    store.delete_message(store.messages(conv.id)[0].id)
    assert [m.content for m in store.messages(conv.id)] == ["1"]
    with pytest.raises(KeyError):
        store.rename(9999, "x")


def test_a_damaged_database_is_moved_aside_and_what_is_readable_kept(tmp_path):
    path = tmp_path / "c.db"
    store, _ = ConversationStore.open(path)
    conv = store.create_conversation("precious")
    originals = [f"message {i} " * 20 for i in range(300)]
    for text in originals:
        store.add_message(conv.id, "user", text)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    data = bytearray(path.read_bytes())
    page = 4096
    data[-3 * page:-2 * page] = b"\x37" * page  # scribble over a b-tree page of messages
    path.write_bytes(bytes(data))
    assert check_integrity(path) is not None

    store, notice = ConversationStore.open(path)
    moved = list(tmp_path.glob("c.damaged-*.db"))
    assert len(moved) == 1 and str(moved[0]) in notice and "damaged" in notice
    kept = store.messages(conv.id)
    assert [c.title for c in store.conversations()] == ["precious"]
    assert 250 <= len(kept) < 300  # one page of ~1 KB messages lost, the rest kept
    assert all(m.content == originals[m.seq] for m in kept)  # what is kept is what was written
    assert f"{len(kept):,} messages" in notice
    assert check_integrity(path) is None
    store.close()


def test_a_file_that_is_not_a_database_is_recovered_too(tmp_path):
    path = tmp_path / "c.db"
    path.write_bytes(b"this is not sqlite" * 100)
    store, notice = ConversationStore.open(path)
    assert notice and "damaged" in notice
    assert store.create_conversation("fresh").title == "fresh"
    store.close()


def test_settings_from_bad_json_values_fall_back_to_defaults():
    s = ChatSettings.from_dict({"temperature": "hot", "top_k": "12", "max_tokens": -5, "extra": 1})
    assert s.temperature == ChatSettings().temperature and s.top_k == 12 and s.max_tokens == 1
    assert ChatSettings(seed=-1).sampling_kwargs()["seed"] is None
    assert ChatSettings(seed=7).sampling_kwargs()["seed"] == 7


def test_the_default_settings_for_new_chats_are_kept_across_opens(tmp_path):
    store, _ = ConversationStore.open(tmp_path / "c.db")
    assert store.default_settings() == ChatSettings()
    store.set_default_settings(ChatSettings(system_prompt="Be terse.", temperature=9.0))  # stored clamped
    store.close()
    store, _ = ConversationStore.open(tmp_path / "c.db")
    assert (store.default_settings().system_prompt, store.default_settings().temperature) == ("Be terse.", 2.0)
    store.set_setting("default_chat_settings", ["not", "a", "dict"])  # damaged: Hearth's own defaults
    assert store.default_settings() == ChatSettings()
    store.close()
