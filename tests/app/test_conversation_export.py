"""Conversation export and import: JSON and archive round trips, Markdown, strict validation, crash safety."""

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from PySide6.QtCore import QCoreApplication

from app import conversation_export as ce
from app.builtin_model import BUILTIN_MODEL_NAME
from app.chat_settings import ChatSettings
from app.store import ConversationStore

SHA = "ab" * 32
MODEL = ce.ModelIdentity("SmolLM2 135M Instruct", SHA, "SmolLM2.gguf")
REPO_ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, t=1_700_000_000.25):
        self.t = t

    def __call__(self):
        self.t += 1.5
        return self.t


@pytest.fixture
def store(tmp_path):
    s = ConversationStore(tmp_path / "c.db", clock=Clock())
    yield s
    s.close()


def add_chat(store, title="Tea", settings=None):
    conv = store.create_conversation(title, None, settings or ChatSettings(system_prompt="Be brief.", temperature=0.3,
                                                                             top_k=12, seed=7, n_ctx=2048))
    store.add_message(conv.id, "user", "What is **tea**?\n\n```py\nprint('hi')\n```")
    store.add_message(conv.id, "assistant", "A drink — from *Camellia sinensis*. 🍵", stats={"generated_tokens": 9,
                      "cached_tokens": 4, "thinking_tokens": 5}, thinking="The user asks about tea.\n\nKeep it short.")
    store.add_message(conv.id, "user", "More?")
    store.add_message(conv.id, "assistant", "Half an ans", state="stopped")
    return store.conversation(conv.id)


def snapshot(store, conversation_id):
    conv = store.conversation(conversation_id)
    messages = [(m.role, m.content, m.state, m.stats, round(m.created_at, 3), m.thinking)
                for m in store.messages(conversation_id)]
    return conv.title, round(conv.created_at, 3), round(conv.updated_at, 3), conv.settings, messages


def test_json_round_trip_keeps_everything(store, tmp_path):
    conv = add_chat(store)
    path = tmp_path / "tea.json"
    ce.export_json(store, conv.id, path, MODEL)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["format"] == "hearth-conversation" and doc["version"] == 3
    assert doc["messages"][1]["thinking"] == "The user asks about tea.\n\nKeep it short."
    assert "thinking" not in doc["messages"][0] and doc["settings"]["enable_thinking"] is True
    assert doc["model"] == {"name": "SmolLM2 135M Instruct", "sha256": SHA, "file": "SmolLM2.gguf"}
    assert doc["system_prompt"] == "Be brief." and doc["settings"]["top_k"] == 12 and "system_prompt" not in doc["settings"]
    assert doc["messages"][0]["created_at"].endswith("Z")
    imported = ce.read_json_file(path)
    assert imported.model == MODEL
    new = ce.add_to_store(store, imported)
    assert new.id != conv.id
    assert snapshot(store, new.id) == snapshot(store, conv.id)


def test_a_reply_still_streaming_is_exported_as_interrupted(store, tmp_path):
    conv = add_chat(store)
    writer = store.begin_reply(conv.id)
    writer.append("partial")
    writer.save()
    doc = ce.conversation_document(store, conv.id)
    assert doc["messages"][-1] == {**doc["messages"][-1], "state": "interrupted", "content": "partial"}
    assert ce.parse_document(ce.to_json_bytes(doc)).messages[-1].state == "interrupted"


def test_markdown_holds_title_model_settings_and_every_message(store, tmp_path):
    conv = add_chat(store)
    path = tmp_path / "tea.md"
    ce.export_markdown(store, conv.id, path, MODEL)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Tea\n")
    assert f"- Model: SmolLM2 135M Instruct (sha256 {SHA})" in text
    assert "temperature 0.3" in text and "top k 12" in text
    assert "## System prompt\n\n> Be brief." in text
    headings = [line for line in text.splitlines() if line.startswith("## ") and line != "## System prompt"]
    assert [h.split(" — ")[0] for h in headings] == ["## User", "## Assistant", "## User", "## Assistant"]
    assert headings[-1].endswith("(stopped)")
    for m in store.messages(conv.id):
        assert m.content in text  # code fences and emoji are kept verbatim
    thought = "> **Thinking** (5 tokens)\n>\n> The user asks about tea.\n>\n> Keep it short.\n\nA drink"
    assert thought in text  # the reasoning apart, marked, before its answer
    assert text.count("**Thinking**") == 1 and "enable thinking on" in text


def test_a_version_1_document_imports_without_thinking(store):
    doc = ce.conversation_document(store, add_chat(store).id, MODEL)
    doc["version"] = 1
    del doc["settings"]["enable_thinking"]
    del doc["messages"][1]["thinking"]
    imported = ce.parse_document(json.dumps(doc).encode())
    assert imported.settings.enable_thinking is True and all(m.thinking == "" for m in imported.messages)
    doc["messages"][1]["thinking"] = "a thought"
    with pytest.raises(ce.ConversationFormatError, match=r"messages\[1\]: unknown field 'thinking'"):
        ce.parse_document(json.dumps(doc).encode())


def test_archive_round_trip_of_every_conversation(store, tmp_path):
    first = add_chat(store, "First")
    second = add_chat(store, "Second", ChatSettings(temperature=1.5))
    empty = store.create_conversation("Empty")
    path = tmp_path / "all.zip"
    progress = []
    assert ce.export_archive(store, path, lambda conv: MODEL if conv.id == first.id else None,
                             on_progress=lambda done, total: progress.append((done, total))) == 3
    assert progress == [(1, 3), (2, 3), (3, 3)]
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        assert sorted(z.namelist()) == sorted(["manifest.json"] + [e["file"] for e in manifest["conversations"]])
    assert [e["title"] for e in manifest["conversations"]] == ["Empty", "Second", "First"]
    other, _ = ConversationStore.open(tmp_path / "other.db")
    imported = ce.read_archive(path)
    new_ids = [ce.add_to_store(other, conv).id for conv in imported]
    assert [snapshot(other, i) for i in new_ids] == [snapshot(store, c.id) for c in (empty, second, first)]
    assert [c.model for c in imported] == [None, None, MODEL]
    other.close()


def valid_doc(store):
    return ce.conversation_document(store, add_chat(store).id, MODEL)


def with_change(doc, change):
    doc = json.loads(json.dumps(doc))
    change(doc)
    return json.dumps(doc).encode()


BAD_DOCUMENTS = [
    (lambda d: d.update(format="chatgpt-export"), "format is 'chatgpt-export'"),
    (lambda d: d.update(version=4), "written by a newer Hearth (format version 4"),
    (lambda d: d["messages"][1].update(thinking=["a"]), "messages[1].thinking: expected text, not list"),
    (lambda d: d["settings"].update(enable_thinking="no"), "settings.enable_thinking: expected a bool, not 'no'"),
    (lambda d: d["settings"].update(enable_thinking=1), "settings.enable_thinking: expected a bool, not 1"),
    (lambda d: d.update(version="1"), "version must be a positive integer"),
    (lambda d: d.update(extra=1), "unknown field 'extra'"),
    (lambda d: d.pop("messages"), "missing messages"),
    (lambda d: d.update(messages={}), "messages: expected a list, not dict"),
    (lambda d: d["messages"][1].update(role="system"), "messages[1].role: expected 'user' or 'assistant'"),
    (lambda d: d["messages"][0].update(content=5), "messages[0].content: expected text, not int"),
    (lambda d: d["messages"][0].update(state="streaming"), "messages[0].state: expected one of"),
    (lambda d: d["messages"][0].update(created_at="2025-01-01 10:00"), "messages[0].created_at: '2025-01-01 10:00' is not an ISO 8601 time with a time zone"),
    (lambda d: d["messages"][0].update(stats={"nested": {"a": 1}}), "messages[0].stats: expected at most 64 plain values"),
    (lambda d: d["settings"].update(temperature=9.0), "settings.temperature: 9.0 is out of range"),
    (lambda d: d["settings"].update(top_k=4.5), "settings.top_k: expected a int"),
    (lambda d: d["settings"].update(seed=True), "settings.seed: expected a int, not True"),
    (lambda d: d["settings"].pop("n_ctx"), "settings: missing n_ctx"),
    (lambda d: d["model"].update(sha256="XYZ"), "model.sha256: expected null or 64 lowercase hex digits"),
    (lambda d: d["model"].update(file="../../etc/passwd"), "model.file: expected null or a bare file name"),
    (lambda d: d.update(title="t" * 1001), "title: longer than 1,000 characters"),
]


@pytest.mark.parametrize("change, message", BAD_DOCUMENTS)
def test_malformed_documents_are_refused_with_a_clear_reason(store, change, message):
    data = with_change(valid_doc(store), change)
    with pytest.raises(ce.ConversationFormatError) as e:
        ce.parse_document(data)
    assert message in str(e.value)


@pytest.mark.parametrize("data, message", [
    (b"{not json", "not valid JSON: Expecting property name enclosed in double quotes at line 1, column 2"),
    (b'{"a": 1, "a": 2}', "the key 'a' appears twice"),
    (b'{"a": NaN}', "NaN is not a valid number"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b"[]", "the document: expected an object, not list"),
])
def test_files_that_are_not_conversations_are_refused(data, message):
    with pytest.raises(ce.ConversationFormatError) as e:
        ce.parse_document(data)
    assert message in str(e.value)


def test_an_oversized_file_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    monkeypatch.setattr(ce, "MAX_JSON_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 5000)
    with pytest.raises(ce.ConversationFormatError, match="larger than"):
        ce.read_json_file(path)


def write_zip(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def test_archives_with_tampered_or_unlisted_members_are_refused(store, tmp_path):
    add_chat(store)
    good = tmp_path / "good.zip"
    ce.export_archive(store, good)
    with zipfile.ZipFile(good) as z:
        members = {n: z.read(n) for n in z.namelist()}
    cases = {
        "tampered": ({**members, "conversations/00001.json": members["conversations/00001.json"].replace(b"Tea", b"Tex")},
                     "does not match its checksum"),
        "unlisted": ({**members, "evil.sh": b"rm -rf"}, "files its manifest does not list: ['evil.sh']"),
        "no manifest": ({k: v for k, v in members.items() if k != "manifest.json"}, "has no manifest.json"),
        "bad member": ({**members, "manifest.json": members["manifest.json"].replace(b"00001", b"../01")},
                       "is not a unique conversations/NNNNN.json name"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.zip"
        write_zip(path, content)
        with pytest.raises(ce.ConversationFormatError) as e:
            ce.read_archive(path)
        assert message in str(e.value), name
    path = tmp_path / "not.zip"
    path.write_bytes(b"PK but not really")
    with pytest.raises(ce.ConversationFormatError, match="not a zip archive"):
        ce.read_archive(path)


def test_a_member_whose_real_size_exceeds_the_limit_is_refused(store, tmp_path, monkeypatch):
    add_chat(store)
    path = tmp_path / "a.zip"
    ce.export_archive(store, path)
    monkeypatch.setattr(ce, "MAX_JSON_BYTES", 300)
    with pytest.raises(ce.ConversationFormatError, match="larger than 0 MB|unpacks to more than"):
        ce.read_archive(path)


CHILD = r"""
import sys, time
from pathlib import Path
from app import conversation_export as ce
from app.store import ConversationStore
store = ConversationStore(Path(sys.argv[1]))
def progress(done, total):
    if done == 2:
        Path(sys.argv[3]).write_text("writing")
        time.sleep(120)  # killed here, half-way through the archive
ce.export_archive(store, sys.argv[2], on_progress=progress)
"""


def test_a_kill_during_an_export_leaves_the_previous_file_intact(store, tmp_path):
    for i in range(4):
        conv = store.create_conversation(f"chat {i}")
        store.add_message(conv.id, "user", "x" * 200_000)
    target, marker = tmp_path / "all.zip", tmp_path / "marker"
    target.write_bytes(b"the previous export")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(store.path), str(target), str(marker)],
                             cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, "the exporting process ended early"
            assert time.monotonic() < deadline, "the export never reached its second conversation"
            time.sleep(0.05)
        temps = list(tmp_path.glob(".all.zip.*.tmp"))
        assert len(temps) == 1 and temps[0].stat().st_size > 0  # the new archive is being written beside it
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    assert target.read_bytes() == b"the previous export"


# -- in the app: the conversation menu -------------------------------------------------------------------
def fake_dialog(session, path):
    asked = []
    session.window.conversation_menu.ask_path = lambda title, suggested, kind: asked.append((title, suggested)) or str(path)
    return asked


def trigger(session, name):
    session.window.conversation_menu.actions_by_name[name].trigger()
    if name.startswith("export"):  # written on a thread of its own
        session.actions.wait_for_exports()
        QCoreApplication.processEvents()  # its notice


@pytest.mark.gui
def test_export_and_import_through_the_menu(qtbot, make_session, tmp_path):
    from .fake_engine import FakeFactory, FakeModel

    session = make_session(engine_factory=FakeFactory(FakeModel(["Green", " tea"])))
    c = session.controller
    with qtbot.waitSignal(c.reply_finished, timeout=20000):
        c.send("Name a tea")
    original = c.current_id
    asked = fake_dialog(session, tmp_path / "chat.json")
    trigger(session, "export_json")
    assert asked == [("Export conversation", "Name a tea.json")]
    doc = json.loads((tmp_path / "chat.json").read_text())
    assert [m["content"] for m in doc["messages"]] == ["Name a tea", "Green tea"]
    assert doc["model"] == {"name": BUILTIN_MODEL_NAME, "sha256": "f" * 64, "file": Path(c.builtin_path).name}
    trigger(session, "import_json")
    assert c.current_id != original and session.window.title.text() == "Name a tea"
    assert [m.content for m in c.store.messages(c.current_id)] == ["Name a tea", "Green tea"]
    assert session.window.notice_bar.label.text() == "Imported “Name a tea” (2 messages)."
    fake_dialog(session, tmp_path / "chat.md")
    trigger(session, "export_markdown")
    assert "## Assistant" in (tmp_path / "chat.md").read_text()
    fake_dialog(session, tmp_path / "all.zip")
    trigger(session, "export_all")
    before = len(c.store.conversations())
    trigger(session, "import_all")
    assert len(c.store.conversations()) == 2 * before
    assert session.window.notice_bar.label.text() == f"Imported {before} conversations from all.zip."


@pytest.mark.gui
def test_a_malformed_import_is_refused_with_the_reason(qtbot, make_session, tmp_path):
    from .fake_engine import FakeFactory

    session = make_session(engine_factory=FakeFactory())
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "hearth-conversation", "version": 1}')
    before = session.controller.store.conversations()
    fake_dialog(session, bad)
    trigger(session, "import_json")
    assert session.controller.store.conversations() == before
    bar = session.window.notice_bar
    assert bar.isVisible() and bar.kind == "error"
    assert bar.label.text() == ("Could not import bad.json: The document: missing created_at, messages, model, "
                                "settings, system_prompt, title, updated_at")


def send_and_wait(qtbot, session, text, timeout=300000):
    with qtbot.waitSignal(session.controller.reply_finished, timeout=timeout) as finished:
        session.controller.send(text)
    return finished.args[1]


def settle(session, **changes):
    import dataclasses
    c = session.controller
    c.update_settings(dataclasses.replace(c.settings(), **changes))


def wait_loaded(qtbot, session):
    if not session.controller.model_info:
        with qtbot.waitSignal(session.controller.model_changed, timeout=300000):
            pass
    return session.controller.model_info


@pytest.mark.gui
@pytest.mark.slow
def test_save_state_then_restore_it_continues_without_reprocessing(small_model, qtbot, make_session, tmp_path):
    session = make_session(model=small_model)
    settle(session, max_tokens=8, temperature=0.0)
    send_and_wait(qtbot, session, "What colour is the sea?")
    c = session.controller
    history_len = len(c.history(c.current_id))
    path = tmp_path / "sea.hearth"
    fake_dialog(session, path)
    with qtbot.waitSignal(session.actions.state_done, timeout=300000) as done:
        trigger(session, "save_state")
    assert done.args == [str(path), True] and path.stat().st_size > 0
    assert session.window.notice_bar.label.text().startswith("Saved the conversation and its state (")
    session.close()
    (tmp_path / "other").mkdir()
    again = make_session(data=tmp_path / "other", model=small_model)  # a fresh app on another data dir
    wait_loaded(qtbot, again)
    fake_dialog(again, path)
    with qtbot.waitSignal(again.actions.state_done, timeout=300000) as done:
        trigger(again, "restore_state")
    assert done.args == [str(path), True]
    c = again.controller
    assert len(c.history(c.current_id)) == history_len and c.store.conversation(c.current_id).title == "What colour is the sea?"
    assert again.window.notice_bar.label.text().startswith("Restored the conversation with its state (")
    stats = send_and_wait(qtbot, again, "And the sky?")
    assert stats["restored_from"] == "file" and stats["cached_tokens"] >= 15
    assert stats["prompt_tokens"] - stats["cached_tokens"] <= 12  # only the new question was read


@pytest.mark.gui
@pytest.mark.slow
def test_a_snapshot_of_another_model_imports_the_text_and_says_why_the_state_was_not_used(qtbot, make_session,
                                                                                          small_model, tmp_path):
    import engine.model
    from tests.model_store import model_path

    path = tmp_path / "gemma.hearth"
    store = ConversationStore(tmp_path / "src.db")
    conv = store.create_conversation("From Gemma")
    store.add_message(conv.id, "user", "Hello Gemma")
    store.add_message(conv.id, "assistant", "Hello!")
    document = ce.conversation_document(store, conv.id)
    store.close()
    gemma = engine.model.load(model_path("gemma3"), n_ctx=512)
    try:
        gemma.next_token_logits(gemma.chat_ids([{"role": "user", "content": "Hello Gemma"},
                                                {"role": "assistant", "content": "Hello!"}]))
        gemma.save_session(path, conversation=document)
    finally:
        gemma.close()
    session = make_session(model=small_model)
    wait_loaded(qtbot, session)
    fake_dialog(session, path)
    with qtbot.waitSignal(session.actions.state_done, timeout=300000) as done:
        trigger(session, "restore_state")
    assert done.args == [str(path), False]
    c = session.controller
    assert [m.content for m in c.store.messages(c.current_id)] == ["Hello Gemma", "Hello!"]
    bar = session.window.notice_bar
    assert bar.kind == "warning" and "imported as text" in bar.label.text()
    assert "belongs to another model" in bar.label.text() and "re-process the history" in bar.label.text()
    settle(session, max_tokens=4, temperature=0.0)
    stats = send_and_wait(qtbot, session, "How are you?")
    assert "restored_from" not in stats and stats["generated_tokens"] >= 1


@pytest.mark.gui
@pytest.mark.slow
def test_reopening_the_app_restores_the_last_conversation_from_its_snapshot(qtbot, make_session, small_model,
                                                                           tmp_path):
    session = make_session(model=small_model)
    settle(session, max_tokens=8, temperature=0.0)
    first = send_and_wait(qtbot, session, "Tell me a fact about owls.")
    conv_id = session.controller.current_id
    session.close()
    assert list((tmp_path / "data" / "snapshots").glob(f"c{conv_id}-*.hearth"))  # kept on disk at exit
    again = make_session(data=tmp_path / "data", model=small_model)
    assert again.controller.current_id == conv_id
    stats = send_and_wait(qtbot, again, "Another one?")
    assert stats["restored_from"] == "disk" and stats["cached_tokens"] >= first["prompt_tokens"]
