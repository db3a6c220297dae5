"""The main window with a fake engine: composing, Markdown, message actions, sidebar, notices, settings."""

import dataclasses
import sqlite3

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.builtin_model import BUILTIN, BUILTIN_MODEL_NAME, BuiltinModel
from app.qt_compat import emit
from app.store import DB_FILENAME, ConversationStore
from app.ui.markdown_view import CodeBlock, ProseBlock
from engine.gguf_file import ModelFormatError

from .fake_engine import FakeFactory, FakeModel

pytestmark = pytest.mark.gui

MARKDOWN = ["Here is code:\n\n", "```python\nprint(1)\n", "```\n\n", "| a | b |\n|---|---|\n| 1 | 2 |\n\n", "- item"]


def send(qtbot, session, text):
    c = session.controller
    edit = session.window.composer.edit
    edit.setFocus()
    edit.setPlainText(text)
    with qtbot.waitSignal(c.reply_finished, timeout=20000) as finished:
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    return finished.args


def test_enter_sends_shift_enter_adds_a_line_and_the_answer_streams_in(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["Hi", " you"], token_s=0.05)))
    edit = session.window.composer.edit
    qtbot.keyClicks(edit, "line one")
    qtbot.keyClick(edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(edit, "line two")
    with qtbot.waitSignal(session.controller.reply_finished, timeout=20000):
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    c = session.controller
    user, answer = c.store.messages(c.current_id)
    assert (user.content, answer.content, answer.state) == ("line one\nline two", "Hi you", "complete")
    assert edit.toPlainText() == ""
    widgets = list(session.window.chat_view.widgets.values())
    assert [w.message.role for w in widgets] == ["user", "assistant"]
    assert widgets[1].body.markdown == "Hi you" and "2 tokens" in widgets[1]._stats.text()
    assert session.window.sidebar.list.item(0).text() == "line one line two"
    assert session.window.composer.meter_label.text() == "Context 12 / 4,096 tokens (512 for the reply)"


def test_markdown_code_blocks_tables_and_copy_buttons(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(MARKDOWN)))
    message_id, _ = send(qtbot, session, "show me")
    widget = session.window.chat_view.widgets[message_id]
    (code,) = widget.body.code_blocks()
    assert isinstance(code, CodeBlock) and code.text() == "print(1)" and code._language.text() == "python"
    qtbot.mouseClick(code.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "print(1)"
    prose = [w for kind, w in widget.body._blocks if kind == "text"]
    assert all(isinstance(p, ProseBlock) for p in prose) and len(prose) == 2
    table_doc = prose[1].document()
    assert "item" in table_doc.toPlainText()
    assert any(frame.__class__.__name__ == "QTextTable" for frame in table_doc.rootFrame().childFrames())
    qtbot.mouseClick(widget.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "".join(MARKDOWN)


def test_delete_a_message(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    message_id, _ = send(qtbot, session, "hello")
    c = session.controller
    qtbot.mouseClick(session.window.chat_view.widgets[message_id].delete_button, Qt.MouseButton.LeftButton)
    assert [m.role for m in c.store.messages(c.current_id)] == ["user"]
    assert list(session.window.chat_view.widgets) == [c.store.messages(c.current_id)[0].id]


def test_rename_search_and_delete_with_undo(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    send(qtbot, session, "about rust lifetimes")
    first = session.controller.current_id
    session.controller.new_conversation()
    send(qtbot, session, "dinner recipe with butter")
    sidebar = session.window.sidebar
    item = sidebar.item_for(first)
    item.setText("Rust notes")
    assert session.controller.store.conversation(first).title == "Rust notes"
    with qtbot.waitSignal(sidebar.search_changed, timeout=2000):
        sidebar.search.setText("BUTTER")
    assert [sidebar.list.item(i).text() for i in range(sidebar.list.count())] == ["dinner recipe with butter"]
    with qtbot.waitSignal(sidebar.search_changed, timeout=2000):
        sidebar.search.setText("")
    sidebar.list.setCurrentItem(sidebar.item_for(first))
    sidebar.list.setFocus()
    qtbot.keyClick(sidebar.list, Qt.Key.Key_Delete)
    assert sidebar.item_for(first) is None
    bar = session.window.notice_bar
    assert bar.isVisible() and "Rust notes" in bar.label.text() and bar.action.text() == "Undo"
    qtbot.mouseClick(bar.action, Qt.MouseButton.LeftButton)
    assert sidebar.item_for(first) is not None and session.controller.current_id == first


def test_a_model_that_fails_to_load_shows_a_readable_error(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(ModelFormatError("the file is not a GGUF model")),
                           start=False)
    with qtbot.waitSignal(session.controller.model_changed, timeout=20000):
        session.start()
    bar = session.window.notice_bar
    qtbot.waitUntil(bar.isVisible)
    assert bar.kind == "error" and "The file is not a GGUF model" in bar.label.text()
    assert session.window.statusBar().currentMessage() == "No model loaded"


def test_an_engine_crash_is_shown_and_the_next_message_works(qtbot, make_session):
    factory = FakeFactory(FakeModel(fail_with=RuntimeError("out of cheese")), FakeModel(["recovered"]))
    session = make_session(engine_factory=factory)
    message_id, stats = send(qtbot, session, "first")
    c = session.controller
    assert c.store.message(message_id).state == "error" and stats == {"error": "Out of cheese"}
    qtbot.waitUntil(lambda: "restarted" in session.window.notice_bar.label.text())
    widget = session.window.chat_view.widgets[message_id]
    assert widget._error.isVisible() and "Out of cheese" in widget._error.text()
    message_id, _ = send(qtbot, session, "second")
    assert c.store.message(message_id).content == "recovered"
    assert [m["content"] for m in factory.models[0].calls[-1]][-1] == "second"  # the failed answer is not resent


def test_dropped_turns_are_announced(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"], dropped=2)))
    message_id, _ = send(qtbot, session, "long chat")
    bar = session.window.notice_bar
    assert bar.isVisible() and bar.kind == "warning" and "2 older messages" in bar.label.text()
    assert "2 old messages left out" in session.window.chat_view.widgets[message_id]._stats.text()


def test_settings_are_per_conversation_and_used_for_the_next_answer(qtbot, make_session):
    model = FakeModel(["ok"])
    factory = FakeFactory(model)
    session = make_session(engine_factory=factory)
    panel = session.window.settings_panel
    session.window.settings_button.click()
    assert panel.isVisible()
    panel.system_prompt.setPlainText("Answer in French.")
    panel.inputs["n_ctx"].setValue(2048)
    send(qtbot, session, "bonjour")  # sending applies the pending edit first
    c = session.controller
    assert c.settings().system_prompt == "Answer in French." and c.settings().n_ctx == 2048
    assert model.calls[-1][0] == {"role": "system", "content": "Answer in French."}
    assert factory.loads[-1][1] == 2048
    first = c.current_id
    c.new_conversation()
    c.open_conversation(first)
    assert panel.system_prompt.toPlainText() == "Answer in French." and panel.inputs["n_ctx"].value() == 2048


def test_a_damaged_database_is_reported_in_the_window(qtbot, make_session, tmp_path):
    data = tmp_path / "data"
    (data / DB_FILENAME).write_bytes(b"garbage" * 1000)
    session = make_session(engine_factory=FakeFactory(FakeModel()))
    bar = session.window.notice_bar
    assert bar.isVisible() and "damaged" in bar.label.text() and "moved to" in bar.label.text()
    assert sqlite3.connect(data / DB_FILENAME).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_damaged_download_state_file_is_reported_in_the_window(qtbot, make_session, tmp_path):
    downloads = tmp_path / "data" / "downloads"
    downloads.mkdir(parents=True)
    (downloads / "0123456789abcdef01234567.json").write_text('{"repo": "a/b", "filena')  # cut off mid-write
    session = make_session(engine_factory=FakeFactory(FakeModel()))
    bar = session.window.notice_bar
    assert bar.isVisible() and "download's state file was damaged" in bar.label.text()
    assert str(next(downloads.glob("*.json.damaged-*"))) in bar.label.text()


def test_an_answer_cut_off_by_a_crash_shows_as_interrupted(qtbot, make_session, tmp_path):
    data = tmp_path / "data"
    store, _ = ConversationStore.open(data / DB_FILENAME)
    conv = store.create_conversation("Cut off")
    store.add_message(conv.id, "user", "tell me a story")
    writer = store.begin_reply(conv.id, interval=0)
    writer.append("Once upon a")
    store.close()
    session = make_session(engine_factory=FakeFactory(FakeModel()))
    widget = session.window.chat_view.widgets[writer.message_id]
    assert widget.body.markdown == "Once upon a" and "interrupted" in widget._stats.text()


def test_stop_while_the_prompt_is_read_frees_the_window_at_once(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["late"], prefill_s=1.5)))
    c = session.controller
    edit = session.window.composer.edit
    edit.setPlainText("a long document ...")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    composer = session.window.composer
    assert composer.generating and composer.button.accessibleName() == "Stop"
    qtbot.mouseClick(composer.button, Qt.MouseButton.LeftButton)
    assert not composer.generating and composer.button.accessibleName() == "Send"
    assert [m.role for m in c.store.messages(c.current_id)] == ["user"]  # no empty answer left behind
    with qtbot.waitSignal(c.reply_finished, timeout=20000):
        composer.edit.setPlainText("again")
        qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    assert [m.content for m in c.store.messages(c.current_id)] == ["a long document ...", "again", "late"]


def test_a_conversation_remembers_the_model_chosen_on_the_models_page(qtbot, make_session, tmp_path,
                                                                      builtin_model):
    factory = FakeFactory(FakeModel(["ok"]))
    session = make_session(engine_factory=factory)
    window, c = session.window, session.controller
    window.show_page("models")
    listed = [window.models_page.list.item(i).text() for i in range(window.models_page.list.count())]
    assert any(text.startswith(f"{BUILTIN_MODEL_NAME} (built-in)") for text in listed)
    assert c.store.conversation(c.current_id).model_path is None  # the default model, not a frozen path
    other = str(tmp_path / "other.gguf")
    with qtbot.waitSignal(c.model_changed, timeout=20000):
        emit(window.models_page.use_requested, other)
    assert window.stack.currentWidget() is window.pages["chat"]
    assert c.store.conversation(c.current_id).model_path == other and factory.loads[-1] == (other, 4096)
    send(qtbot, session, "hi")
    c.new_conversation()
    assert c.model_path() == other and window.composer.model_label.text() == "other"  # the file names it, not "Fake"
    emit(window.models_page.use_requested, builtin_model)
    assert c.store.conversation(c.current_id).model_path is None and c.model_name() == BUILTIN_MODEL_NAME


def test_without_the_built_in_model_the_window_says_so(qtbot, make_session, tmp_path):
    spec = dataclasses.replace(BUILTIN, parts=("hearth-no-such-part",))
    session = make_session(engine_factory=FakeFactory(FakeModel()), builtin=BuiltinModel(spec, tmp_path / "builtin"))
    bar = session.window.notice_bar
    assert bar.isVisible() and "The built-in model is missing" in bar.label.text()
    assert "'hearth-no-such-part'" in bar.label.text() and session.progress_dialog is None
    session.window.composer.edit.setPlainText("hello?")
    qtbot.keyClick(session.window.composer.edit, Qt.Key.Key_Return)
    assert "No model to answer with" in bar.label.text()
    assert session.window.composer.model_label.text() == "No model"


@pytest.mark.qt_log_ignore("propagateSizeHints")  # the offscreen platform plugin's note on any dialog
def test_about_box_shows_the_version_from_its_one_source(qtbot, make_session):
    import engine
    from app.ui.about_dialog import AboutDialog

    session = make_session(engine_factory=FakeFactory(FakeModel(["Hi"])))
    qtbot.mouseClick(session.window.about_button, Qt.MouseButton.LeftButton)
    (dialog,) = session.window.findChildren(AboutDialog)
    assert f"Hearth {engine.__version__}" in dialog.text()
    dialog.close()
