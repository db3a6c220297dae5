"""The first hour with the app: each reply keeps its model's name, adding a model changes no conversation, new
chats start from the default settings, errors show where the action was taken, base models are labelled, the
stats line is plain and the context meter names the room kept for the reply."""

import dataclasses

import pytest
from PySide6.QtWidgets import QPushButton

from app.builtin_model import BUILTIN_MODEL_NAME
from app.chat_settings import ChatSettings
from app.conversation_export import conversation_document, to_markdown
from app.generation_history import recent_generations
from app.qt_compat import emit
from app.store import Message
from app.ui.message_widget import MessageWidget
from tests.app.models.tiny_gguf import write_tiny_gguf

from .fake_engine import FakeFactory, FakeModel

pytestmark = pytest.mark.gui

BUILTIN = BUILTIN_MODEL_NAME  # the built-in model stands in for "the first model"


def ask(qtbot, session, text):
    with qtbot.waitSignal(session.controller.reply_finished, timeout=20000) as finished:
        session.controller.send(text)
    return finished.args[0]


def authors(window):
    return [w._author.text() for w in window.chat_view.widgets.values()]


def test_each_reply_keeps_the_name_of_the_model_that_wrote_it(qtbot, make_session, tmp_path):
    other = FakeModel(["Ahoy"])
    other.name = "Other Model 7B Instruct AWQ"  # the file's general.name
    session = make_session(engine_factory=FakeFactory(FakeModel(["Hi"]), other))
    window, c = session.window, session.controller
    ask(qtbot, session, "first")
    with qtbot.waitSignal(c.model_changed, timeout=20000):
        c.set_model(str(tmp_path / "Other-Model-7B-Instruct-Q4_K_M.gguf"))
    assert authors(window) == ["You", BUILTIN]  # switching models relabels no earlier reply
    ask(qtbot, session, "second")
    assert authors(window) == ["You", BUILTIN, "You", "Other Model 7B Instruct"]
    c.new_conversation()
    c.open_conversation(c.store.conversations()[-1].id)  # built again from the store
    assert authors(window) == ["You", BUILTIN, "You", "Other Model 7B Instruct"]
    markdown = to_markdown(conversation_document(c.store, c.current_id))
    assert f"## Assistant ({BUILTIN}) — " in markdown and "## Assistant (Other Model 7B Instruct) — " in markdown
    assert [r.model for r in recent_generations(c.store)] == ["Other Model 7B Instruct", BUILTIN]


def test_adding_a_model_leaves_the_open_conversation_alone(qtbot, make_session, tmp_path):
    factory = FakeFactory(FakeModel(["ok"]))
    session = make_session(engine_factory=factory)
    window, c = session.window, session.controller
    qtbot.waitUntil(lambda: bool(c.model_info), timeout=20000)
    loads = list(factory.loads)
    window.show_page("models")
    path = str(write_tiny_gguf(tmp_path / "Tiny-Chat-q8_0.gguf", name="Tiny Chat"))
    emit(window.models_page.add_requested, path)
    assert c.store.conversation(c.current_id).model_path is None and c.model_name() == BUILTIN
    assert factory.loads == loads  # nothing was loaded
    assert window.stack.currentWidget() is window.pages["models"]
    assert window.models_page.message.text().startswith("Added Tiny Chat to the library.")
    assert window.models_page.list.currentItem().text().startswith("Tiny Chat\n")


def test_a_file_that_cannot_be_added_is_reported_on_its_row(qtbot, make_session, tmp_path):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    window = session.window
    window.show_page("models")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"this is not a GGUF file at all")
    emit(window.models_page.add_requested, str(broken))
    first = window.models_page.list.item(0).text()
    assert first.startswith("broken.gguf\nCould not add: the file is not a usable GGUF model") and str(broken) not in first
    assert window.models_page.message.isVisible() and "Could not add broken.gguf" in window.models_page.message.text()
    assert "broken.gguf" not in window.notice_bar.label.text()  # not on the Chat page, where nothing was done
    window._refresh_models()  # a refresh keeps the failed row until the file is added
    assert window.models_page.list.item(0).text() == first


def test_a_new_chat_starts_from_the_default_settings_not_the_last_chat(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    window, c = session.window, session.controller
    pirate = dataclasses.replace(c.settings(), system_prompt="Talk like a pirate.", temperature=1.5, top_k=7)
    c.update_settings(pirate)
    ask(qtbot, session, "hello")
    c.new_conversation()
    assert c.settings() == ChatSettings()
    window.show_page("defaults")
    page = window.defaults_page
    assert not page.panel.model_name.isVisible() and page.panel.thinking.isVisible()
    page.panel.system_prompt.setPlainText("Answer in one sentence.")
    page.panel.inputs["temperature"].setValue(0.2)
    window.show_page("chat")  # leaving the page applies the edit
    ask(qtbot, session, "hello again")
    c.new_conversation()
    assert (c.settings().system_prompt, c.settings().temperature) == ("Answer in one sentence.", 0.2)
    ask(qtbot, session, "and again")
    window.show_page("defaults")
    page.panel.inputs["temperature"].setValue(0.3)
    emit(window.sidebar.new_requested)  # at once, before the edit's pause: it applies to this new chat too
    assert (c.settings().system_prompt, c.settings().temperature) == ("Answer in one sentence.", 0.3)
    assert window.settings_panel.system_prompt.toPlainText() == "Answer in one sentence."
    window.settings_panel.inputs["top_k"].setValue(3)
    window.settings_panel.flush()
    reset = next(b for b in window.settings_panel.findChildren(QPushButton) if b.text() == "Reset to defaults")
    reset.click()
    assert c.settings().system_prompt == "Answer in one sentence." and c.settings().top_k == ChatSettings().top_k
    assert c.store.conversation(c.store.conversations()[-1].id).settings.system_prompt == "Talk like a pirate."


def test_a_base_model_is_labelled_before_the_first_message(qtbot, make_session, tmp_path):
    session = make_session(engine_factory=FakeFactory(FakeModel(["and then"])))
    window, c = session.window, session.controller
    path = str(write_tiny_gguf(tmp_path / "gemma-3-1b-pt-q8_0.gguf", name="Gemma 3 1b Pt", chat_template=None))
    window.show_page("models")
    emit(window.models_page.add_requested, path)
    rows = [window.models_page.list.item(i).text() for i in range(window.models_page.list.count())]
    assert any(r.startswith("Gemma 3 1b Pt\nbase model — text completion") for r in rows)
    assert not any(r.startswith(f"{BUILTIN} (built-in)\nbase model") for r in rows)
    with qtbot.waitSignal(c.model_changed, timeout=20000):
        emit(window.models_page.use_requested, path)
    assert not c.store.messages(c.current_id)
    assert "base model — text completion" in window.chat_view._empty.text()
    assert window.composer.model_label.text().endswith("· base model — text completion")
    c.new_conversation()  # a chat with the built-in (chat) model has no such label
    with qtbot.waitSignal(c.model_changed, timeout=20000):
        c.set_model(session.controller.builtin_path)
    assert "base model" not in window.chat_view._empty.text()
    assert "base model" not in window.composer.model_label.text()


def test_the_stats_line_is_plain_and_the_engine_s_details_are_its_tooltip(qtbot):
    stats = {"generated_tokens": 127, "prefill_s": 0.31, "decode_tps": 24.5, "prompt_tokens": 40, "cached_tokens": 30,
             "speculation": "prompt lookup", "drafted_tokens": 127, "accepted_tokens": 38, "speedup_estimate": 0.98}
    widget = MessageWidget(Message(1, 1, 1, "assistant", "Hi", "complete", stats, 0.0), "Model")
    qtbot.addWidget(widget)
    assert widget._stats.text() == "127 tokens · 0.31 s to first token · 24.5 tok/s"
    tip = widget._stats.toolTip()
    assert "prompt lookup: 38 of 127 drafted tokens accepted (30%)" in tip and "30 of 40 prompt tokens cached" in tip


def test_the_context_meter_names_the_setting_s_length_and_the_reply_s_room(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"], dropped=2)))
    window, c = session.window, session.controller
    c.update_settings(dataclasses.replace(c.settings(), max_tokens=300))
    ask(qtbot, session, "hi")
    assert "did not fit in the context of 4,096 tokens, which keeps 300 for the reply" in window.notice_bar.label.text()
    assert window.composer.meter_label.text() == "Context 11 / 4,096 tokens (300 for the reply)"
    assert "can use 3,796" in window.composer.meter_label.toolTip()
