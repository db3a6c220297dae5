"""The real window on real models: the built-in model streams an answer; on SmolLM2 (fast) stop, regenerate,
edit, switch mid-answer, restart."""

import dataclasses

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from app.builtin_model import BUILTIN_MODEL_NAME

from .fake_engine import make_cool

pytestmark = [pytest.mark.gui, pytest.mark.slow]

LONG = 20000  # ms: a short answer from SmolLM2 on a busy 2-core machine


def configure(session, **changes):
    c = session.controller
    c.update_settings(dataclasses.replace(c.settings(), **changes))


def type_and_send(qtbot, session, text):
    edit = session.window.composer.edit
    edit.setFocus()
    edit.setPlainText(text)
    qtbot.keyClick(edit, Qt.Key.Key_Return)


def finish(qtbot, session, action, timeout=120000):
    with qtbot.waitSignal(session.controller.reply_finished, timeout=timeout) as finished:
        action()
    return finished.args


def test_an_answer_streams_into_the_window(qtbot, make_session):
    session = make_session()
    configure(session, max_tokens=24, temperature=0.0)
    updates = []
    session.controller.reply_text.connect(lambda mid, text: updates.append(text))
    message_id, stats = finish(qtbot, session, lambda: type_and_send(qtbot, session, "Hello! Who are you?"))
    content = session.controller.store.message(message_id).content
    assert content.strip() and stats["generated_tokens"] > 1 and stats["finish_reason"] in ("eos", "length")
    assert len(updates) >= 2 and updates[-1] == content and all(b.startswith(a) for a, b in zip(updates, updates[1:]))
    widget = session.window.chat_view.widgets[message_id]
    assert widget.body.markdown == content and "tok/s" in widget._stats.text()
    assert session.window.composer.meter_label.text().startswith(f"Context {stats['context_used']:,} / 4,096")
    assert session.controller.model_info["name"] == BUILTIN_MODEL_NAME
    assert session.window.composer.model_label.text() == BUILTIN_MODEL_NAME


def test_escape_stops_the_answer_and_keeps_what_was_said(small_model, qtbot, make_session):
    session = make_session(model=small_model)
    configure(session, max_tokens=400, temperature=0.8)
    c = session.controller
    with qtbot.waitSignal(c.reply_text, timeout=LONG * 6):
        type_and_send(qtbot, session, "Write a long story about a dragon who learns to bake bread.")
    assert session.window.composer.generating
    message_id, stats = finish(qtbot, session, lambda: qtbot.keyClick(session.window.composer.edit, Qt.Key.Key_Escape))
    message = c.store.message(message_id)
    assert message.state == "stopped" and stats["finish_reason"] == "cancelled"
    assert message.content.strip() and stats["generated_tokens"] < 400
    assert not session.window.composer.generating
    assert "stopped" in session.window.chat_view.widgets[message_id]._stats.text()


def test_regenerate_replaces_the_last_answer_reusing_the_cached_prompt(small_model, qtbot, make_session):
    session = make_session(model=small_model)
    configure(session, max_tokens=12, temperature=1.0)
    c = session.controller
    first_id, _ = finish(qtbot, session, lambda: type_and_send(qtbot, session, "Name a colour."))
    button = session.window.chat_view.widgets[first_id].regenerate_button
    assert button.isVisible()
    second_id, stats = finish(qtbot, session, lambda: qtbot.mouseClick(button, Qt.MouseButton.LeftButton))
    messages = c.store.messages(c.current_id)
    assert [m.role for m in messages] == ["user", "assistant"] and messages[1].id == second_id != first_id
    assert messages[1].content.strip() and stats["cached_tokens"] > 0  # the KV cache of the prompt was reused


def test_edit_a_question_and_send_it_again(small_model, qtbot, make_session):
    session = make_session(model=small_model)
    configure(session, max_tokens=12, temperature=0.0)
    c = session.controller
    finish(qtbot, session, lambda: type_and_send(qtbot, session, "What is 2 + 2?"))
    user = c.store.messages(c.current_id)[0]
    widget = session.window.chat_view.widgets[user.id]
    qtbot.mouseClick(widget.edit_button, Qt.MouseButton.LeftButton)
    widget.edit_box.setPlainText("What is the capital of France?")
    send = next(b for b in widget.findChildren(QPushButton) if b.text() == "Save and send")
    _, stats = finish(qtbot, session, lambda: qtbot.mouseClick(send, Qt.MouseButton.LeftButton))
    messages = c.store.messages(c.current_id)
    assert [m.content for m in messages][0] == "What is the capital of France?" and len(messages) == 2
    assert messages[1].content.strip() and messages[1].state == "complete"


def test_switching_conversations_while_an_answer_streams(small_model, qtbot, make_session):
    session = make_session(model=small_model)
    make_cool(session.host.thermal)  # on a hot or shared CI machine the policy may allow one sequence at a time
    # seeded plain sampling: a fixed answer of 699 tokens (seed 7's 333 could end before the second was sent), so
    # it is still streaming when the second answer joins it and after that one ends
    configure(session, max_tokens=3000, temperature=0.8, seed=2, speculation="off")
    c, window = session.controller, session.window
    with qtbot.waitSignal(c.reply_text, timeout=LONG * 6):
        type_and_send(qtbot, session, "Tell me everything about the history of tea.")
    first = c.current_id
    qtbot.mouseClick(window.sidebar.new_button, Qt.MouseButton.LeftButton)
    second = c.current_id
    assert second != first and window.chat_view.widgets == {} and not window.composer.generating
    qtbot.wait(500)  # the first answer keeps streaming in the background
    assert window.chat_view.widgets == {}
    configure(session, max_tokens=8, temperature=0.0)
    stats = {}
    c.reply_finished.connect(lambda mid, s: stats.update({mid: s}))
    batches = []
    session.telemetry.engine_sampled.connect(lambda sample: batches.append(sample.batch))
    assert c.answering() == {first}
    type_and_send(qtbot, session, "Say hi.")  # joins the first answer: both decode in one batched pass per step
    qtbot.waitUntil(lambda: any(m.state == "complete" and m.role == "assistant" for m in c.store.messages(second)),
                    timeout=120000)
    (here,) = [m for m in c.store.messages(second) if m.role == "assistant"]
    assert here.content.strip() and stats[here.id]["batched"] and stats[here.id]["generated_tokens"] >= 1
    assert 2 in batches  # the dashboard was told two replies decoded together
    (background,) = [m for m in c.store.messages(first) if m.role == "assistant"]
    assert background.id not in stats  # still streaming beside it, and after it
    assert c.answering() == {first} and not window.sidebar.item_for(first).icon().isNull()
    assert window.sidebar.item_for(second).icon().isNull()
    c.open_conversation(first)
    assert window.composer.generating
    qtbot.waitUntil(lambda: len(c.messages()[-1].content) > len(background.content), timeout=LONG)
    with qtbot.waitSignal(c.reply_finished, timeout=LONG):
        qtbot.keyClick(window.composer.edit, Qt.Key.Key_Escape)
    background = c.store.message(background.id)
    assert background.state == "stopped" and background.content.strip() and stats[background.id]["batched"]
    assert not c.answering() and window.sidebar.item_for(first).icon().isNull()
    assert window.chat_view.widgets[background.id].body.markdown == background.content
    qtbot.mouseClick(window.sidebar.new_button, Qt.MouseButton.LeftButton)
    assert c.current_id not in (first, second)


def test_everything_is_there_after_a_restart(small_model, qtbot, make_session, tmp_path):
    session = make_session(model=small_model)
    configure(session, max_tokens=10, temperature=0.0, system_prompt="Be brief.")
    finish(qtbot, session, lambda: type_and_send(qtbot, session, "What is the sun?"))
    c = session.controller
    conv_id = c.current_id
    before = [(m.role, m.content, m.state) for m in c.store.messages(conv_id)]
    session.close()
    again = make_session(data=tmp_path / "data", model=small_model)
    assert again.controller.current_id == conv_id
    assert [(m.role, m.content, m.state) for m in again.controller.store.messages(conv_id)] == before
    assert [w.body.markdown for w in again.window.chat_view.widgets.values()] == [b[1] for b in before]
    assert again.window.sidebar.item_for(conv_id).text() == "What is the sun?"
    assert again.window.settings_panel.system_prompt.toPlainText() == "Be brief."
