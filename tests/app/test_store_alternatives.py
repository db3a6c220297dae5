"""Regenerated answers are kept as alternatives of their turn: stored, flipped between, migrated, exported."""

import json
import sqlite3

import pytest

from app import conversation_export
from app.store import MIGRATIONS, ConversationStore


@pytest.fixture
def store(tmp_path):
    s, _ = ConversationStore.open(tmp_path / "c.db")
    yield s
    s.close()


def _answer(store, conversation_id, reply_to, text):
    writer = store.begin_reply(conversation_id, reply_to=reply_to)
    writer.append(text)
    writer.finish("complete", {"generated_tokens": 1})
    return writer.message_id


def _regenerate(store, conversation_id, user, text):
    store.keep_answers_as_alternatives(conversation_id, user.id)
    return _answer(store, conversation_id, user.id, text)


def test_regenerating_keeps_the_earlier_answers_and_shows_the_newest(store):
    conv = store.create_conversation()
    user = store.add_message(conv.id, "user", "a question")
    first = _answer(store, conv.id, user.id, "first answer")
    second = _regenerate(store, conv.id, user, "second answer")
    third = _regenerate(store, conv.id, user, "third answer")
    shown = store.messages(conv.id)
    assert [(m.role, m.content) for m in shown] == [("user", "a question"), ("assistant", "third answer")]
    assert (shown[1].alternative, shown[1].alternatives) == (2, 3)
    assert [m.id for m in store.alternatives(third)] == [first, second, third]
    store.show_alternative(first)
    shown = store.messages(conv.id)
    assert [m.content for m in shown] == ["a question", "first answer"]
    assert (shown[1].alternative, shown[1].alternatives) == (0, 3)
    later = store.add_message(conv.id, "user", "a follow-up")
    assert [m.id for m in store.messages(conv.id)] == [user.id, first, later.id]  # the turn keeps its place


def test_deleting_the_shown_alternative_shows_another(store):
    conv = store.create_conversation()
    user = store.add_message(conv.id, "user", "q")
    first = _answer(store, conv.id, user.id, "one")
    second = _regenerate(store, conv.id, user, "two")
    store.delete_message(second)
    shown = store.messages(conv.id)
    assert [m.id for m in shown] == [user.id, first] and shown[1].alternatives == 1


def test_an_answer_without_alternatives_counts_one(store):
    conv = store.create_conversation()
    store.add_message(conv.id, "user", "q")
    answer = store.add_message(conv.id, "assistant", "a")
    assert (store.messages(conv.id)[1].alternative, store.messages(conv.id)[1].alternatives) == (0, 1)
    assert [m.id for m in store.alternatives(answer.id)] == [answer.id]


def test_a_version_3_database_migrates_and_its_answers_can_be_regenerated(tmp_path):
    path = tmp_path / "v3.db"
    db = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:3]:
        migration(db)
    db.execute("PRAGMA user_version = 3")
    db.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, seq, role, content, created_at, updated_at)"
               " VALUES (1, 0, 'user', 'old question', 1, 1), (1, 1, 'assistant', 'old answer', 1, 1)")
    db.close()
    store = ConversationStore(path)
    try:
        user, old = store.messages(1)
        assert (old.content, old.alternatives) == ("old answer", 1)
        new = _regenerate(store, 1, user, "new answer")
        assert [m.content for m in store.alternatives(new)] == ["old answer", "new answer"]
    finally:
        store.close()


def test_alternatives_are_exported_and_imported_again(store, tmp_path):
    conv = store.create_conversation()
    user = store.add_message(conv.id, "user", "q")
    _answer(store, conv.id, user.id, "one")
    _regenerate(store, conv.id, user, "two")
    document = conversation_export.conversation_document(store, conv.id)
    answer = document["messages"][1]
    assert answer["content"] == "two"
    assert [a["content"] for a in answer["alternatives"]] == ["one"]
    assert "one" in conversation_export.to_markdown(document) and "Other answer" in \
        conversation_export.to_markdown(document)
    imported = conversation_export.parse_document(json.dumps(document).encode())
    copy = conversation_export.add_to_store(store, imported)
    shown = store.messages(copy.id)
    assert [m.content for m in shown] == ["q", "two"] and shown[1].alternatives == 2
    assert [m.content for m in store.alternatives(shown[1].id)] == ["one", "two"]


def test_alternatives_are_refused_where_they_cannot_be(store):
    conv = store.create_conversation()
    user = store.add_message(conv.id, "user", "q")
    _answer(store, conv.id, user.id, "one")
    _regenerate(store, conv.id, user, "two")
    document = conversation_export.conversation_document(store, conv.id)
    old = {**document, "version": 2}
    with pytest.raises(conversation_export.ConversationFormatError, match="alternatives"):
        conversation_export.parse_document(json.dumps(old).encode())
    on_question = json.loads(json.dumps(document))
    on_question["messages"][0]["alternatives"] = [{"content": "x", "created_at": document["created_at"]}]
    with pytest.raises(conversation_export.ConversationFormatError, match="only an answer"):
        conversation_export.parse_document(json.dumps(on_question).encode())
    nested = json.loads(json.dumps(document))
    nested["messages"][1]["alternatives"][0]["alternatives"] = []
    with pytest.raises(conversation_export.ConversationFormatError, match=r"alternatives\[0\]"):
        conversation_export.parse_document(json.dumps(nested).encode())
