"""Chat polish found in "The first hour": Send for empty input, the menu bar, elided titles, the sidebar after a
context menu, the narrow window, Rename/Delete without right-click, answers kept as alternatives."""

import pytest
from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QAbstractItemView, QApplication, QLineEdit

from app.ui.sidebar import ID_ROLE

from .fake_engine import FakeFactory, FakeModel

pytestmark = pytest.mark.gui


def send(qtbot, session, text):
    edit = session.window.composer.edit
    edit.setPlainText(text)
    with qtbot.waitSignal(session.controller.reply_finished, timeout=20000) as finished:
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    return finished.args


def test_send_is_disabled_while_the_message_is_empty(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    composer = session.window.composer
    assert not composer.button.isEnabled()
    composer.edit.setPlainText("  \n ")
    assert not composer.button.isEnabled()
    composer.edit.setPlainText("hello")
    assert composer.button.isEnabled()
    composer.set_generating(True)
    composer.edit.clear()
    assert composer.button.isEnabled()  # Stop stays available while the answer streams


def _menu_action(window, text):
    for menu_action in window.menuBar().actions():
        for action in menu_action.menu().actions():
            if action.text().replace("&", "").rstrip("…") == text:
                return action
    raise AssertionError(f"no menu item {text!r}")


def test_the_menu_bar_has_quit_new_chat_and_settings(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    window, c = session.window, session.controller
    send(qtbot, session, "hello")
    quit_action = _menu_action(window, "Quit")
    assert quit_action.shortcut() == QKeySequence("Ctrl+Q")  # Qt shows it as Cmd+Q on macOS
    first = c.current_id
    _menu_action(window, "New chat").trigger()
    assert c.current_id != first
    _menu_action(window, "Settings").trigger()
    assert window.settings_panel.isVisible()
    quit_action.trigger()
    assert not window.isVisible()


def test_a_long_title_is_elided_with_an_ellipsis(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    window, c = session.window, session.controller
    long_title = "A conversation about " + "very " * 40 + "long titles"
    c.rename(c.current_id, long_title)
    window.resize(760, 520)
    qtbot.waitUntil(lambda: window.title.text() != long_title, timeout=2000)
    assert window.title.text().endswith("…") and long_title.startswith(window.title.text()[:-1])
    assert window.title.toolTip() == long_title
    window.resize(4000, 800)
    qtbot.waitUntil(lambda: len(window.title.text()) > 60, timeout=2000)


@pytest.mark.qt_log_ignore("This plugin does not support")  # the offscreen platform's popup menu
def test_right_click_then_escape_keeps_the_open_conversation_highlighted(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    c, sidebar = session.controller, session.window.sidebar
    send(qtbot, session, "first conversation")
    other = c.current_id
    c.new_conversation()
    send(qtbot, session, "second conversation")
    shown = c.current_id
    rect = sidebar.list.visualItemRect(sidebar.item_for(other))
    QTimer.singleShot(200, lambda: QApplication.activePopupWidget() and qtbot.keyClick(
        QApplication.activePopupWidget(), Qt.Key.Key_Escape))
    qtbot.mousePress(sidebar.list.viewport(), Qt.MouseButton.RightButton, pos=rect.center())
    sidebar.list.customContextMenuRequested.emit(rect.center())
    qtbot.mouseRelease(sidebar.list.viewport(), Qt.MouseButton.RightButton, pos=rect.center())
    assert c.current_id == shown
    assert sidebar.list.currentItem().data(ID_ROLE) == shown
    assert [i.data(ID_ROLE) for i in sidebar.list.selectedItems()] == [shown]


def test_the_narrow_window_keeps_the_chat_beside_the_settings(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    window = session.window
    window.resize(760, 520)
    qtbot.waitUntil(lambda: window.width() == 760)
    window.settings_button.click()
    qtbot.wait(50)
    assert window.width() <= 760 and window.settings_panel.isVisible()
    chat, panel = window.chat_view, window.settings_panel
    chat_rect = chat.rect().translated(chat.mapTo(window, QPoint(0, 0)))
    panel_rect = panel.rect().translated(panel.mapTo(window, QPoint(0, 0)))
    assert chat.isVisible() and chat.width() >= 300 and not chat_rect.intersects(panel_rect)
    assert panel_rect.right() <= window.width()
    window.show_page("models")
    window.show_page("chat")
    assert not window.sidebar.isVisible()  # still narrow: coming back to the chat keeps the sidebar away
    window.settings_button.click()
    window.resize(1400, 800)
    window.settings_button.click()
    qtbot.wait(50)
    assert window.sidebar.isVisible()  # a wide window has room for all three


def test_rename_and_delete_are_reachable_without_right_click(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["ok"])))
    window, c = session.window, session.controller
    send(qtbot, session, "to rename")
    menu = window.conversation_menu
    assert menu.isVisible()
    menu.actions_by_name["rename"].trigger()
    assert window.sidebar.list.state() == QAbstractItemView.State.EditingState
    editor = window.sidebar.list.viewport().findChild(QLineEdit)
    editor.setText("renamed")
    qtbot.keyClick(editor, Qt.Key.Key_Return)  # the delegate commits on the next event-loop turn
    qtbot.waitUntil(lambda: c.store.conversation(c.current_id).title == "renamed", timeout=2000)
    doomed = c.current_id
    with qtbot.waitSignal(c.conversation_deleted, timeout=2000):
        menu.actions_by_name["delete"].trigger()
    assert window.sidebar.item_for(doomed) is None


def test_regenerate_keeps_the_earlier_answer_as_an_alternative_to_flip_back_to(qtbot, make_session):
    model = FakeModel(["first answer"])
    session = make_session(engine_factory=FakeFactory(model))
    c, view = session.controller, session.window.chat_view
    first_id, _ = send(qtbot, session, "a question")
    assert not view.widgets[first_id].alternatives_label.isVisible()
    model.pieces = ["second answer"]
    with qtbot.waitSignal(c.reply_finished, timeout=20000) as finished:
        qtbot.mouseClick(view.widgets[first_id].regenerate_button, Qt.MouseButton.LeftButton)
    second_id = finished.args[0]
    widget = view.widgets[second_id]
    assert widget.body.markdown == "second answer"
    assert widget.alternatives_label.isVisible() and widget.alternatives_label.text() == "2/2"
    assert not widget.next_button.isEnabled() and widget.previous_button.isEnabled()
    qtbot.mouseClick(widget.previous_button, Qt.MouseButton.LeftButton)
    shown = view.widgets[first_id]
    assert shown.body.markdown == "first answer" and shown.alternatives_label.text() == "1/2"
    assert [m["content"] for m in c.history(c.current_id)][-2:] == ["a question", "first answer"]
    qtbot.mouseClick(shown.next_button, Qt.MouseButton.LeftButton)
    assert view.widgets[second_id].body.markdown == "second answer"


@pytest.mark.qt_log_ignore("This plugin does not support")  # offscreen: a top-level MarkdownView
def test_code_blocks_are_coloured_and_their_scrollbar_follows_the_theme(qtbot):
    from PySide6.QtGui import QPalette

    from app.ui.markdown_view import MarkdownView
    from app.ui.theme import ThemeKeeper, apply_color_scheme, mix

    app = QApplication.instance()
    old_palette, old_style, old_sheet = app.palette(), app.style().name(), app.styleSheet()
    try:
        apply_color_scheme(app, "dark")
        ThemeKeeper(app).apply()
        view = MarkdownView()
        qtbot.addWidget(view)
        view.resize(420, 300)
        view.set_markdown("```python\ndef f(x):\n    return '" + "long " * 60 + "'  # comment\n```\n")
        view.show()
        qtbot.waitExposed(view)
        (block,) = view.code_blocks()
        formats = block.code.document().firstBlock().layout().formats()
        assert len({f.format.foreground().color().name() for f in formats}) >= 2  # "def" and "f" at least
        bar = block.code.horizontalScrollBar()
        qtbot.waitUntil(bar.isVisible, timeout=2000)
        image = bar.grab().toImage()
        track = image.pixelColor(image.width() * 3 // 4, image.height() // 2)  # the handle is at the left
        palette = app.palette()
        code_background = mix(palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text), 0.05)
        assert abs(track.lightness() - code_background.lightness()) <= 4, track.name()  # not a black bar
    finally:
        app.setStyleSheet(old_sheet)
        app.setStyle(old_style)
        app.setPalette(old_palette)


def test_the_theme_keeper_follows_palette_changes_without_filtering_every_event(qtbot):
    """It must not run Python for every event of every object (each call takes the GIL the engine thread
    wants): only palette changes reach it."""
    from PySide6.QtWidgets import QPushButton

    from app.ui.theme import ThemeKeeper, dark_palette

    class Counting(ThemeKeeper):
        def eventFilter(self, watched, event):  # noqa: N802
            self.calls += 1
            return super().eventFilter(watched, event)

    app = QApplication.instance()
    old_palette, old_sheet = app.palette(), app.styleSheet()
    Counting.calls = 0
    keeper = Counting(app)
    try:
        button = QPushButton("busy")
        qtbot.addWidget(button)
        button.show()
        qtbot.waitExposed(button)
        for _ in range(20):
            button.setText(button.text() + "!")
            qtbot.wait(5)
        assert keeper.calls < 10, keeper.calls  # an application-wide filter sees hundreds here
        light = app.styleSheet()
        app.setPalette(dark_palette())
        qtbot.waitUntil(lambda: app.styleSheet() != light, timeout=2000)  # the sheet followed the palette
    finally:
        keeper.setParent(None)
        app.setPalette(old_palette)
        app.setStyleSheet(old_sheet)
