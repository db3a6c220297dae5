"""A thinking model's reply in the app: stored apart, streamed into a folding Thinking block, counted in the stats,
switched per conversation, and old databases still open."""

import dataclasses
import sqlite3

import pytest
from PySide6.QtCore import Qt

from app import store as store_module
from app.chat_settings import ChatSettings
from app.store import ConversationStore
from app.ui.message_widget import MessageWidget, stats_text
from app.ui.settings_panel import SettingsPanel
from engine.reasoning import HARMONY, THINK, ReasoningProfile, ReasoningSplitter

from .fake_engine import FakeFactory, FakeModel

pytestmark = pytest.mark.gui

QWEN3 = ReasoningProfile(THINK, has_switch=True)
THOUGHT = ["<think>", "\n", "The user", " greets", " me.", "\n", "</think>", "\n\n", "Hello", "!"]


def send(qtbot, session, text):
    c = session.controller
    with qtbot.waitSignal(c.reply_finished, timeout=20000) as finished:
        c.send(text)
    return finished.args


def thinking_session(qtbot, make_session, pieces=THOUGHT, profile=QWEN3, **kw):
    model = FakeModel(pieces, reasoning=profile, **kw)
    session = make_session(engine_factory=FakeFactory(model))
    with qtbot.waitSignal(session.controller.model_changed, timeout=20000):
        pass
    return session, model


# -- the whole app, fake engine ---------------------------------------------------------------------------
def test_a_thinking_reply_is_stored_apart_and_shown_folded(qtbot, make_session):
    session, model = thinking_session(qtbot, make_session, token_s=0.05)  # pieces apart: the thinking streams
    c = session.controller
    seen = []
    c.reply_thinking.connect(lambda mid, text, now: seen.append((text, now)))
    message_id, stats = send(qtbot, session, "Hi")
    answer = c.store.message(message_id)
    assert (answer.thinking, answer.content) == ("The user greets me.", "Hello!")
    assert stats["thinking_tokens"] == 7 and stats["generated_tokens"] == 10
    assert c.history(c.current_id)[-1] == {"role": "assistant", "content": "Hello!"}  # the thinking stays out
    assert any(now for _, now in seen) and seen[-1] == ("The user greets me.", False)
    widget = session.window.chat_view.widgets[message_id]
    assert widget.thinking.isVisible() and not widget.thinking.is_open() and widget.thinking.body.isHidden()
    assert widget.thinking.header.text() == "Thinking · 7 tokens"
    assert widget.body.markdown == "Hello!" and "10 tokens (7 thinking)" in widget._stats.text()
    qtbot.mouseClick(widget.thinking.header, Qt.MouseButton.LeftButton)
    assert widget.thinking.is_open() and widget.thinking.body.markdown == "The user greets me."
    widget.set_thinking("Line one\nLine two", False)
    assert widget.thinking.body.markdown == "Line one  \nLine two"  # a hard break: the lines stay apart


def test_the_thinking_switch_reaches_the_template_and_the_panel_shows_it(qtbot, make_session):
    session, model = thinking_session(qtbot, make_session)
    c, panel = session.controller, session.window.settings_panel
    assert not panel.thinking.isHidden() and panel.thinking.isChecked()
    c.update_settings(dataclasses.replace(c.settings(), enable_thinking=False))
    send(qtbot, session, "Hi")
    assert model.template_vars[-1] == {"enable_thinking": False}
    assert c.store.conversation(c.current_id).settings.enable_thinking is False


def test_no_switch_for_a_model_without_one(qtbot, make_session):
    session, _ = thinking_session(qtbot, make_session, pieces=["Hi"], profile=ReasoningProfile())
    assert session.window.settings_panel.thinking.isHidden()
    message_id, stats = send(qtbot, session, "Hi")
    assert "thinking_tokens" not in stats and session.controller.store.message(message_id).thinking == ""


def test_a_reply_that_starts_inside_the_thinking_opened_by_the_prompt(qtbot, make_session):
    profile = ReasoningProfile(THINK, has_switch=True, opens_on=True)  # Qwen3.5, QwQ
    session, _ = thinking_session(qtbot, make_session, pieces=["Short", " thought", "</think>", "\n\nYes"],
                                  profile=profile)
    message_id, stats = send(qtbot, session, "Hi")
    answer = session.controller.store.message(message_id)
    assert (answer.thinking, answer.content, stats["thinking_tokens"]) == ("Short thought", "Yes", 3)


def test_gpt_oss_analysis_channel_is_thinking(qtbot, make_session):
    pieces = ["<|channel|>", "analysis", "<|message|>", "Greeting", ".", "<|end|>", "<|start|>", "assistant",
              "<|channel|>", "final", "<|message|>", "Hello"]
    session, _ = thinking_session(qtbot, make_session, pieces=pieces, profile=ReasoningProfile(HARMONY))
    message_id, stats = send(qtbot, session, "Hi")
    answer = session.controller.store.message(message_id)
    assert (answer.thinking, answer.content, stats["thinking_tokens"]) == ("Greeting.", "Hello", 6)


def test_stopping_while_it_thinks_keeps_the_thinking(qtbot, make_session):
    session, _ = thinking_session(qtbot, make_session, pieces=["<think>", "hmm"] + ["."] * 200, token_s=0.02)
    c = session.controller
    with qtbot.waitSignal(c.reply_thinking, timeout=20000, check_params_cb=lambda mid, text, now: "hmm" in text):
        c.send("Hi")
    message_id = c.streaming_message_id()
    widget = session.window.chat_view.widgets[message_id]
    qtbot.waitUntil(lambda: widget.thinking.is_open(), timeout=1000)  # the view repaints within REPAINT_S
    assert widget.thinking.header.text() == "Thinking…"
    with qtbot.waitSignal(c.reply_finished, timeout=20000):
        c.stop()
    answer = c.store.message(message_id)
    assert answer.state == "stopped" and answer.thinking.startswith("hmm") and answer.content == ""
    widget = session.window.chat_view.widgets[message_id]
    assert widget.thinking.is_open()  # nothing else to show: the thinking stays open


# -- the message widget alone ---------------------------------------------------------------------------------
def _message(**kw):
    base = store_module.Message(1, 1, 1, "assistant", "", "streaming", {}, 0.0)
    return dataclasses.replace(base, **kw)


def test_widget_opens_while_thinking_folds_when_the_answer_starts_and_respects_the_user(qtbot):
    widget = MessageWidget(_message())
    qtbot.addWidget(widget)
    widget.set_message(_message(), streaming=True)
    assert widget.thinking.isHidden() and widget.body.markdown == "*Thinking…*"
    widget.set_thinking("First idea", True)
    assert widget.thinking.is_open() and widget.thinking.header.text() == "Thinking…" and widget.body.isHidden()
    widget.set_text("The answer")
    assert not widget.thinking.is_open() and widget.body.markdown == "The answer"
    widget.thinking.header.click()  # the user opens it
    widget.set_text("The answer, longer")
    assert widget.thinking.is_open()
    widget.set_message(_message(content="The answer, longer", thinking="First idea", state="complete",
                                stats={"thinking_tokens": 3, "generated_tokens": 9, "prefill_s": 0.1}))
    assert widget.thinking.is_open() and widget.thinking.header.text() == "Thinking · 3 tokens"


def test_a_finished_message_with_thinking_starts_folded(qtbot):
    widget = MessageWidget(_message(content="Yes", thinking="Because.", state="complete"))
    qtbot.addWidget(widget)
    assert not widget.thinking.isHidden() and not widget.thinking.is_open()
    assert widget.thinking.header.text() == "Thinking"


def test_stats_count_thinking_tokens_apart():
    stats = {"generated_tokens": 120, "thinking_tokens": 100, "prefill_s": 0.5, "decode_tps": 20.0}
    assert stats_text(_message(stats=stats, state="complete")).startswith("120 tokens (100 thinking) · ")
    assert stats_text(_message(stats={**stats, "thinking_tokens": 0}, state="complete")).startswith("120 tokens · ")
    assert "thinking" not in stats_text(_message(stats={**stats, "thinking_tokens": "x"}, state="complete"))


# -- the settings panel ---------------------------------------------------------------------------------------
def test_settings_panel_thinking_switch(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.set_settings(ChatSettings(enable_thinking=True))
    assert panel.thinking.isHidden()
    panel.set_thinking_available(True)
    assert not panel.thinking.isHidden()
    with qtbot.waitSignal(panel.settings_changed, timeout=5000) as changed:
        panel.thinking.click()
    assert changed.args[0].enable_thinking is False


def test_settings_from_stored_json_keep_a_boolean_only():
    assert ChatSettings.from_dict({"enable_thinking": False}).enable_thinking is False
    assert ChatSettings.from_dict({"enable_thinking": "false"}).enable_thinking is True  # not a bool: default


# -- the store --------------------------------------------------------------------------------------------------
def test_reply_writer_splits_and_saves_both_parts(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    conv = store.create_conversation()
    writer = store.begin_reply(conv.id, interval=0, splitter=ReasoningSplitter(THINK))
    for piece in ["<th", "ink>Idea", "</think>\n\nAns"]:
        writer.append(piece)
    saved = store.message(writer.message_id)
    assert (saved.thinking, saved.content) == ("Idea", "Ans")
    writer.append("wer")
    writer.finish("complete", {"thinking_tokens": 3})
    saved = store.message(writer.message_id)
    assert (saved.thinking, saved.content, saved.stats) == ("Idea", "Answer", {"thinking_tokens": 3})
    store.close()


def test_an_old_database_opens_and_gains_the_thinking_column(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    for migrate in store_module.MIGRATIONS[:2]:  # the schema before thinking existed
        migrate(db)
    db.execute("PRAGMA user_version = 2")
    db.execute("INSERT INTO conversations (title, created_at, updated_at, settings) VALUES ('Old', 1, 1, '{}')")
    db.execute("INSERT INTO messages (conversation_id, seq, role, content, created_at, updated_at)"
               " VALUES (1, 0, 'assistant', 'An old answer', 1, 1)")
    db.close()
    store = ConversationStore(path)
    (message,) = store.messages(1)
    assert (message.content, message.thinking) == ("An old answer", "")
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == store_module.SCHEMA_VERSION == len(store_module.MIGRATIONS)
    assert store.conversation(1).settings.enable_thinking is True
    store.close()
